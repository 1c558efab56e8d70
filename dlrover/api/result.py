"""A finished job as a data scientist reads it: the summary's fields, the events as a
table, and where its files are."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dlrover.runlogs.records import Event, JobSummary
from dlrover.runlogs.report import load_run

if TYPE_CHECKING:
    import pandas as pd


def events_table(events: Sequence[Event]) -> "pd.DataFrame":
    """The event log as a table: a row an event; ``at_s``, ``kind``, then each kind's own
    fields as columns (missing where a kind has none)."""
    import pandas as pd

    return pd.DataFrame.from_records([e.to_json() for e in events], columns=None if events else ["at_s", "kind"])


@dataclass
class JobResult(JobSummary):
    """``summary.json`` as attributes (``result.auc``, ``result.samples_trained``,
    ``result.failures``), the event log as a pandas table (``events``; e.g.
    ``result.events.query("kind == 'metrics'")`` is the training curve) and as records
    (``event_records``), and ``run_dir``, where summary.json, events.jsonl and the
    exported model are."""

    events: "pd.DataFrame" = field(default_factory=lambda: events_table([]))  # type: ignore[assignment]
    event_records: list[Event] = field(default_factory=list)
    run_dir: Path = field(default_factory=Path)

    @classmethod
    def load(cls, run_dir: str | Path) -> "JobResult":
        """A finished run read back from its directory (``runs/<job_id>``); a missing or
        malformed file is a one-line ``DataError`` naming it."""
        summary, events = load_run(run_dir)
        values = {f.name: getattr(summary, f.name) for f in fields(JobSummary) if f.name != "events"}
        return cls(**values, events=events_table(events), event_records=events, run_dir=Path(run_dir))

    def summary(self) -> JobSummary:
        """The plain record (as ``summary.json`` holds it, with the events as records)."""
        values = {f.name: getattr(self, f.name) for f in fields(JobSummary) if f.name != "events"}
        return JobSummary(**values, events=list(self.event_records))
