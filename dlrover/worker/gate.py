"""The pause handshake between the master and a worker's training loop.

The master's calls (``pause``, ``set_routing``, ``resume``, ``abort``) run on other
threads of the worker actor than ``run``; they meet the training loop here. The loop
parks only at a step boundary with every push applied, so the master may take a
checkpoint or change the routing while it is parked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Aborted(Exception):
    """The master called ``abort``: leave ``run`` at once (a rollback follows)."""


class PauseGate:
    """The loop's state as the master's threads see it: one lock, every change notified."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._running = False
        self._paused = False
        self._aborted = False
        self.pause_requested = False  # read without the lock by the loop, once per step

    # -- master side --------------------------------------------------------------------
    def request_pause(self, timeout_s: float) -> bool:
        """True once the loop is parked, or when no run is going on."""
        with self._cv:
            self.pause_requested = True  # a run not started yet parks before its first pull
            self._cv.notify_all()
            if not self._running:
                return True
            return self._cv.wait_for(lambda: self._paused or not self._running, timeout=timeout_s)

    def resume(self) -> None:
        with self._cv:
            self.pause_requested = False
            self._cv.notify_all()

    @contextmanager
    def releasing(self) -> Iterator[None]:
        """Make a change under the lock (the parked loop sees it whole), then resume."""
        with self._cv:  # re-entered by ``resume``: a Condition's lock is an RLock
            yield
            self.resume()

    def abort(self) -> None:
        with self._cv:
            self._aborted = True
            self.pause_requested = False
            self._cv.notify_all()

    # -- training-loop side ---------------------------------------------------------------
    def start_run(self) -> None:
        with self._cv:
            self._running = True
            self._aborted = False

    def end_run(self) -> None:
        with self._cv:
            self._running = False
            self._cv.notify_all()

    def check(self) -> None:
        """Raise ``Aborted`` if the master aborted this run."""
        if self._aborted:
            raise Aborted()

    def park(self) -> None:
        """With every push applied: wait until resumed, or raise ``Aborted``."""
        with self._cv:
            self._paused = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self.pause_requested or self._aborted)
            self._paused = False
        self.check()
