"""What a PS says of itself (``EmbeddingPS.stats``, ``DenseParamServer.stats``): records
read by attribute wherever they go (the master's policy measurements, checkpoints, the
summary, the workers' shared-memory check)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from dlrover.ps.dynamic_tables import DynamicCounts


@dataclass
class PsCounters:
    """Counts since the PS started (its replacement starts from zero); the PS adds to
    its own as it serves."""

    pulls: int = 0
    pushes: int = 0
    ids: int = 0  # ids served by pulls and pushes (the load a PS carries)
    rows_updated: int = 0  # bags whose rows a push updated
    ids_updated: int = 0  # ids a push applied (the exactly-once count)
    duplicates: int = 0  # pushes of a batch applied before: skipped
    busy_s: float = 0.0  # time inside pull and push calls


@dataclass
class PsStats(PsCounters):
    """A snapshot of the counters and of the PS's process."""

    pending: int = 0  # pushes waiting for their pull's turn
    dynamic_ids: int = 0  # ids admitted to this PS's dynamic tables
    dynamic: DynamicCounts = field(default_factory=DynamicCounts)
    applied_log: int = 0  # entries of the applied-batches log (its memory)
    uptime_s: float = 0.0
    pid: int = 0
    node_id: str | None = None
    rss_mb: float = 0.0
    cpu_percent: float = 0.0  # psutil's, since the last call: 100 per busy core

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> "PsStats":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known}
        values["dynamic"] = DynamicCounts(**row.get("dynamic", {}))
        return cls(**values)


@dataclass(frozen=True)
class DenseStats:
    """A dense PS shard's counts: ``rounds`` and ``ignored`` (late gradients dropped) only
    in round mode (``train.dense_sync``), else None."""

    updates: int  # batches applied (one per batch trained)
    duplicates: int  # pushes of a batch applied before: skipped
    version: int
    applied_log: int
    rounds: int | None = None
    ignored: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> "DenseStats":
        return cls(**row)


def total_counts(stats: list[PsStats]) -> dict[str, int]:
    """The dynamic tables' counts of several PS, summed."""
    return {k: int(sum(getattr(s.dynamic, k) for s in stats)) for k in asdict(DynamicCounts())}
