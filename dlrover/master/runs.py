"""The training runs of the job's workers and what their ends mean: each ``run`` call
that returns (or fails) becomes a typed event for the job's states
(``dlrover.master.states``), told apart by the failure's type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlrover.errors import DLRoverError
from dlrover.master.cluster import ActorDied, Cluster, TaskFailed
from dlrover.worker.window import RunResult


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """The clock moved on (at least every tick period, also between worker events)."""


@dataclass(frozen=True)
class WorkerExited:
    """A worker's ``run`` returned: it ran out of shards or was drained."""

    worker: str
    result: RunResult


@dataclass(frozen=True)
class WorkerAborted:
    """A worker's ``run`` returned because a rollback aborted it."""

    worker: str


@dataclass(frozen=True)
class WorkerDied:
    """The worker's process is gone (or its run failed in its own code)."""

    worker: str
    error: Exception


@dataclass(frozen=True)
class PsUnreachable:
    """A worker's ``run`` failed on a call to a PS or the dense PS."""

    worker: str
    error: Exception


@dataclass(frozen=True)
class BadInput:
    """A worker hit input the user must fix (a malformed data line): no replacement helps."""

    worker: str
    error: DLRoverError


Event = Tick | WorkerExited | WorkerAborted | WorkerDied | PsUnreachable | BadInput


class RunGroup:
    """The ``run`` calls of the training workers: started here, reported as events.

    It alone holds the runs (each run's ref -> its worker): recovery, rollbacks, drains
    and rescales add, drop and read them through its methods.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._pending: dict[Any, str] = {}
        self._soon_s: float | None = None

    def soon(self, timeout_s: float) -> None:
        """Make the next poll wait at most ``timeout_s`` (something else is being watched
        closely: a pre-copy that may end any moment)."""
        self._soon_s = timeout_s if self._soon_s is None else min(self._soon_s, timeout_s)

    def add(self, runs: dict[Any, str]) -> None:
        """Runs just started (``{its ref: worker}``)."""
        self._pending.update(runs)

    def workers(self) -> list[str]:
        """The workers whose run is pending."""
        return list(self._pending.values())

    def refs(self, workers: set[str] | None = None) -> list[Any]:
        """The pending runs' refs (of ``workers`` only, if given)."""
        return [r for r, n in self._pending.items() if workers is None or n in workers]

    def worker_of(self, ref: Any) -> str:
        return self._pending[ref]

    def drop(self, workers: set[str] | None = None) -> None:
        """Stop watching the runs of ``workers`` (default: all): their ends are no event."""
        for ref in self.refs(workers):
            del self._pending[ref]

    def poll(self, timeout_s: float) -> list[Event]:
        """Wait up to ``timeout_s`` for one run to end; its event (if any), then a tick."""
        if self._soon_s is not None:
            timeout_s, self._soon_s = min(timeout_s, self._soon_s), None
        ready, _ = self.cluster.wait(list(self._pending), num_returns=1, timeout=timeout_s)
        events: list[Event] = []
        for ref in ready:
            name = self._pending.pop(ref, None)
            if name is not None:
                events.append(self._outcome(ref, name))
        events.append(Tick())
        return events

    def _outcome(self, ref: Any, name: str) -> Event:
        try:
            result: RunResult = self.cluster.get(ref)
        except TaskFailed as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, DLRoverError):
                return BadInput(name, cause)
            if isinstance(cause, ActorDied):
                return PsUnreachable(name, e)
            return WorkerDied(name, e)
        except ActorDied as e:
            return WorkerDied(name, e)
        return WorkerAborted(name) if result.aborted else WorkerExited(name, result)
