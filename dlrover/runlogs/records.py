"""A run's two files as typed records: a row of ``events.jsonl`` (``Event``) and
``summary.json`` (``JobSummary``).

The master builds them, the driver writes their JSON form, and every reader (the report,
``dlrover status``, the benches, the simulator's profiles) reads them back through
``from_json``: one serialisation, and no reader that knows the files' keys by heart.
Sub-documents with a record of their own (scale events, failures, the reliability report)
are those records; the rest (the policy's account, checkpoint figures) stay JSON objects,
written as they are.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from dlrover.errors import DataError
from dlrover.faults.records import Failure
from dlrover.metrics.reliability import ReliabilityReport
from dlrover.runlogs.scale_record import ScaleEvent


@dataclass(frozen=True)
class Event:
    """One row of the event log: when (seconds of the master's clock), what kind, and the
    kind's own fields (in the order written; ``actor`` when it concerns one)."""

    at_s: float
    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def actor(self) -> str | None:
        return self.fields.get("actor")

    @property
    def job_s(self) -> float:
        """When, in job time: a chaos row's ``at_s`` is its spec's time, ``job_s`` when it fired."""
        return float(self.fields.get("job_s", self.at_s))

    def to_json(self) -> dict[str, Any]:
        """The ``events.jsonl`` row: ``at_s``, ``kind``, then the fields (a field named
        ``at_s``, as a worker's report has, takes the first place's value)."""
        return {"at_s": self.at_s, "kind": self.kind, **self.fields}

    @staticmethod
    def is_row(row: Any) -> bool:
        """Whether a JSON value is an event's row (an object with a kind)."""
        return isinstance(row, dict) and "kind" in row

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> "Event":
        rest = {k: v for k, v in row.items() if k not in ("at_s", "kind")}
        return cls(float(row["at_s"]), str(row["kind"]), rest)


@dataclass(frozen=True)
class SummaryConfig:
    """The job's requested resources and data layout (``summary.json``: ``config``)."""

    workers: int
    ps: int
    worker_cpu: float
    ps_cpu: float
    dense_ps: int
    dense_ps_cpu: float
    batch_size: int
    vshards: int


# Written only when set (a job without dense shards, a job that did not fail, ...).
OPTIONAL = ("reason", "dense_updates_per_shard", "dense_updates", "dense_rounds", "history_record")
NESTED = ("config", "scale_events", "failures", "reliability", "events")


@dataclass
class JobSummary:
    """What a job did, as ``summary.json`` lists it (fields in the file's order)."""

    job_id: str
    status: str
    samples_expected: int
    samples_trained: int
    samples_lost: int
    bad_lines_skipped: int
    ids_expected: int  # ids in the trained rows: each updates the PS exactly once (ps_ids_updated)
    long_bags_truncated: int
    ids_per_sample: float  # the performance model's k (mean ids a training row carries)
    auc: float | None
    logloss: float | None
    best_auc: float | None
    eval_rows: int
    throughput_samples_per_s: float
    train_time_s: float
    wall_time_s: float
    epochs: int
    config: SummaryConfig
    scale_events: list[ScaleEvent]
    failures: list[Failure]
    reason: str | None = None  # why the job ended FAILED
    ps_bags_updated: int = 0  # the updates the embedding PS applied
    ps_ids_updated: int = 0
    dynamic_tables: dict[str, int] = field(default_factory=dict)  # hits, admissions, evictions
    dense_updates_per_shard: list[int] | None = None
    dense_updates: int | None = None
    dense_rounds: dict[str, Any] | None = None
    duplicate_updates_skipped: int = 0
    policy: str = ""
    initial_plan: dict[str, Any] = field(default_factory=dict)
    configurations: list[dict[str, Any]] = field(default_factory=list)  # each measured window
    final_config: dict[str, Any] = field(default_factory=dict)
    perf_model: dict[str, Any] = field(default_factory=dict)
    history_dir: str | None = None
    history_record: str | None = None
    chaos: list[dict[str, Any]] = field(default_factory=list)  # the injected faults that fired
    reliability: ReliabilityReport | None = None
    ettr: float | None = None
    mttf_s: float | None = None
    samples_replayed: int = 0
    updates_lost: int = 0
    oom_kills: int = 0
    bad_nodes: list[str] = field(default_factory=list)
    node_speeds_probed: dict[str, float] = field(default_factory=dict)
    checkpoints: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)  # the event log: events.jsonl, not summary.json

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s object (the events go to ``events.jsonl``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "events" or (f.name in OPTIONAL and value is None):
                continue
            if f.name == "config":
                value = dict(vars(value))
            elif f.name == "scale_events":
                value = [e.to_dict() for e in value]
            elif f.name == "failures":
                value = [x.to_dict() for x in value]
            elif f.name == "reliability":
                value = value.to_dict() if value is not None else None
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], events: list[Event] | None = None) -> "JobSummary":
        """A summary read back (``summary.json``, or the dict a run returned); keys it does
        not know are ignored, so a newer file still reads. A missing or malformed field is a
        ``ValueError`` naming it."""
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        if missing := [k for k in required if k not in doc]:
            raise ValueError(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        names = {f.name for f in fields(cls)} - set(NESTED)
        rel = doc.get("reliability")
        try:
            return cls(
                config=SummaryConfig(**doc["config"]),
                scale_events=[ScaleEvent.from_dict(e) for e in doc["scale_events"]],
                failures=[Failure.from_dict(x) for x in doc["failures"]],
                reliability=ReliabilityReport(**rel) if rel else None,
                events=list(events or []),
                **{k: doc[k] for k in names if k in doc},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed: {e.__class__.__name__}: {e}") from None


def read_summary(path: str | Path) -> JobSummary:
    """``summary.json`` at ``path`` as a record; a missing, unreadable or malformed file is
    a one-line ``DataError`` naming it."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: missing (the job has not finished, or this is not a run directory)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read: {e.__class__.__name__}: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{path}: expected a JSON object")
    try:
        return JobSummary.from_json(doc)
    except ValueError as e:
        raise DataError(f"{path}: {e}") from None
