"""Per-table settings of the spec (``model.tables``): how a table maps raw ids to rows.

``hashed`` (the default): row ``id % num_embeddings``; ids that collide share a row.
Either pools its bags by ``pooling``: ``sum`` or ``mean`` (the sum over the bag's length;
an empty bag pools to zeros).

``dynamic``: a collision-free map from raw 64-bit ids to at most ``capacity_rows`` rows,
kept by the PS that owns each id's vshard (:mod:`dlrover.ps.dynamic`). An id reads a
shared default row, and gets no update, for its first ``admit_after`` training lookups;
then it gets a row of its own. When its vshard has no free row left, ``eviction``
chooses whose row it takes: ``lru`` the least recently looked-up id, ``lfu`` the least
often looked-up one, ``ttl`` the least recently looked-up one of those unseen for more
than ``ttl_steps`` lookups (none such: the new id waits on the default row).

A separate module because ``dlrover.spec`` is full.
"""

from __future__ import annotations

from enum import Enum
from pydantic import BaseModel, ConfigDict, Field, model_validator


class TableKind(str, Enum):
    HASHED = "hashed"
    DYNAMIC = "dynamic"


class Eviction(str, Enum):
    LRU = "lru"
    LFU = "lfu"
    TTL = "ttl"


class Pooling(str, Enum):
    SUM = "sum"
    MEAN = "mean"


class TableSpec(BaseModel):
    """One table's settings (``model.tables.<name>``). ``num_embeddings``: a hashed
    table's rows (default ``model.num_embeddings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: TableKind = TableKind.HASHED
    num_embeddings: int | None = Field(None, ge=1)
    pooling: Pooling = Pooling.SUM
    capacity_rows: int | None = Field(None, ge=1)
    admit_after: int = Field(0, ge=0)
    eviction: Eviction = Eviction.LRU
    ttl_steps: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _fields_of_kind(self) -> "TableSpec":
        if self.kind is TableKind.HASHED:
            # by value, not by fields set: a spec written out as JSON (spec.json) lists every field
            given = sorted(f for f in ("capacity_rows", "admit_after", "eviction", "ttl_steps") if getattr(self, f) != type(self).model_fields[f].default)
            if given:
                raise ValueError(f"{given[0]}: only for kind: dynamic (this table is hashed)")
            return self
        if self.num_embeddings is not None:
            raise ValueError("num_embeddings: only for kind: hashed (a dynamic table holds capacity_rows)")
        if self.capacity_rows is None:
            raise ValueError("capacity_rows: required for kind: dynamic")
        if self.eviction == Eviction.TTL and self.ttl_steps is None:
            raise ValueError("ttl_steps: required for eviction: ttl")
        if self.eviction != Eviction.TTL and self.ttl_steps is not None:
            raise ValueError(f"ttl_steps: only for eviction: ttl (this table evicts by {self.eviction.value})")
        return self


def dynamic_tables(tables: dict[int, TableSpec]) -> dict[int, TableSpec]:
    """The dynamic ones of a table-index -> settings map, by table index."""
    return {t: s for t, s in sorted(tables.items()) if s.kind is TableKind.DYNAMIC}


def rows_of(sizes: list[int], tables: dict[int, TableSpec]) -> list[int]:
    """Rows each table holds: ``capacity_rows`` for a dynamic table, its size otherwise."""
    dynamic = dynamic_tables(tables)
    return [dynamic[t].capacity_rows if t in dynamic else n for t, n in enumerate(sizes)]


def check_capacities(tables: dict[int | str, TableSpec], vshards: int) -> None:
    """A dynamic table's rows are split evenly over the vshards: with fewer rows than
    vshards some vshards get none, and the ids hashed to them would never be admitted."""
    for name, s in tables.items():
        if s.kind is TableKind.DYNAMIC and s.capacity_rows < vshards:
            raise ValueError(f"model.tables.{name}.capacity_rows: {s.capacity_rows} is below train.vshards ({vshards}): every vshard needs a row")
