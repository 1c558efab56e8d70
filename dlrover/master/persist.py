"""What a restarted master needs from its previous life, written next to the run.

The master runs with Ray's ``max_restarts``: when its process dies, the actors it owns
die with it, Ray starts it again and retries ``run``. It reads this state (start time,
failures, scale events, chaos fired, chaos clock) and resumes from the newest durable
checkpoint instead of starting over. Written at every checkpoint, atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from dlrover.faults.records import Failure


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
