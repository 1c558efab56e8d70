"""How a job's data files are laid out: the feature schema plus the file-level settings
(format, header, delimiter) that the readers need. One record, built from the spec once,
handed to every reader (workers, evaluation, predict, the baseline)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dlrover.data.schema import CRITEO, CRITEO_DENSE, CRITEO_SPARSE, FeaturesSpec, Schema
from dlrover.errors import DataError

_TEXT_EXTS = (".tsv", ".txt", ".csv", ".gz", "")
_PARQUET_EXTS = (".parquet", ".pq")


@dataclass(frozen=True)
class DataLayout:
    """``format``: the spec's ``data.format``. A file's own format (:meth:`file_format`)
    is ``tsv`` (Criteo's TSV), ``csv`` (delimited text with named columns), ``parquet`` or
    ``npy`` (a day of TorchRec's preprocessed Criteo)."""

    schema: Schema = CRITEO
    format: str = "auto"
    header: bool = True
    delimiter: str | None = None
    columns: tuple[str, ...] | None = None
    on_long_bag: str = "truncate"
    labeled: bool = True  # False: rows to score, whose files need not hold the label column

    @property
    def criteo(self) -> bool:
        return self.schema.criteo

    @property
    def required_columns(self) -> list[str]:
        """The columns a file must hold: the schema's, less the label where not ``labeled``."""
        cols = self.schema.columns
        return cols if self.labeled else cols[1:]

    def file_format(self, path: str) -> str:
        """``tsv``, ``csv`` or ``parquet`` for this file, from ``format`` or, with
        ``auto``, its extension; unknown extensions are refused rather than guessed, so
        a stray ``synth.json`` never gets parsed as data."""
        if self.format == "torchrec_npy":
            return "npy"  # a day of a directory (dlrover.data.npy)
        name = os.path.basename(path).lower()
        ext = os.path.splitext(name)[1]
        if ext in _PARQUET_EXTS:
            found = "parquet"
        elif ext in _TEXT_EXTS:
            found = "tsv" if self.criteo else "csv"
        else:
            raise DataError(
                f"{path}: unknown data file extension {ext!r} "
                "(expected .tsv, .txt, .csv, .gz, .parquet, .pq or none)"
            )
        want = {"auto": found, "criteo": "tsv", "tsv": "tsv" if self.criteo else "csv", "csv": "csv", "parquet": "parquet"}[self.format]
        if want != found and not (found in ("tsv", "csv") and want in ("tsv", "csv")):
            raise DataError(f"{path}: looks like {found} (by its extension) but data.format is {self.format}")
        return want

    def sep(self, path: str) -> str:
        """The field delimiter of a delimited text file."""
        if self.delimiter is not None:
            return self.delimiter
        if self.format == "tsv":
            return "\t"
        if self.format == "csv":
            return ","
        name = path.lower().removesuffix(".gz")
        return "\t" if name.endswith((".tsv", ".txt")) else ","


CRITEO_LAYOUT = DataLayout()


def check_layout(features: FeaturesSpec | None, fmt: str, header: bool, columns: list[str] | None) -> None:
    """The spec's ``data`` settings fit its ``features`` (a ValueError naming the field)."""
    if features is None and fmt == "csv":
        raise ValueError("data.format: csv needs features: (the columns to train on)")
    if features is not None and fmt == "criteo":
        raise ValueError("data.format: criteo is Criteo's own layout; with features: use csv, tsv or parquet")
    if columns is not None and header:
        raise ValueError("data.columns: only for files without a header (set data.header: false)")
    if features is not None and fmt == "torchrec_npy":
        known = {"label": ["label"], "dense": CRITEO_DENSE, "sparse": CRITEO_SPARSE}
        named = {"label": [features.label.column], "dense": [c.column for c in features.dense], "sparse": [c.column for c in features.sparse]}
        for kind, cols in named.items():
            if bad := [c for c in cols if c not in known[kind]]:
                raise ValueError(f"features.{kind}: {bad[0]!r}: torchrec_npy columns are label, I1..I13 and C1..C26")
