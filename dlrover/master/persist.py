"""What a restarted master needs from its previous life, written next to the run.

The master runs with Ray's ``max_restarts``: when its process dies, the actors it owns
die with it, Ray starts it again and retries ``run``. It reads this state (start time,
failures, scale events, chaos fired, chaos clock) and resumes from the newest durable
checkpoint instead of starting over. Written at every checkpoint, atomically.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from dlrover.faults.records import Failure
from dlrover.master.job import Job
from dlrover.runlogs.scale_record import ScaleEvent


@dataclass
class MasterState:
    job_id: str
    started_wall: float  # wall-clock time the job started (job times count from it)
    crash_at_s: float  # job time of the write (the crash came after)
    samples_done: int
    train_start_s: float | None
    samples_replayed: int
    failures: list[Failure] = field(default_factory=list)
    scale_events: list[dict] = field(default_factory=list)
    chaos_fired: list[dict] = field(default_factory=list)
    chaos_s: float = 0.0
    restarts: int = 0

    def save(self, path: str) -> None:
        row = asdict(self)
        row["failures"] = [f.to_dict() for f in self.failures]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(row, f, default=float)
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path: str, job_id: str) -> "MasterState | None":
        """The state this job's previous master wrote (None: none, or another job's)."""
        if not os.path.exists(path):
            return None
        with open(path) as f:
            row = json.load(f)
        if row.get("job_id") != job_id:
            return None
        row["failures"] = [Failure.from_dict(x) for x in row.get("failures", [])]
        return cls(**row)


def save_master_state(m: Job, crash_at_s: float | None = None) -> None:
    """Write what a restarted master takes over (at every checkpoint, and before a crash)."""
    now = m.clock() - m.t0
    MasterState(
        job_id=m.job_id,
        started_wall=time.time() - now,
        crash_at_s=crash_at_s if crash_at_s is not None else now,
        samples_done=m.books.queue.samples_done,
        train_start_s=None if m.books.train_start is None else m.books.train_start - m.t0,
        samples_replayed=m.recovery.samples_replayed,
        failures=list(m.failures),
        scale_events=[e.to_dict() for e in m.scale_events],
        chaos_fired=m.chaos.fired if m.chaos else [],
        chaos_s=m.chaos.chaos_s() if m.chaos else 0.0,
        restarts=m.restarts,
    ).save(os.path.join(m.run_directory(), "master_state.json"))


def load_master_state(m: Job) -> MasterState | None:
    """A restarted master takes its predecessor's clock, failures and scale events (None: a first start)."""
    state = MasterState.load(os.path.join(m.run_directory(), "master_state.json"), m.job_id)
    if state is None:
        return None
    m.t0 = m.clock() - (time.time() - state.started_wall)
    m.failures = list(state.failures)
    m.scale_events = [ScaleEvent.from_dict(e) for e in state.scale_events]
    m.restarts = state.restarts + 1
    if state.train_start_s is not None:
        m.books.train_start = m.t0 + state.train_start_s
    m.recovery.samples_replayed = state.samples_replayed
    return state
