"""Criteo Kaggle click logs: the row format, finding data files and indexing them.

A line is ``label \\t I1..I13 \\t C1..C26``: 40 tab-separated fields. Workers read
row ranges ``[start, stop)`` of a file (a shard), so plain TSV files are indexed once
(a byte offset every ``stride`` rows) and a read seeks close to ``start`` instead of
scanning the file (:mod:`dlrover.data.reader`). Parsing is :mod:`dlrover.data.tsv` and
:mod:`dlrover.data.parquet`.
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from contextlib import nullcontext
from dataclasses import dataclass
from typing import IO, NamedTuple

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.layout import CRITEO_LAYOUT, DataLayout
from dlrover.data.remote import expand_url, local_path, open_ranged, open_url, store_errors
from dlrover.paths import is_url
from dlrover.errors import DataError
from dlrover.data.schema import CRITEO_DENSE as DENSE_COLUMNS, CRITEO_SPARSE as SPARSE_COLUMNS, NUM_DENSE, NUM_SPARSE

NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
_BLOCK = 16 << 20  # bytes read at a time when indexing
# Rows between seek points of a file behind a URL: a read fetches from the seek point
# before its first row, and fetched bytes cost more than local ones (~128 KiB of Criteo).
REMOTE_STRIDE = 512
_NL, _CR = 10, 13


# --------------------------------------------------------------------------- batch


class RawRows(NamedTuple):
    """Parsed values before the model transform; kept for Parquet conversion."""

    labels: np.ndarray  # uint8 [N]
    dense: np.ndarray  # int64 [N, 13]
    dense_missing: np.ndarray  # bool [N, 13]
    sparse: np.ndarray  # int64 [N, 26]
    sparse_missing: np.ndarray  # bool [N, 26]

    def batch(self) -> Batch:
        dense = np.log1p(np.maximum(self.dense, 0).astype(np.float32))
        return Batch(self.labels.astype(np.float32), dense, self.sparse)


# --------------------------------------------------------------------------- paths


def detect_format(path: str) -> str:
    """``"tsv"`` or ``"parquet"`` for Criteo's layout, from the file name
    (:meth:`DataLayout.file_format`)."""
    return CRITEO_LAYOUT.file_format(path)


def is_data_name(path: str) -> bool:
    """A data file's name: a known format, not hidden, and not a writer's marker or
    temporary (``_SUCCESS``, ``_temporary``: names starting with "_", as Spark and Hive skip)."""
    try:
        detect_format(path)
    except DataError:
        return False
    return not os.path.basename(path).startswith((".", "_"))


def _is_data_file(path: str) -> bool:
    return is_data_name(path) and os.path.isfile(path)


def expand_paths(patterns: list[str]) -> list[str]:
    """Expand globs (and directories, to the data files inside them) into a sorted,
    deduplicated file list; a pattern that matches nothing is an error, since silently
    training on fewer files than asked for is worse than failing.

    A pattern may be an fsspec URL (``s3://bucket/day_*.tsv``); its files are listed
    as full URLs. ``file://`` URLs are local paths."""
    found: set[str] = set()
    for pattern in patterns:
        if is_url(pattern):
            urls = expand_url(pattern, is_data_name)
            if not urls:
                raise DataError(f"data.paths: {pattern}: matches no data files")
            found.update(urls)
            continue
        expanded = os.path.expanduser(local_path(pattern))
        if os.path.isdir(expanded):
            names = [os.path.join(expanded, n) for n in os.listdir(expanded)]
            matches = [p for p in names if _is_data_file(p)]
        elif glob.has_magic(expanded):
            matches = [p for p in glob.glob(expanded) if _is_data_file(p)]
        else:
            matches = [expanded] if os.path.isfile(expanded) else []
        if not matches:
            raise DataError(f"data.paths: {pattern}: matches no data files")
        found.update(os.path.normpath(p) for p in matches)
    return sorted(found)


# --------------------------------------------------------------------------- index


@dataclass
class FileIndex:
    """Row count of one file, plus seek points for plain TSV.

    ``offsets[k]`` is the byte offset of row ``k * stride`` and ``line_nos[k]`` its
    0-based physical line, so blank lines never shift reported line numbers. ``size``:
    bytes of a plain TSV file as indexed (a remote read needs it without asking the
    store). ``groups``: rows of each Parquet row group, the unit a Parquet read fetches.
    """

    path: str
    fmt: str
    rows: int
    offsets: list[int] | None
    stride: int = 4096
    line_nos: list[int] | None = None
    size: int | None = None
    groups: list[int] | None = None
    columns: list[str] | None = None  # a delimited file's column names (its header's)
    head: tuple[int, int] = (0, 0)  # bytes and lines before the first row (a header)


def line_bounds(data: bytes, at_eof: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start/end byte of each complete line in ``data`` (plus the unterminated last one
    when ``at_eof``), and whether it is a row (not blank, ignoring a trailing CR)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NL)
    tail_start = int(ends[-1]) + 1 if len(ends) else 0
    if at_eof and tail_start < len(data):
        ends = np.append(ends, len(data))
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    has_cr = (lengths > 0) & (buf[np.maximum(ends - 1, 0)] == _CR) if len(buf) else lengths > 0
    return starts, ends, (lengths - has_cr) > 0


def open_binary(path: str) -> IO[bytes]:
    """The file's bytes (gunzipped for ``.gz``), streamed from the store for a URL; a
    missing or unreadable file is a DataError."""
    if is_url(path):
        f = open_url(path, block_size=_BLOCK)
        return gzip.GzipFile(fileobj=f, mode="rb") if path.lower().endswith(".gz") else f
    try:
        return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror or e}") from None


def read_bytes(f: IO[bytes], path: str, n: int = -1) -> bytes:
    """``f.read(n)``; a truncated or corrupt file, or a store failing under a URL's read,
    is a DataError naming ``path``."""
    try:
        with store_errors(path) if is_url(path) else nullcontext():
            try:
                return f.read(n)
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise DataError(f"{path}: corrupt file: {e}") from None
    except OSError as e:  # a local file (a URL's errors are DataErrors by now)
        raise DataError(f"{path}: corrupt file: {e}") from None


def _missing_columns(path: str, names: list[str], layout: DataLayout, where: str) -> None:
    """A schema column the file does not have is an error naming both."""
    missing = [c for c in layout.required_columns if c not in set(names)]
    if missing:
        raise DataError(f"{path}: column {missing[0]!r} of the schema is not in the file's {where} ({', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")


def _header(path: str, layout: DataLayout) -> tuple[list[str], int, int]:
    """A delimited file's column names (its first non-blank line, or ``data.columns``),
    the byte offset and line count after the header."""
    if not layout.header:
        names = list(layout.columns or [])
        if not names:
            raise DataError(f"{path}: data.header is false: name the columns in data.columns")
        return names, 0, 0
    with open_binary(path) as f:
        head = read_bytes(f, path, 1 << 20)
    lines = head.split(b"\n")
    skipped = 0
    while skipped < len(lines) - 1 and not lines[skipped].strip():
        skipped += 1
    if skipped >= len(lines) - 1 and len(head) == 1 << 20:
        raise DataError(f"{path}: no header line in the first MiB")
    line = lines[skipped].rstrip(b"\r")
    text = line.decode("utf-8", "replace")
    names = [c.strip().strip('"') for c in text.split(layout.sep(path))]
    return names, sum(len(x) + 1 for x in lines[: skipped + 1]), skipped + 1


def index_file(path: str, stride: int | None = None, layout: DataLayout = CRITEO_LAYOUT) -> FileIndex:
    """Count the rows (non-blank lines) of a file; for plain TSV also record a seek
    point every ``stride`` rows (default 4096, :data:`REMOTE_STRIDE` for a URL). Reads
    16 MiB blocks (streamed once from a store) and finds newlines with numpy. A file
    that lacks a column of the schema is an error naming the column and the file."""
    remote = is_url(path)
    stride = stride if stride is not None else REMOTE_STRIDE if remote else 4096
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    fmt = layout.file_format(path)
    if fmt == "npy":
        from dlrover.data.npy import NpyDay

        return FileIndex(path, fmt, NpyDay.open(path).rows, None, stride)
    if not remote and not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if fmt == "parquet":  # the footer only: a ranged read at the end of the file
        import pyarrow.parquet as pq

        try:
            with open_ranged(path) if remote else open(path, "rb") as f:
                pf = pq.ParquetFile(f)
                meta, names = pf.metadata, list(pf.schema_arrow.names)
        except DataError:
            raise
        except Exception as e:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
        if not layout.criteo:
            _missing_columns(path, names, layout, "columns")
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        return FileIndex(path, fmt, int(meta.num_rows), None, stride, groups=groups, columns=names)

    names: list[str] | None = None
    pos = lines = 0  # file offset and physical lines before `data`
    if fmt == "csv":
        names, pos, lines = _header(path, layout)
        _missing_columns(path, names, layout, "header" if layout.header else "data.columns")
    head = (pos, lines)
    want_offsets = not path.lower().endswith(".gz")
    offsets: list[int] = []
    line_nos: list[int] = []
    rows = 0  # rows seen before `data`
    tail = b""
    with open_binary(path) as f:
        if pos:
            read_bytes(f, path, pos)  # the header
        while True:
            block = read_bytes(f, path, _BLOCK)
            at_eof = not block
            data = tail + block if tail else block
            starts, ends, is_row = line_bounds(data, at_eof)
            row_lines = np.flatnonzero(is_row)
            if want_offsets:
                picked = row_lines[(-rows) % stride :: stride]
                offsets.extend((pos + starts[picked]).tolist())
                line_nos.extend((lines + picked).tolist())
            rows += len(row_lines)
            lines += len(starts)
            if at_eof:
                break
            consumed = int(ends[-1]) + 1 if len(ends) else 0
            tail = data[consumed:]
            pos += consumed
    if not want_offsets:
        return FileIndex(path, fmt, rows, None, stride, columns=names, head=head)
    return FileIndex(path, fmt, rows, offsets, stride, line_nos, size=pos + len(data), columns=names, head=head)

