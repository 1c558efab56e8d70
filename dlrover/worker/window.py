"""The metrics a worker sends the master every ``log_every_s``: throughput, loss and
where the step time went, which the autoscaling policy and the dashboards read.

:class:`WorkerReport` is that report, typed: the worker sends the record itself, and every
reader in the master uses its attributes. Its JSON form (``to_json``) is the ``metrics``
row of ``events.jsonl``. A worker's first trained step is no report: it is the master's
``first_step`` call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import psutil

from dlrover.metrics.process import owned_rss_mb


@dataclass(frozen=True)
class WorkerReport:
    """One window of a worker's training. Per-step figures are means over the window.

    Every figure is always there: a worker measures all of them each window (``rss_mb``
    included; a worker that has not reported yet has no record, not a record without
    memory). ``at_s`` is the job time the master received it, set by the master
    (``dataclasses.replace``); None until then."""

    samples: int
    steps: int
    samples_per_s: float
    loss: float  # mean per sample
    step_time_s: float
    wait_ps_s: float  # blocked on PS pulls
    pull_s: float  # issuing and waiting for PS pulls
    push_s: float
    queue_depth: int  # parsed batches waiting (near zero: input-bound)
    rss_mb: float  # resident memory the process owns (``owned_rss_mb``)
    cpu_percent: float  # psutil's, since the last report: 100 per busy core
    node_id: str  # the Ray node the worker runs on (PAL's node speeds)
    step_median_s: float  # median time of the recent steps (0.0 before any)
    pull_ahead: int  # pulls running ahead of the batch being trained
    at_s: float | None = None

    def to_json(self) -> dict:
        """A plain dict: the fields in order, ``at_s`` last and only once set."""
        out = asdict(self)
        if self.at_s is None:
            del out["at_s"]
        return out

    @classmethod
    def from_json(cls, row: dict) -> WorkerReport:
        """The record back from ``to_json``'s dict, or from an ``events.jsonl`` ``metrics``
        row (its other keys, ``kind`` and ``actor``, are not the record's)."""
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name != "at_s"}, at_s=row.get("at_s"))


@dataclass(frozen=True)
class RunResult:
    """What a worker's ``run`` returns: the run's totals (the ``worker_exit`` event), or
    that a rollback aborted it (``aborted``; no totals, the run's work is redone)."""

    generation: int
    aborted: bool = False
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    wait_dense_s: float = 0.0
    compute_s: float = 0.0
    wait_data_s: float = 0.0
    pull_ahead_peak: int = 1
    rss_mb: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # the PS client's: route_s, issue_pull_s, wait_pull_s, push_s

    def to_json(self) -> dict:
        """The ``worker_exit`` event's fields: the totals, then the PS client's timings."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("generation", "aborted", "timings")}
        return {**out, **self.timings}


class MetricsWindow:
    """Counters since the last report. The PS client's timings only ever grow, so the
    window keeps their values at its start and reports the difference."""

    def __init__(self, timings: dict[str, float], now: float) -> None:
        self.t0 = now
        self.samples = 0
        self.loss_sum = 0.0
        self.steps = 0
        self.step_s = 0.0
        self._at = dict(timings)

    def add(self, samples: int, loss_sum: float) -> None:
        """Count one trained batch."""
        self.samples += samples
        self.loss_sum += loss_sum
        self.steps += 1

    def metrics(
        self, now: float, timings: dict[str, float], queue_depth: int, proc: psutil.Process, node_id: str, step_median_s: float, pull_ahead: int
    ) -> WorkerReport:
        """The report of this window, which ends at ``now``."""
        dt = max(now - self.t0, 1e-9)
        steps = max(self.steps, 1)

        def spent(timing: str) -> float:  # seconds of a PS-client timing in this window
            return timings[timing] - self._at[timing]

        return WorkerReport(
            samples=self.samples,
            steps=self.steps,
            samples_per_s=self.samples / dt,
            loss=self.loss_sum / max(self.samples, 1),
            step_time_s=self.step_s / steps,
            wait_ps_s=spent("wait_pull_s") / steps,
            pull_s=(spent("issue_pull_s") + spent("wait_pull_s")) / steps,
            push_s=spent("push_s") / steps,
            queue_depth=queue_depth,
            rss_mb=owned_rss_mb(proc),
            cpu_percent=proc.cpu_percent(),
            node_id=node_id,
            step_median_s=step_median_s,
            pull_ahead=pull_ahead,
        )
