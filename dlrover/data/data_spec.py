"""The spec's ``data:`` section: where the rows come from (files, or a Ray Data ``Dataset``)
and how they are cut into shards. Its own module so that ``dlrover/spec.py`` stays short."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dlrover.data.remote import unknown_protocol
from dlrover.paths import is_url
from dlrover.spec_base import SpecSection

FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # data.dataset: module:function


class SynthSpec(SpecSection):
    """Synthetic data generated on first use when ``data.paths`` match nothing: Criteo's
    layout, or with ``features:`` the job's own (``dlrover.data.synth_schema``)."""

    out: str
    rows: int = Field(300_000, ge=100)
    files: int = Field(4, ge=1)
    seed: int = 0
    bags: Literal["variable", "fixed"] = Field("variable", description="with features: a multi-valued column's 0..max_len ids a row, or always max_len (MLPerf's multi-hot)")


class FollowSpec(SpecSection):
    """``data.follow``: train on files as they arrive under ``data.paths``, each once."""

    poll_s: float = Field(30.0, gt=0, description="list data.paths this often")
    ready: Literal["_SUCCESS", "stable_size"] = Field(
        "stable_size", description="a file is complete once its directory holds _SUCCESS, or once its size is the same at two polls in a row"
    )
    until: datetime | int | None = Field(None, description="stop following at this ISO time, or once this many rows arrived; null: until stopped")

    @field_validator("until")
    @classmethod
    def _until(cls, v: datetime | int | None) -> datetime | int | None:
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise ValueError(f"rows must be >= 1, got {v}")
        if isinstance(v, datetime) and v.tzinfo is None:
            return v.astimezone()  # a time without a zone is the local time
        return v


class DataSpec(SpecSection):
    """Where the rows are and how they are cut into shards.

    ``paths``: local files, directories or globs, or fsspec URLs (``s3://bucket/day_*.tsv``,
    ``gs://...``, ``file://...``). A store's endpoint and credentials come from the
    environment, as fsspec and its drivers read them (``FSSPEC_S3_ENDPOINT_URL``,
    ``AWS_ACCESS_KEY_ID``, ...), never from the spec, which is saved with the run.
    ``source: ray_data``: the rows are a ``ray.data.Dataset`` instead (``dataset``, or the
    one given to ``dlrover.run``), streamed block by block (:mod:`dlrover.data.ray_source`).
    """

    source: Literal["files", "ray_data"] = Field("files", description="files: data.paths; ray_data: a ray.data.Dataset, streamed block by block")
    dataset: str | None = Field(None, description="ray_data: module:function returning the Dataset (imported on the driver, called once)")
    blocks_in_flight: int = Field(8, ge=1, description="ray_data: blocks the master pins at once (leased or waiting); Ray Data backpressures the rest")
    ray_data_cpu: float = Field(1.0, gt=0, description="ray_data: CPUs Ray Data's tasks may hold (its resource limit), reserved beside the job's actors")
    paths: list[str] = Field(default_factory=list)
    # auto: by file extension. Without ``features:`` tsv (and auto) mean Criteo's layout.
    format: Literal["auto", "criteo", "csv", "tsv", "parquet", "torchrec_npy"] = "auto"
    header: bool = Field(True, description="csv/tsv with features: the first line names the columns")
    delimiter: str | None = Field(None, min_length=1, max_length=1, description="csv/tsv: default ',' for csv, tab for tsv")
    columns: list[str] | None = Field(None, min_length=1, description="csv/tsv without a header: the columns' names, in order")
    on_long_bag: Literal["truncate", "fail"] = Field("truncate", description="a row with more than max_len ids: keep the first max_len (counted), or fail")
    synth: SynthSpec | None = None
    follow: FollowSpec | None = Field(None, description="train on files as they arrive, each once (epochs do not apply)")
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(2048, ge=1)
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    eval_every_steps: int = Field(0, ge=0)
    shard_rows: int = Field(32_768, ge=1)
    on_bad_line: Literal["fail", "skip"] = "fail"
    shuffle: bool = True

    @field_validator("paths", mode="before")
    @classmethod
    def _one_path(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("paths")
    @classmethod
    def _known_schemes(cls, v: list[str]) -> list[str]:
        for path in v:
            if not path.strip():
                raise ValueError("empty path")
            bad = unknown_protocol(path) if is_url(path) else None
            if bad is not None:
                raise ValueError(f"{path}: unknown storage scheme {bad!r} (fsspec knows s3, gs, az, http, ...)")
        return v

    @field_validator("dataset")
    @classmethod
    def _function_name(cls, v: str | None) -> str | None:
        if v is not None and not FUNCTION.fullmatch(v):
            raise ValueError(f"expected module:function (a Python function returning the Dataset), got {v!r}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _stream_holds_nothing_out(cls, doc: Any) -> Any:
        """A stream has no tail to hold out: ``eval_fraction`` is 0 unless set (then an error)."""
        if isinstance(doc, dict) and doc.get("source") == "ray_data" and "eval_fraction" not in doc:
            return {**doc, "eval_fraction": 0.0}
        return doc

    @model_validator(mode="after")
    def _source(self) -> "DataSpec":
        if self.source == "files":
            if not self.paths:
                raise ValueError("paths: required (or source: ray_data)")
            if self.dataset is not None:
                raise ValueError("dataset: needs source: ray_data")
            if self.follow is not None:
                if self.epochs != 1:
                    raise ValueError("epochs: a followed stream trains each file once (leave epochs at 1)")
                if self.synth is not None or self.format == "torchrec_npy":
                    raise ValueError(f"follow: not with {'synth' if self.synth else 'format: torchrec_npy'} (files arrive under data.paths)")
            return self
        for name, value in (("paths", self.paths), ("synth", self.synth), ("columns", self.columns), ("follow", self.follow)):
            if value:
                raise ValueError(f"{name}: not used with source: ray_data (the Dataset's columns are read by name)")
        if self.format != "auto":
            raise ValueError(f"format: {self.format}: a Dataset's blocks are tables read by column name; leave format: auto")
        if self.eval_fraction > 0:
            raise ValueError("eval_fraction: a ray_data job trains every row it streams (hold rows out in the Dataset itself)")
        return self
