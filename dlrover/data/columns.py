"""Named columns (an Arrow table read from CSV, TSV or Parquet) -> a :class:`Batch`, as
the feature schema says: the label, the dense features transformed, each sparse feature's
ids and bag lengths. Vectorised over the column (Arrow compute and numpy), never per row.

A value that cannot be used (a label that is not 0/1, a dense value that is not a
number, a bad hex or integer id, a bag over ``max_len`` with ``on_long_bag: fail``) makes
its row bad: the row is dropped and reported as ``file:line: column: problem``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.layout import DataLayout
from dlrover.data.schema import IdKind, SparseFeature, Transform
from dlrover.data.tsv import hex_words
from dlrover.errors import DataError

Rows = tuple[Batch, np.ndarray, list[str]]  # good rows, ordinals of the bad ones, why
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*[-+]?(nan|NaN|NAN|inf|Inf|INF|infinity|Infinity)\s*$"
_INTEGER = r"^\s*[-+]?\d{1,18}\s*$"
_ID_MASK = np.uint64(0x7FFF_FFFF_FFFF_FFFF)


def hash_ids(values: Any) -> np.ndarray:
    """Stable 63-bit ids of an Arrow string array's values: ``pandas.util.hash_array`` of
    each distinct value's text (each hashed once), sign bit cleared. The same function
    in training, export and predict, so a value always meets its own row."""
    import pandas as pd
    import pyarrow.compute as pc

    if len(values) == 0:
        return np.zeros(0, np.int64)
    enc = pc.dictionary_encode(values)
    uniques = enc.dictionary.to_numpy(zero_copy_only=False).astype(object)
    hashed = (pd.util.hash_array(uniques, categorize=False) & _ID_MASK).astype(np.int64)
    return hashed[enc.indices.to_numpy(zero_copy_only=False)]


class _Problems:
    """Bad rows found so far, each with the first reason found for it."""

    def __init__(self, n: int, where: Callable[[np.ndarray], np.ndarray]) -> None:
        self.bad = np.zeros(n, bool)
        self.reasons: dict[int, str] = {}
        self._where = where  # row ordinals -> "file:line" texts

    def add(self, mask: np.ndarray, column: str, problem: str, values: Any = None) -> None:
        new = np.flatnonzero(mask & ~self.bad)
        if not len(new):
            return
        places = self._where(new)
        for k, (row, place) in enumerate(zip(new.tolist(), places)):
            shown = f", got {values[row]!r}" if values is not None and k < 1 else ""
            self.reasons[row] = f"{place}: {column}: {problem}{shown}"
        self.bad |= mask


def _column(table: Any, name: str, path: str) -> Any:
    if name not in table.column_names:
        raise DataError(f"{path}: no column {name!r} (the schema's features name it)")
    return table.column(name).combine_chunks()


def _numbers(col: Any, column: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray]:
    """float64 values and their missing mask of a numeric (or numeric-text) column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True).to_numpy(zero_copy_only=False)
        ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False).to_numpy(zero_copy_only=False) | blank
        text = col.to_numpy(zero_copy_only=False)
        probs.add(~ok, column, "not a number", text)
        col = pc.if_else(pa.array(ok & ~blank), col, pa.scalar(None, pa.string()))
    elif not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
        raise DataError(f"column {column} has type {col.type}, expected numbers")
    values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
    missing = np.isnan(values)
    return np.where(missing, 0.0, values), missing


def labels_of(table: Any, layout: DataLayout, path: str, probs: _Problems) -> np.ndarray:
    if not layout.labeled:
        return np.full(table.num_rows, np.nan, np.float32)
    label = layout.schema.label
    values, missing = _numbers(_column(table, label.column, path), label.column, probs)
    probs.add(missing, label.column, "label is missing")
    if label.threshold is not None:
        return (values >= label.threshold).astype(np.float32)
    ok = (values == 0) | (values == 1) | missing
    probs.add(~ok, label.column, "label must be 0 or 1 (or give label.threshold)", values)
    return np.where(ok, values, 0).astype(np.float32)


def dense_of(table: Any, layout: DataLayout, path: str, probs: _Problems) -> np.ndarray:
    n = table.num_rows
    if not layout.schema.dense:
        return np.ones((n, 1), np.float32)  # the constant input of a schema without dense columns
    out = np.empty((n, len(layout.schema.dense)), np.float32)
    for j, d in enumerate(layout.schema.dense):
        values, _ = _numbers(_column(table, d.column, path), d.column, probs)
        out[:, j] = np.log1p(np.maximum(values, 0)) if d.transform is Transform.LOG1P else values
    return out


def _ids(values: Any, f: SparseFeature, probs: _Problems | None, rows: np.ndarray) -> np.ndarray:
    """int64 ids of non-null values (Arrow); ``rows``: each value's row, for problems."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or pa.types.is_binary(values.type)
    kind = f.ids or (IdKind.STRING if text else IdKind.INT)
    if kind is IdKind.STRING:
        return hash_ids(values if text else pc.cast(values, pa.string()))
    if not text:
        if not pa.types.is_integer(values.type):
            raise DataError(f"column {f.column} has type {values.type}, expected integers or strings")
        return values.to_numpy(zero_copy_only=False).astype(np.int64)
    raw = values.to_numpy(zero_copy_only=False)
    if kind is IdKind.HEX:
        s = raw.astype("S")
        out, ok = hex_words(np.ascontiguousarray(s.astype("S8")).view("<u8"), np.char.str_len(s))
        ok &= np.char.str_len(s) <= 8
        what = "not a hex string of at most 8 digits"
    else:
        ok = pc.match_substring_regex(values, _INTEGER).to_numpy(zero_copy_only=False)
        out = pc.cast(pc.if_else(pa.array(ok), values, pa.scalar("0")), pa.int64()).to_numpy(zero_copy_only=False)
        what = "not an integer"
    if not ok.all() and probs is not None:
        bad = np.zeros(len(probs.bad), bool)
        bad[rows[~ok]] = True
        probs.add(bad, f.column, what, dict(zip(rows[~ok].tolist(), raw[~ok].tolist())))
    return np.where(ok, out, 0).astype(np.int64)


def bag_of(col: Any, f: SparseFeature, layout: DataLayout, path: str, probs: _Problems) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One feature's (ids, lengths [N], which rows' bags were cut to max_len). Nulls and empty strings
    are missing (no id); a multi-valued text column is split by its separator."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(col)
    listed = pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
    if listed and not f.multi:
        raise DataError(f"{path}: column {f.column} holds lists: give it max_len in features.sparse")
    if not listed and f.multi:
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            raise DataError(f"{path}: column {f.column} has type {col.type}; a multi-valued column is text (with separator) or a list")
        if f.separator is None:
            raise DataError(f"{path}: column {f.column}: separator: required for a multi-valued text column")
        col, listed = pc.split_pattern(col, f.separator), True
    if listed:
        lens = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        long = lens > f.max_len
        if long.any() and layout.on_long_bag == "fail":
            probs.add(long, f.column, f"more than max_len ({f.max_len}) ids", dict(enumerate(lens.tolist())))
        col = pc.list_slice(col, 0, f.max_len)
        flat, rows = pc.list_flatten(col), pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
        cut = long if layout.on_long_bag == "truncate" and long.any() else None
    else:
        flat, rows, cut = col, np.arange(n), None
    keep = flat.is_valid()
    if pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type):
        keep = pc.and_(keep, pc.not_equal(flat, ""))
    keep_np = pc.fill_null(keep, False).to_numpy(zero_copy_only=False)
    flat, rows = flat.filter(pa.array(keep_np)), rows[keep_np]
    ids = _ids(flat, f, probs, rows)
    return ids, np.bincount(rows, minlength=n).astype(np.int32), cut


def empty_rows(layout: DataLayout) -> Rows:
    s = layout.schema
    return Batch.empty(s.dense_width, len(s.sparse)), np.zeros(0, np.int64), []


def table_to_rows(table: Any, layout: DataLayout, path: str, where: Callable[[np.ndarray], np.ndarray]) -> Rows:
    """Rows of an Arrow table -> (good rows as a Batch, bad row ordinals, reasons).
    ``where(ordinals)``: the ``file:line`` of those rows, for messages."""
    n = table.num_rows
    probs = _Problems(n, where)
    labels = labels_of(table, layout, path, probs)
    dense = dense_of(table, layout, path, probs)
    bags = [bag_of(_column(table, f.column, path), f, layout, path, probs) for f in layout.schema.sparse]
    keep = ~probs.bad
    cuts = [c for _, _, c in bags if c is not None]
    cut = np.sum(cuts, axis=0, dtype=np.int32)[keep] if cuts else None
    lengths = np.stack([lens for _, lens, _ in bags]) if bags else np.zeros((0, n), np.int32)
    if (lengths[:, keep] == 1).all():  # one id per feature and row: the dense layout
        sparse = np.stack([ids[keep] for ids, _, _ in bags], axis=1) if bags else np.zeros((n, 0), np.int64)
        batch = Batch(labels[keep], dense[keep], sparse, cut=cut)
    else:
        ids = [ids[np.repeat(keep, lens)] for ids, lens, _ in bags]
        batch = Batch(labels[keep], dense[keep], np.concatenate(ids), np.ascontiguousarray(lengths[:, keep]), cut)
    bad = np.flatnonzero(probs.bad)
    return batch, bad, [probs.reasons[r] for r in bad.tolist()]
