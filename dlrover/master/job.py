"""What the master's parts (control, recovery, rollback, checkpoints, chaos, summary) may
use of the job. ``JobMaster`` is the one implementation; the parts depend on this
protocol, not on the master module, so nothing in ``dlrover.master`` imports in a circle.
The collaborators are typed ``Any`` here because they are those parts themselves."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from dlrover.data.plan import DataPlan
from dlrover.data.ray_source import StreamPlan
from dlrover.errors import DLRoverError
from dlrover.faults.records import Failure
from dlrover.master.books import ShardBooks
from dlrover.master.cluster import Cluster
from dlrover.master.events import EventLog
from dlrover.master.launcher import Launcher
from dlrover.master.runs import RunGroup
from dlrover.runlogs.scale_record import ScaleEvent
from dlrover.spec import JobSpec


class Job(Protocol):
    job_id: str
    spec: JobSpec
    data: DataPlan | StreamPlan  # the files, their row counts, the training and held-out rows; or a Dataset
    cluster: Cluster  # every Ray call goes through it
    clock: Callable[[], float]
    t0: float  # clock value at the job's start: job time = clock() - t0
    events: EventLog
    launcher: Launcher
    runs: RunGroup  # the training runs the loop waits on: only it adds or drops them
    books: ShardBooks  # the shard queue and what workers reported, behind its own lock
    failures: list[Failure]
    scale_events: list[ScaleEvent]
    restarts: int
    status: Any  # JobStatus
    control: Any  # Controller
    recovery: Any  # Recovery
    checkpointer: Any  # Checkpointer
    evaluator: Any  # Evaluator
    chaos: Any  # ChaosInjector
    publisher: Any  # Publisher, or None without publish:
    follower: Any  # Follower of a data.follow job, else None

    def crash(self) -> None: ...

    def run_directory(self) -> str: ...

    def bad_input(self, worker: str, error: DLRoverError) -> None: ...
