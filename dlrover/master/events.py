"""The run's event log, kept by the master as typed ``Event`` records (their JSON rows are
``events.jsonl``, which a pandas DataFrame reads directly).

Reading and wording a written log is ``dlrover.runlogs.event_file`` (no master needed for that)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from dlrover.runlogs.records import Event


class EventLog:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rows: list[Event] = []
        self._lock = threading.Lock()

    def add(self, kind: str, **fields: Any) -> Event:
        """Log one event now (a field named ``at_s`` stands for the time instead)."""
        at = fields.pop("at_s", None)
        row = Event(round(self._clock(), 4) if at is None else at, kind, fields)
        with self._lock:
            self._rows.append(row)
        return row

    def rows(self) -> list[Event]:
        with self._lock:
            return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def since(self, index: int) -> tuple[list[Event], int]:
        """Rows added after the first ``index``, and the index to ask from next time."""
        with self._lock:
            return self._rows[index:], len(self._rows)


# Events worth a line in the driver log (``ray job logs -f``) and in ``dlrover status``.
NOTABLE_EVENTS = frozenset({
    "initial_config", "launched", "scale", "scale_failed", "plan_rejected", "failure", "recovered", "oom_kill", "chaos",
    "measurement", "eval", "rollback", "master_resumed", "checkpoint_corrupt", "bad_node", "job_error", "job_end",
    "worker_unneeded", "telemetry_error", "waiting_for_nodes", "file_changed", "follow_end", "version_published", "publish_failed",
})
