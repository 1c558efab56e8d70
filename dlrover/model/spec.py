"""The model section of the job spec (``model:``): the DLRM's shape and its tables'
settings, which complete the feature schema (:mod:`dlrover.data.schema`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dlrover.data.schema import FeaturesSpec, Schema, resolve
from dlrover.spec_base import SpecSection
from dlrover.table_spec import TableSpec


class DCNSpec(SpecSection):
    """``model.dcn``: TorchRec's low-rank cross network (``LowRankCrossNet``)."""

    num_layers: int = Field(3, ge=1, le=16)
    low_rank_dim: int = Field(512, ge=1)


class ModelSpec(SpecSection):
    """DLRM shape. ``num_embeddings``: the rows of a hashed table that ``tables`` gives
    none, one size for all tables or a list (one per table, in order of first use).
    ``tables``: per-table settings by table name (``C4``); integer keys (``3``, meaning
    ``C4``) only for Criteo's layout, without ``features:``."""

    arch: Literal["dlrm", "dcn"] = Field("dlrm", description="the interaction: DLRM's pairwise dot products, or DLRM_DCN's cross network")
    dcn: DCNSpec | None = None  # arch dcn: its layers (default 3 of low rank 512, MLPerf's)
    embedding_dim: int = Field(16, ge=1, le=1024)
    num_embeddings: int | list[int] = 100_000
    dense_arch: list[int] = Field(default_factory=lambda: [512, 256, 16])
    over_arch: list[int] = Field(default_factory=lambda: [512, 256, 1])
    tables: dict[int | str, TableSpec] = Field(default_factory=dict)  # unlisted: hashed

    def schema(self, features: FeaturesSpec | None = None, npy: bool = False) -> Schema:
        """The feature schema these tables complete (Criteo's without ``features``)."""
        return resolve(features, self.tables, self.num_embeddings, npy)

    def short(self, schema: Schema) -> str:
        """``DLRM 26x40000x16 dense 64-16 over 128-64-1``: tables x rows x dim, MLP widths
        (``DCN3x128 ...`` with arch dcn: its layers and low rank)."""
        sizes = schema.table_sizes()
        rows = str(sizes[0]) if len(set(sizes)) == 1 else f"{min(sizes)}..{max(sizes)}"
        mlp = lambda widths: "-".join(map(str, widths))  # noqa: E731
        arch = f"DCN{self.dcn.num_layers}x{self.dcn.low_rank_dim}" if self.dcn else "DLRM"
        return f"{arch} {len(sizes)}x{rows}x{self.embedding_dim} dense {mlp(self.dense_arch)} over {mlp(self.over_arch)}"

    @field_validator("num_embeddings")
    @classmethod
    def _sizes(cls, v: int | list[int]) -> int | list[int]:
        sizes = [v] if isinstance(v, int) else v
        if any(s < 1 for s in sizes):
            raise ValueError("table sizes must be >= 1")
        return v

    @field_validator("dense_arch", "over_arch")
    @classmethod
    def _layers(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v):
            raise ValueError("needs at least one layer, each size >= 1")
        return v

    @model_validator(mode="before")
    @classmethod
    def _dcn_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("arch") == "dcn" and data.get("dcn") is None:
            return {**data, "dcn": {}}
        return data

    @model_validator(mode="after")
    def _shapes(self) -> "ModelSpec":
        if self.dcn is not None and self.arch != "dcn":
            raise ValueError(f"dcn: only for arch: dcn (this model is {self.arch})")
        if self.dense_arch[-1] != self.embedding_dim:
            raise ValueError(f"dense_arch: last layer ({self.dense_arch[-1]}) must equal embedding_dim ({self.embedding_dim})")
        if self.over_arch[-1] != 1:
            raise ValueError(f"over_arch: last layer must be 1 (one logit), got {self.over_arch[-1]}")
        return self
