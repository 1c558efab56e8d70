"""The measurement window of the running configuration."""

from __future__ import annotations

from dataclasses import dataclass

from dlrover.resource.configs import Config
from dlrover.resource.plan import Measurement

MIN_WINDOW_S = 2.0  # a window shorter than this says too little to fit on or to show


@dataclass
class Window:
    """Throughput of one configuration from the job's cumulative sample count.

    It counts from the end of the warm-up (``start_s``), the count there interpolated
    between the observations either side of it, to the latest observation. Pauses and
    failures after the warm-up count against it: they are part of what the
    configuration delivered.
    """

    config: Config
    opened_s: float
    start_s: float  # opened_s + warm-up
    predicted: float | None  # what the model predicted for ``config`` when it opened
    predicted_sd: float | None = None  # the model's relative uncertainty about it then
    stage: str = ""  # the stage of the plan that chose ``config``
    before: tuple[float, float] | None = None  # the latest observation before start_s
    t_a: float | None = None
    s_a: float = 0.0
    t_b: float | None = None
    s_b: float = 0.0

    def observe(self, now: float, samples: float) -> None:
        """The job's cumulative sample count at ``now``."""
        if now < self.start_s:
            self.before = (now, samples)
            return
        if self.t_a is None:
            self.t_a, self.s_a = now, samples
            if self.before is not None and now > self.start_s:
                t0, s0 = self.before
                self.t_a, self.s_a = self.start_s, s0 + (samples - s0) * (self.start_s - t0) / (now - t0)
        self.t_b, self.s_b = now, samples

    def measurement(self) -> Measurement | None:
        """The window so far, whatever its length (None: nothing after the warm-up yet)."""
        if self.t_a is None or self.t_b is None or self.t_b <= self.t_a or self.s_b <= self.s_a:
            return None
        duration = self.t_b - self.t_a
        return Measurement(self.config, (self.s_b - self.s_a) / duration, duration, self.t_b, self.predicted, self.predicted_sd, self.stage)
