"""Criteo data as Parquet: reading a file (or one row group of it) into rows, and
converting TSV to Parquet.

Parquet files hold the columns ``label``, ``I1..I13`` (integers) and ``C1..C26``
(integers or hex strings); a row with a bad value is reported as ``file:row``. A row
group is the unit of reading: a shard of a file in an object store fetches the byte
ranges of its row groups' column chunks, not the whole object.
"""

from __future__ import annotations

import os

import numpy as np

from typing import Any

from dlrover.data.criteo import DENSE_COLUMNS, NUM_DENSE, NUM_SPARSE, SPARSE_COLUMNS, RawRows
from dlrover.data.remote import open_ranged
from dlrover.paths import is_url
from dlrover.data.tsv import hex_words, read_whole_tsv
from dlrover.errors import DataError


COLUMNS = ["label", *DENSE_COLUMNS, *SPARSE_COLUMNS]


def open_parquet(path: str, columns: list[str] | None = None) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` over a local path or URL whose ``columns``
    (default Criteo's) are all there. Reads are pre-buffered: one ranged request per row
    group, not per column."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(open_ranged(path) if is_url(path) else path, pre_buffer=True)
        missing = [c for c in columns or COLUMNS if c not in set(pf.schema_arrow.names)]
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except Exception as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    if missing:
        raise DataError(f"{path}: Parquet file lacks column(s) {', '.join(missing)}")
    return pf


def read_row_group(pf: Any, path: str, group: int, first_row: int) -> tuple[RawRows, np.ndarray, list[str]]:
    """Row group ``group`` of an :func:`open_parquet` file, whose first row is file row
    ``first_row`` -> (good rows, bad row ordinals within the group, reasons)."""
    try:
        table = pf.read_row_group(group, columns=COLUMNS)
    except Exception as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    return table_rows(table, path, first_row)


def table_rows(table: Any, path: str, first_row: int) -> tuple[RawRows, np.ndarray, list[str]]:
    """Criteo rows of an Arrow table read from ``path`` (its first row is file row
    ``first_row``, for messages) -> (good rows, bad row ordinals, reasons)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    problems: list[tuple[np.ndarray, str]] = []  # (bad-row mask, reason)

    def integers(name: str) -> tuple[np.ndarray, np.ndarray]:
        col = table.column(name)
        if not pa.types.is_integer(col.type):
            raise DataError(f"{path}: column {name} has type {col.type}, expected integers")
        missing = col.is_null().to_numpy(zero_copy_only=False)
        return pc.fill_null(col, 0).to_numpy().astype(np.int64), missing

    label_col = table.column("label")
    kind = label_col.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DataError(f"{path}: column label has type {kind}, expected numbers")
    label_values = pc.fill_null(label_col.cast(pa.float64()), -1.0).to_numpy()
    label_ok = (label_values == 0) | (label_values == 1)
    labels = np.where(label_ok, label_values, 0).astype(np.int64)
    problems.append((~label_ok, "label must be 0 or 1"))
    dense = np.zeros((n, NUM_DENSE), np.int64)
    dense_missing = np.zeros((n, NUM_DENSE), bool)
    for j, name in enumerate(DENSE_COLUMNS):
        dense[:, j], dense_missing[:, j] = integers(name)
    sparse = np.zeros((n, NUM_SPARSE), np.int64)
    sparse_missing = np.zeros((n, NUM_SPARSE), bool)
    for j, name in enumerate(SPARSE_COLUMNS):
        col = table.column(name)
        if pa.types.is_integer(col.type):
            sparse[:, j], sparse_missing[:, j] = integers(name)
            reason = f"{name} must be in [0, 2**32)"
            problems.append(((sparse[:, j] < 0) | (sparse[:, j] >= 1 << 32), reason))
        elif pa.types.is_string(col.type) or pa.types.is_binary(col.type):
            sparse_missing[:, j] = col.is_null().to_numpy(zero_copy_only=False)
            text = pc.fill_null(col, "").to_numpy(zero_copy_only=False).astype("S")
            lengths = np.char.str_len(text)
            words = np.ascontiguousarray(text.astype("S8")).view("<u8")
            sparse[:, j], ok = hex_words(words, lengths)
            sparse_missing[:, j] |= lengths == 0
            problems.append((~ok, f"{name} must be a hex string of at most 8 digits"))
        else:
            raise DataError(f"{path}: column {name} has type {col.type}, expected int or string")

    bad_mask = np.zeros(n, bool)
    reason_of: dict[int, str] = {}
    for mask, reason in problems:
        for row in np.flatnonzero(mask & ~bad_mask).tolist():
            reason_of[row] = f"{path}:{first_row + row + 1}: {reason}"
        bad_mask |= mask
    keep = ~bad_mask
    raw = RawRows(
        labels[keep].astype(np.uint8),
        dense[keep],
        dense_missing[keep],
        sparse[keep],
        sparse_missing[keep],
    )
    bad = np.flatnonzero(bad_mask)
    return raw, bad, [reason_of[r] for r in bad.tolist()]


def tsv_to_parquet(src: str, dst: str, hex_strings: bool = False) -> int:
    """Convert a (possibly gzip'd) Criteo TSV file to Parquet; returns the row count.

    Empty fields become nulls; ``C*`` columns are int64 unless ``hex_strings``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw, _, _ = read_whole_tsv(src, "fail")
    columns = {"label": pa.array(raw.labels.astype(np.int8))}
    for j, name in enumerate(DENSE_COLUMNS):
        columns[name] = pa.array(raw.dense[:, j], mask=raw.dense_missing[:, j])
    for j, name in enumerate(SPARSE_COLUMNS):
        if hex_strings:
            text = np.array([f"{v:08x}" for v in raw.sparse[:, j].tolist()], dtype=object)
            columns[name] = pa.array(text, type=pa.string(), mask=raw.sparse_missing[:, j])
        else:
            columns[name] = pa.array(raw.sparse[:, j], mask=raw.sparse_missing[:, j])
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    pq.write_table(pa.table(columns), dst)
    return len(raw.labels)

