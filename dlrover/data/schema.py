"""A job's feature schema: which columns are the label, the dense and the sparse features,
and which embedding table each sparse feature looks up.

``features:`` in the job spec (:class:`FeaturesSpec`) is what a user writes; with
``model.tables`` and ``model.num_embeddings`` it resolves into a :class:`Schema`, the
one record the readers, the model, the PS and the export follow. Like TorchRec's
``EmbeddingBagConfig``, features and tables are named, not indexed. Without
``features:`` the schema is Criteo's (:func:`criteo_schema`).

Features sharing a table are laid out next to each other (tables numbered in order of
first use, features grouped by table), so a batch's bags in feature order are also in
table order: what the PS's table-major lookups need.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import Field, field_validator, model_validator

from dlrover.spec_base import SpecSection
from dlrover.table_spec import Pooling, TableKind, TableSpec


class IdKind(str, Enum):
    """How a sparse column's values become 64-bit ids."""

    STRING = "string"  # a stable hash of the value's text (``hash_ids``)
    INT = "int"  # the integer itself
    HEX = "hex"  # a hex string of at most 8 digits (Criteo's layout)


class Transform(str, Enum):
    """What a dense column's value goes through before the model."""

    LOG1P = "log1p"  # log1p(max(x, 0)): counts and prices, heavy-tailed
    NONE = "none"  # as it is (already transformed, e.g. TorchRec's .npy files)


class LabelColumn(SpecSection):
    """``label: click`` (0 or 1), or ``{column: rating, threshold: 4}`` (rating >= 4 is 1)."""

    column: str = Field(min_length=1)
    threshold: float | None = None


class DenseColumn(SpecSection):
    """A numeric column. ``transform`` defaults to log1p, or none for ``.npy`` data."""

    column: str = Field(min_length=1)
    transform: Transform | None = None


class SparseColumn(SpecSection):
    """A categorical column. ``max_len``: a multi-valued column (up to ``max_len`` ids a
    row, pooled), split by ``separator`` in text; a Parquet list column needs no
    separator. ``table``: a table shared with other features (default: the column's name)."""

    column: str = Field(min_length=1)
    table: str | None = Field(None, min_length=1)
    ids: IdKind | None = None
    separator: str | None = Field(None, min_length=1)
    max_len: int | None = Field(None, ge=1, le=65536)

    @model_validator(mode="after")
    def _multi(self) -> "SparseColumn":
        if self.separator is not None and self.max_len is None:
            raise ValueError("max_len: required for a multi-valued column (separator given)")
        return self


def _named(v: Any) -> Any:
    return {"column": v} if isinstance(v, str) else v


class FeaturesSpec(SpecSection):
    """``features:``: the columns a job trains on. Columns not named are ignored."""

    label: LabelColumn
    dense: list[DenseColumn] = Field(default_factory=list)
    sparse: list[SparseColumn] = Field(min_length=1)

    @field_validator("label", mode="before")
    @classmethod
    def _label(cls, v: Any) -> Any:
        return _named(v)

    @field_validator("dense", "sparse", mode="before")
    @classmethod
    def _columns(cls, v: Any) -> Any:
        return [_named(x) for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _unique(self) -> "FeaturesSpec":
        seen: set[str] = {self.label.column}
        for kind, cols in (("dense", self.dense), ("sparse", self.sparse)):
            for i, c in enumerate(cols):
                if c.column in seen:
                    raise ValueError(f"{kind}.{i}: column {c.column!r} is used twice")
                seen.add(c.column)
        return self


# --------------------------------------------------------------------------- resolved


@dataclass(frozen=True)
class DenseFeature:
    column: str
    transform: Transform


@dataclass(frozen=True)
class SparseFeature:
    """``max_len`` 1 and no ``separator``: one id a row (an empty value: an empty bag)."""

    column: str
    table: int  # index into Schema.tables
    ids: IdKind | None  # None: string for text, int for integer columns
    separator: str | None
    max_len: int
    multi: bool


@dataclass(frozen=True)
class Table:
    name: str
    rows: int  # num_embeddings of a hashed table, capacity_rows of a dynamic one
    spec: TableSpec
    features: tuple[str, ...]


@dataclass(frozen=True)
class Schema:
    label: LabelColumn
    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]  # grouped by table: see the module docstring
    tables: tuple[Table, ...]
    criteo: bool = False  # Criteo's own layout (its TSV parser, hex ids, missing id -> 0)

    @property
    def feature_names(self) -> list[str]:
        return [f.column for f in self.sparse]

    @property
    def dense_columns(self) -> list[str]:
        return [d.column for d in self.dense]

    @property
    def columns(self) -> list[str]:
        """Every column a file must hold: the label, the dense and the sparse ones."""
        return [self.label.column, *self.dense_columns, *self.feature_names]

    @property
    def dense_width(self) -> int:
        """The dense arch's input: one constant 1.0 column when the schema has no dense
        column, so that the MLP still gets an input (and learns a bias through it)."""
        return max(1, len(self.dense))

    def table_sizes(self) -> list[int]:
        return [t.rows for t in self.tables]

    def feature_tables(self) -> list[int]:
        """The table each feature (in batch order) looks up."""
        return [f.table for f in self.sparse]

    def table_specs(self) -> dict[int, TableSpec]:
        """``model.tables`` by table index, the way the PS knows its tables."""
        return {t: table.spec for t, table in enumerate(self.tables)}

    def dynamic(self) -> dict[int, TableSpec]:
        return {t: table.spec for t, table in enumerate(self.tables) if table.spec.kind is TableKind.DYNAMIC}

    def mean_features(self) -> list[int]:
        """Features (batch order) whose table pools by mean."""
        return [i for i, f in enumerate(self.sparse) if self.tables[f.table].spec.pooling is Pooling.MEAN]

    def max_ids_per_sample(self) -> int:
        return sum(f.max_len for f in self.sparse)


# --------------------------------------------------------------------------- resolving

NUM_DENSE = 13
NUM_SPARSE = 26
CRITEO_LABEL = "label"
CRITEO_DENSE = [f"I{j}" for j in range(1, NUM_DENSE + 1)]
CRITEO_SPARSE = [f"C{j}" for j in range(1, NUM_SPARSE + 1)]


def criteo_features() -> FeaturesSpec:
    """Criteo's layout as a ``features:`` section: label, I1..I13, C1..C26 (hex)."""
    return FeaturesSpec(
        label=LabelColumn(column=CRITEO_LABEL),
        dense=[DenseColumn(column=c) for c in CRITEO_DENSE],
        sparse=[SparseColumn(column=c, ids=IdKind.HEX) for c in CRITEO_SPARSE],
    )


def table_key(key: int | str, features: FeaturesSpec | None, names: list[str]) -> str:
    """The table a ``model.tables`` key names: a name, or (only without ``features:``)
    an index ``i`` meaning ``C{i+1}``. ``names``: the schema's table names."""
    text = str(key)
    if features is None and text.isdigit():
        i = int(text)
        if i >= len(names):
            raise ValueError(f"model.tables.{key}: no such table (Criteo's are 0..{len(names) - 1}, or C1..C{len(names)})")
        return names[i]
    if isinstance(key, int) or text.isdigit():
        raise ValueError(f"model.tables.{key}: tables are named by features: (e.g. model.tables.{names[0]})")
    if text not in names:
        raise ValueError(f"model.tables.{key}: no feature uses a table of that name (tables: {', '.join(names)})")
    return text


def resolve(features: FeaturesSpec | None, tables: dict[int | str, TableSpec], num_embeddings: int | list[int], npy: bool = False) -> Schema:
    """The job's :class:`Schema`. ``num_embeddings``: the rows of a hashed table that
    ``model.tables`` gives no ``num_embeddings``, one for all or a list (one per table,
    in order of first use). ``npy``: the data is TorchRec's ``.npy`` layout, whose dense
    values are already transformed (default ``transform: none``)."""
    given = features
    features = features or criteo_features()
    order: list[str] = []  # table names in order of first use
    for c in features.sparse:
        name = c.table or c.column
        if name not in order:
            order.append(name)
    by_name: dict[str, TableSpec] = {}
    for key, ts in tables.items():
        name = table_key(key, given, order)
        if name in by_name:
            raise ValueError(f"model.tables.{key}: table {name} is given twice")
        by_name[name] = ts
    if isinstance(num_embeddings, list) and len(num_embeddings) != len(order):
        raise ValueError(f"model.num_embeddings: needs {len(order)} table sizes (one per table), got {len(num_embeddings)}")
    default_rows = num_embeddings if isinstance(num_embeddings, list) else [num_embeddings] * len(order)
    users: dict[str, list[SparseColumn]] = {n: [c for c in features.sparse if (c.table or c.column) == n] for n in order}
    for name, cols in users.items():
        if len({(c.ids, c.separator, c.max_len) for c in cols}) > 1:
            a, b = cols[0], next(c for c in cols if (c.ids, c.separator, c.max_len) != (cols[0].ids, cols[0].separator, cols[0].max_len))
            raise ValueError(f"features.sparse: {a.column} and {b.column} share table {name} with different ids/separator/max_len")
    built = []
    for t, name in enumerate(order):
        ts = by_name.get(name, TableSpec())
        rows = ts.capacity_rows if ts.kind is TableKind.DYNAMIC else (ts.num_embeddings or default_rows[t])
        built.append(Table(name, int(rows), ts, tuple(c.column for c in users[name])))
    sparse = tuple(
        SparseFeature(c.column, t, c.ids, c.separator, c.max_len or 1, c.max_len is not None)
        for t, name in enumerate(order) for c in users[name]
    )  # fmt: skip
    default_transform = Transform.NONE if npy else Transform.LOG1P
    dense = tuple(DenseFeature(d.column, d.transform or default_transform) for d in features.dense)
    return Schema(features.label, dense, sparse, tuple(built), criteo=given is None)


CRITEO = resolve(None, {}, 100_000)  # the default layout, with the default table size
