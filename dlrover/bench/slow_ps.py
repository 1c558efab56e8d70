"""``dlrover bench slow-ps``: one PS behind a slow link, detected and replaced while the
job trains (issue 17, item 5).

The throughput bench's DLRM with 1 worker and 2 PS runs twice over the same rows under
``dlrover_rm`` with its runtime correction only (``max_changes: 0``): fault-free, and with
``chaos: {action: delay, target: "ps:1", ms: N}`` from ``at_s``. Every pull and push of
that PS then answers N ms late. The master marks a PS slow while its busy time per id
served is over ``straggler_factor`` x the PS's median; after ``straggler_window_s`` the policy
replaces it (a new PS takes its vshards by live migration). From the worker's metrics
windows (``metrics`` events) the bench reports samples/s while the fault was undetected
and after the replacement, against the fault-free run's windows from the same job time
on (steady state on both sides), and both runs' AUC.
"""

from __future__ import annotations

import os
import sys
import tempfile

from dlrover.bench.progress import bench_data, run_bench_job
from dlrover.faults.records import FailureKind
from dlrover.runlogs.records import Event
from dlrover.spec import JobSpec

BATCH_SIZE = 2048
SETTLE_S = 1.0  # windows this soon after a change still hold samples of the step before it


def slow_ps_spec(data_dir: str, rows: int, delay_ms: float, at_s: float, history_dir: str) -> JobSpec:
    """The bench job: 1 worker x 2 CPU + 2 PS x 1 CPU, an evaluation split, ``dlrover_rm``
    correcting faults only; the delay on ``ps:1`` when ``delay_ms`` > 0."""
    from dlrover.bench.throughput import bench_spec, cores_default

    spec = bench_spec(data_dir, rows, BATCH_SIZE, workers_cpu=float(cores_default()), ps_cpu=1.0)
    chaos = [{"at_s": at_s, "action": "delay", "target": "ps:1", "ms": delay_ms}] if delay_ms > 0 else []
    doc = spec.model_dump()
    doc["name"] = "bench-slow-ps" if chaos else "bench-slow-ps-ref"
    doc["data"].update(eval_fraction=0.1, shard_rows=4 * BATCH_SIZE)
    doc["resources"].update(ps=2, budget_cpu=doc["resources"]["worker_cpu"] + 3)  # room for the replacement PS
    doc["train"]["log_every_s"] = 0.5
    doc["policy"] = {"name": "dlrover_rm", "interval_s": 0.5, "warmup_s": 1.0, "history_dir": history_dir,
                     "knobs": {"max_changes": 0, "straggler_window_s": 2.0}}  # fmt: skip
    doc["chaos"] = chaos
    from dlrover.spec import spec_from_dict

    return spec_from_dict(doc, "bench slow-ps")


def window_rate(events: list[Event], start_s: float, end_s: float) -> float | None:
    """Samples/s of the worker windows that ended in ``(start_s, end_s]``, over the time
    those windows cover (from the end of the window before the first)."""
    ends = [(e.at_s, e.fields["samples"]) for e in events if e.kind == "metrics" and "samples" in e.fields]
    inside = [(t, n) for t, n in ends if start_s < t <= end_s]
    before = [t for t, _ in ends if t <= start_s]
    if not inside or not before:
        return None
    span = inside[-1][0] - before[-1]
    return sum(n for _, n in inside) / span if span > 0 else None


def run_slow_ps_bench(rows: int = 819_200, delay_ms: float = 50.0, at_s: float = 3.0) -> dict:
    """Both runs; the comparison as one flat dict (see the module docstring)."""
    from dlrover.driver.runner import ensure_data

    data_dir = bench_data(f"criteo-{rows}")
    with tempfile.TemporaryDirectory() as tmp:
        ref_spec = slow_ps_spec(data_dir, rows, 0.0, at_s, os.path.join(tmp, "h-ref"))
        ensure_data(ref_spec)
        print(f"[bench] fault-free: 1 worker + 2 PS, {rows:,} rows", file=sys.stderr)
        ref, ref_events = run_bench_job(ref_spec, os.path.join(tmp, "ref"), "fault-free", "slow-ps")
        print(f"[bench] ps:1 answers {delay_ms:g} ms late from {at_s:g} s", file=sys.stderr)
        slow, events = run_bench_job(slow_ps_spec(data_dir, rows, delay_ms, at_s, os.path.join(tmp, "h")), os.path.join(tmp, "slow"), "slow PS", "slow-ps")
    fired = next((c for c in slow.chaos if c["action"] == "delay"), None)
    fix = next((f for f in slow.failures if f.kind is FailureKind.STRAGGLER), None)
    end = max((e.at_s for e in events if e.kind == "metrics"), default=0.0)
    start = fired["job_s"] if fired else None
    during = window_rate(events, start + SETTLE_S, fix.detected_s) if fired and fix else None
    after = window_rate(events, fix.recovered_s + SETTLE_S, end) if fix and fix.recovered_s is not None else None
    # The fault-free run's own windows from the same job time on: steady state on both sides.
    ref_end = max((e.at_s for e in ref_events if e.kind == "metrics"), default=0.0)
    ref_rate = window_rate(ref_events, (start or 0.0) + SETTLE_S, ref_end) or ref.throughput_samples_per_s
    return {
        "delay_ms": delay_ms,
        "rows": rows,
        "fault_free_samples_per_s": ref_rate,
        "slow_samples_per_s_before_detection": during,
        "slow_samples_per_s_after_replacement": after,
        "ratio_after": after / ref_rate if after else None,
        "ratio_before": during / ref_rate if during else None,
        "overall_samples_per_s": slow.throughput_samples_per_s,
        "fired_s": start,
        "detected_s": fix.detected_s if fix else None,
        "recovered_s": fix.recovered_s if fix else None,
        "replaced": fix.actor if fix else None,
        "auc_fault_free": ref.auc,
        "auc_slow": slow.auc,
        "auc_delta": slow.auc - ref.auc if slow.auc is not None and ref.auc is not None else None,
        "samples_lost": slow.samples_lost,
        "bags_updated_per_sample": slow.ps_bags_updated / max(slow.samples_trained, 1),
    }


def print_slow_ps(r: dict) -> None:
    def f(v, fmt):
        return format(v, fmt) if v is not None else "n/a"

    print(f"slow PS: ps:1 +{r['delay_ms']:g} ms per pull and push from {f(r['fired_s'], '.1f')} s; "
          f"replaced {r['replaced'] or 'never'} (detected {f(r['detected_s'], '.1f')} s, recovered {f(r['recovered_s'], '.1f')} s)")  # fmt: skip
    print(f"  fault-free          {r['fault_free_samples_per_s']:>9,.0f} samples/s   AUC {f(r['auc_fault_free'], '.4f')} (its windows from the same job time)")
    print(f"  slow, undetected    {f(r['slow_samples_per_s_before_detection'], '>9,.0f')} samples/s   ratio {f(r['ratio_before'], '.2f')}")
    print(f"  after replacement   {f(r['slow_samples_per_s_after_replacement'], '>9,.0f')} samples/s   ratio {f(r['ratio_after'], '.2f')} (goal >= 0.70)")
    print(f"  whole slow run      {r['overall_samples_per_s']:>9,.0f} samples/s   AUC {f(r['auc_slow'], '.4f')} (delta {f(r['auc_delta'], '+.4f')}, goal within 0.005)")
    print(f"  samples lost {r['samples_lost']}, bag updates per sample {r['bags_updated_per_sample']:.2f} (26 = each exactly once)")
