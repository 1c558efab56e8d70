"""Reliability metrics for elastic training: ETTR, MTTF, checkpoint interval (failure causes:
:mod:`dlrover.faults.records`).

The definitions follow Kokolis et al., "Revisiting Reliability in Large-Scale ML Research
Clusters" (arXiv 2410.21680):

* ETTR (effective training time ratio) = productive training time / wall-clock time.
* MTTF of a job on ``N`` nodes = ``1 / (N * r_f)`` with ``r_f`` the per-node failure rate.
* Expected ETTR ~ ``(1 - N r_f (u0 + dt_cp / 2)) / (1 + w_cp / dt_cp)``: each failure costs the
  restart overhead ``u0`` plus, on average, half a checkpoint interval of lost work; each
  interval of ``dt_cp`` training seconds also pays ``w_cp`` seconds of checkpoint writing.
* Young-Daly: the interval minimising that loss is ``dt* = sqrt(2 w_cp / (N r_f))``.

Everything here is a pure function of numbers the runtime records, so it can be tested
without Ray and reused for both live decisions (checkpoint interval) and post-run reports.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from dlrover.faults.records import Failure


def young_daly_interval_s(write_s: float, failure_rate_per_s: float, lo: float, hi: float) -> float:
    """Young-Daly checkpoint interval ``sqrt(2 w_cp / (N r_f))`` clipped to ``[lo, hi]``.

    ``failure_rate_per_s`` is the job-level rate ``N * r_f``. The optimum balances the write
    cost per interval (``w_cp / dt``) against the expected lost work per failure (``dt / 2``).
    With no failures there is nothing to protect against, so the longest interval (``hi``) is
    returned; a free write (``write_s <= 0``) makes checkpointing as often as allowed (``lo``)
    optimal.
    """
    if lo > hi:
        raise ValueError(f"lo ({lo}) must be <= hi ({hi})")
    if failure_rate_per_s <= 0:
        return float(hi)
    if write_s <= 0:
        return float(lo)
    return float(min(hi, max(lo, math.sqrt(2.0 * write_s / failure_rate_per_s))))


def failure_rate_per_s(n_failures: int, elapsed_s: float, prior_mttf_s: float, prior_weight_s: float) -> float:
    """Failure rate blended with a prior: ``(n + w / mttf0) / (elapsed + w)``.

    The raw estimate ``n / elapsed`` is 0 for a young job with no failures yet (which would
    push the Young-Daly interval to infinity) and infinite at ``elapsed = 0``. Treating the
    prior as ``prior_weight_s`` seconds of pseudo-observation at ``1 / prior_mttf_s`` keeps the
    estimate finite and lets real observations take over as ``elapsed_s`` grows.
    """
    if prior_mttf_s <= 0:
        raise ValueError(f"prior_mttf_s must be > 0, got {prior_mttf_s}")
    if n_failures < 0 or elapsed_s < 0 or prior_weight_s < 0:
        raise ValueError("n_failures, elapsed_s and prior_weight_s must be >= 0")
    denom = elapsed_s + prior_weight_s
    if denom <= 0:
        raise ValueError("failure rate undefined: elapsed_s + prior_weight_s is 0")
    return (n_failures + prior_weight_s / prior_mttf_s) / denom


def observed_mttf_s(failure_times_s: list[float], wall_s: float) -> float | None:
    """Observed mean time to failure: ``wall_s / #failures``; ``None`` when none occurred
    (an MTTF of "infinity" or "wall_s" would both mislead a report)."""
    if not failure_times_s:
        return None
    return float(wall_s) / len(failure_times_s)


def expected_ettr(n_nodes: int, rate_per_node_s: float, restart_overhead_s: float, interval_s: float, write_s: float) -> float:
    """The paper's first-order expected ETTR, clipped to ``[0, 1]``.

    ``(1 - N r_f (u0 + dt_cp / 2)) / (1 + w_cp / dt_cp)``: the numerator is the fraction of
    time not lost to failures (restart ``u0`` plus on average half an interval of redone
    work per failure at job rate ``N r_f``); the denominator charges ``w_cp`` of writing per
    ``dt_cp`` of training. Valid when failures are rare relative to ``dt_cp`` and ``u0``.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    if n_nodes < 0 or rate_per_node_s < 0:
        raise ValueError("n_nodes and rate_per_node_s must be >= 0")
    job_rate = n_nodes * rate_per_node_s
    value = (1.0 - job_rate * (restart_overhead_s + interval_s / 2.0)) / (1.0 + max(0.0, write_s) / interval_s)
    return float(min(1.0, max(0.0, value)))


@dataclass
class ReliabilityReport:
    """Post-run reliability summary (see :func:`reliability_report`)."""

    ettr: float  # productive_s / wall_s
    productive_s: float
    wall_s: float
    downtime_s: float  # union of [at_s, recovered_s]: from the fault to training again
    replay_s: float  # samples_replayed / throughput: training time redoing lost work
    mttf_s: float | None
    failures: int
    samples_replayed: int
    by_kind: dict[str, dict] = field(default_factory=dict)  # kind -> count, detect/recover means

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict."""
        return asdict(self)


def _mean(values: list[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals; overlaps are counted once (two faults that
    hit during the same outage do not double the downtime)."""
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for start, end in sorted(intervals):
        if cur_start is None or start > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_start is not None:
        total += cur_end - cur_start
    return total


def reliability_report(
    failures: list[Failure], wall_s: float, train_s: float, samples_replayed: int, throughput: float
) -> ReliabilityReport:
    """Compute ETTR and per-kind detection/recovery times from recorded faults.

    A failure's ``at_s``, ``detected_s`` and ``recovered_s`` are seconds since job start
    (``recovered_s`` is ``None`` if the job never recovered, in which case the outage runs
    to ``wall_s``). Productive time is training time minus the
    downtime (union of outage intervals) and minus the time spent replaying samples whose
    progress was lost -- the two ways a failure eats into ETTR in the paper's accounting.
    A failure may carry ``capacity_lost`` (default 1: the whole job stalls): a worker of
    four dying while the rest train on costs a quarter of its outage, added on top of the
    union of whole-job outages.
    """
    intervals: list[tuple[float, float]] = []
    partial_s = 0.0
    per_kind: dict[str, dict[str, list[float]]] = {}
    for f in failures:
        at, detected, recovered = float(f.at_s), f.detected_s, f.recovered_s
        end = float(recovered) if recovered is not None else float(wall_s)
        share = float(f.capacity_lost if f.capacity_lost is not None else 1.0)
        if share >= 1.0:
            intervals.append((at, max(at, end)))
        else:
            partial_s += max(0.0, share) * max(0.0, end - at)
        acc = per_kind.setdefault(f.kind.value, {"count": [], "detect": [], "recover": []})
        acc["count"].append(1.0)
        if detected is not None:
            acc["detect"].append(float(detected) - at)
            if recovered is not None:
                acc["recover"].append(float(recovered) - float(detected))

    downtime_s = _union_length(intervals) + partial_s
    replay_s = samples_replayed / throughput if throughput > 0 else 0.0
    productive_s = max(0.0, train_s - downtime_s - replay_s)
    ettr = productive_s / wall_s if wall_s > 0 else 0.0
    by_kind = {
        kind: {
            "count": len(acc["count"]),
            "detect_s_mean": _mean(acc["detect"]),
            "recover_s_mean": _mean(acc["recover"]),
        }
        for kind, acc in per_kind.items()
    }
    return ReliabilityReport(
        ettr=float(ettr),
        productive_s=float(productive_s),
        wall_s=float(wall_s),
        downtime_s=float(downtime_s),
        replay_s=float(replay_s),
        mttf_s=observed_mttf_s([float(f.at_s) for f in failures], wall_s),
        failures=len(failures),
        samples_replayed=int(samples_replayed),
        by_kind=by_kind,
    )
