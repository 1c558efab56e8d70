"""What the master's parts (control, recovery, rollback, checkpoints, chaos, summary) may
use of the job. ``JobMaster`` is the one implementation; the parts depend on this
protocol, not on the master module, so nothing in ``dlrover.master`` imports in a circle.
The collaborators are typed ``Any`` here because they are those parts themselves."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from dlrover.data.shards import Shard, ShardQueue
from dlrover.failures import Failure
from dlrover.master.events import EventLog
from dlrover.master.launcher import Launcher
from dlrover.spec import JobSpec


class Job(Protocol):
    job_id: str
    spec: JobSpec
    clock: Callable[[], float]
    t0: float  # clock value at the job's start: job time = clock() - t0
    events: EventLog
    launcher: Launcher
    queue: ShardQueue
    bad_lines: int
    steps_done: int
    train_start: float | None
    train_end: float | None
    failures: list[Failure]
    scale_events: list[dict]
    restarts: int
    status: Any  # JobStatus
    control: Any  # Controller
    recovery: Any  # Recovery
    checkpointer: Any  # Checkpointer
    evaluator: Any  # Evaluator
    chaos: Any  # ChaosInjector

    def worker_reports(self) -> dict[str, dict]: ...

    def draining(self) -> frozenset[str]: ...

    def drain(self, names: list[str]) -> None: ...

    def retire(self, worker: str) -> list[Shard]: ...

    def expired_leases(self, timeout_s: float) -> dict[str, float]: ...

    def renew_leases(self) -> None: ...

    def cut_books(self, trained: dict[int, tuple[int, int]]) -> tuple[dict, int, int]: ...

    def restore_books(self, queue_state: dict, bad_lines: int, steps: int, new_generation: bool) -> int: ...

    def stop(self) -> None: ...

    def crash(self) -> None: ...
