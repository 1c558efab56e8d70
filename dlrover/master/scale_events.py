"""The bookkeeping that ties a new worker's first step to the scale event that started it."""

from __future__ import annotations

from dlrover.runlogs.scale_record import ScaleEvent


class FirstSteps:
    """A new worker's first step goes into the event of the change that started it. The
    step may come before the event is written (the switch is still finishing): it is
    kept aside until then. Not thread-safe: the caller holds its lock."""

    def __init__(self) -> None:
        self._waiting: dict[str, ScaleEvent] = {}
        self._early: dict[str, float] = {}

    def stepped(self, worker: str, now: float) -> None:
        ev = self._waiting.pop(worker, None)
        if ev is None:  # no event for it yet (or a worker of the first launch)
            self._early[worker] = now
        else:
            ev.first_step_s[worker] = round(now - ev.at_s, 3)

    def bind(self, workers: list[str], ev: ScaleEvent) -> None:
        for w in workers:
            if w in self._early:
                ev.first_step_s[w] = round(self._early.pop(w) - ev.at_s, 3)
            else:
                self._waiting[w] = ev
