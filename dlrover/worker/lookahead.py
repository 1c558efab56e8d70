"""Adaptive pull-ahead (``train.max_staleness``): the batches whose embedding pulls are in
flight, and how many may be.

With ``staleness: 1`` a worker issues batch i+1's pull before batch i's forward, which
hides a pull that takes less than a step. Behind a slow link the step waits for the pull
instead. :class:`PullAhead` then lets pulls run one batch further ahead, up to
``max_staleness``, after each window of ``WINDOW_STEPS`` steps that spent more than
``GROW_SHARE`` of its time waiting for pulls, and comes one batch back after
``QUIET_WINDOWS`` windows in a row under ``QUIET_SHARE``. So a batch's embedding rows miss
the pushes of at most ``depth`` earlier batches of this worker: the staleness grows with
the measured delay, up to the bound, and shrinks again when the link recovers. (The
shrink may find the delay still there; it then costs one window of waiting before the
depth grows back.) A wait that pulling further ahead does not shorten is not a link's
latency but a PS too busy to answer sooner: when the second window after a step deeper
(the first still has batches pulled before it) does not take ``HELPS`` of the time per
step or less, the step is taken back and none is tried for
``HOLD_WINDOWS`` windows, so a busy PS does not drive the staleness to the bound.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from dlrover.worker.batches import Step

RING_SLOTS = 4  # shared-memory slots per PS link at the fixed staleness
WINDOW_STEPS = 8
GROW_SHARE = 0.10  # a window waiting longer than this share of its time for pulls: one batch deeper
QUIET_SHARE = 0.02  # ... shorter than this for QUIET_WINDOWS windows in a row: one batch back
QUIET_WINDOWS = 16
HELPS = 0.9  # a step deeper stays if the next window's steps take at most this share of the time
HOLD_WINDOWS = 16  # ... else it is taken back, and none is tried for this many windows


@dataclass
class PullAhead:
    """How many pulls run ahead of the batch being trained (``depth``), between ``floor``
    (``train.staleness``) and ``bound`` (``train.max_staleness``)."""

    depth: int
    floor: int
    bound: int
    peak: int = 0  # the deepest it went
    _wait_s: float = 0.0
    _step_s: float = 0.0
    _steps: int = 0
    _quiet: int = 0
    _before_s: float | None = None  # time per step of the window that made the last step deeper
    _hold: int = 0  # windows before another step deeper may be tried
    _settling: bool = False  # the window after a step deeper: not compared

    @classmethod
    def of(cls, staleness: int, bound: int) -> "PullAhead":
        return cls(depth=staleness, floor=staleness, bound=bound, peak=staleness)

    def observe(self, wait_s: float, step_s: float) -> None:
        """One step: the seconds it waited for its pull, and its whole time."""
        if self.bound == self.floor:
            return
        self._wait_s += wait_s
        self._step_s += step_s
        self._steps += 1
        if self._steps < WINDOW_STEPS:
            return
        share = self._wait_s / self._step_s if self._step_s > 0 else 0.0
        per_step = self._step_s / self._steps
        self._wait_s = self._step_s = 0.0
        self._steps = 0
        if self._settling:  # the extra pull pays only from the batch it was issued for on
            self._settling = False
            return
        before, self._before_s = self._before_s, None
        if before is not None and per_step > HELPS * before:  # deeper did not help: a busy PS
            self.depth -= 1
            self._hold, self._quiet = HOLD_WINDOWS, 0
            return
        self._hold = max(0, self._hold - 1)
        if share > GROW_SHARE:
            self._quiet = 0
            if self.depth < self.bound and not self._hold:
                self._before_s, self._settling = per_step, True
                self.depth += 1
                self.peak = max(self.peak, self.depth)
        elif share < QUIET_SHARE:
            self._quiet += 1
            if self._quiet >= QUIET_WINDOWS:
                self._quiet = 0
                self.depth = max(self.floor, self.depth - 1)
        else:
            self._quiet = 0


def ring_slots(bound: int) -> int:
    """Shared-memory slots a worker needs per local PS (``dlrover.ps.shm.SlotRing``) with
    up to ``bound`` pulls ahead: a slot comes back ``slots`` lookups later, so it must
    outnumber the lookups not yet read (the batch in training and those ahead of it),
    with a spare for the push that reads its gradient."""
    return max(RING_SLOTS, bound + 3)


class Lookahead:
    """The batches whose pulls are issued, oldest (the next to train) first."""

    def __init__(self, poll: Callable[[], tuple[Step | None, bool]], prefetch: Callable[[Step], None], control: PullAhead) -> None:
        """``poll``: the input's next batch if one is ready, and whether input ended;
        ``prefetch``: issue a batch's pull."""
        self._poll, self._prefetch, self.control = poll, prefetch, control
        self._steps: deque[Step] = deque()
        self.ended = False  # input said it has no more batches

    def __len__(self) -> int:
        return len(self._steps)

    def push(self, step: Step) -> None:
        """Issue ``step``'s pull and queue it."""
        self._prefetch(step)
        self._steps.append(step)

    def fill(self) -> None:
        """Issue pulls until ``depth`` batches are in flight behind the next one (or input
        has none ready)."""
        while not self.ended and len(self._steps) <= self.control.depth:
            step, self.ended = self._poll()
            if step is None:
                return
            self.push(step)

    def pop(self) -> Step:
        return self._steps.popleft()
