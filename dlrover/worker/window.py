"""The metrics a worker sends the master every ``log_every_s``: throughput, loss and
where the step time went, which the autoscaling policy and the dashboards read."""

from __future__ import annotations

import psutil

from dlrover.metrics.process import owned_rss_mb


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

    def metrics(self, now: float, timings: dict[str, float], queue_depth: int, proc: psutil.Process) -> dict[str, float]:
        """The report of this window, which ends at ``now`` (per-step figures are means)."""
        dt = max(now - self.t0, 1e-9)
        steps = max(self.steps, 1)

        def spent(timing: str) -> float:  # seconds of a PS-client timing in this window
            return timings[timing] - self._at[timing]

        return {
            "samples": self.samples,
            "steps": self.steps,
            "samples_per_s": self.samples / dt,
            "loss": self.loss_sum / max(self.samples, 1),
            "step_time_s": self.step_s / steps,
            "wait_ps_s": spent("wait_pull_s") / steps,
            "pull_s": (spent("issue_pull_s") + spent("wait_pull_s")) / steps,
            "push_s": spent("push_s") / steps,
            "queue_depth": queue_depth,
            "rss_mb": owned_rss_mb(proc),
            "cpu_percent": proc.cpu_percent(),
        }
