"""Criteo Kaggle click logs: the row format, the parsed :class:`Batch`, finding data files
and indexing them.

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

from dlrover.data.remote import expand_url, local_path, open_ranged, open_url, store_errors
from dlrover.paths import is_url
from dlrover.errors import DataError

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE

DENSE_COLUMNS = [f"I{j}" for j in range(1, NUM_DENSE + 1)]
SPARSE_COLUMNS = [f"C{j}" for j in range(1, NUM_SPARSE + 1)]

_TSV_EXTS = (".tsv", ".txt", ".csv", ".gz", "")
_PARQUET_EXTS = (".parquet", ".pq")
_BLOCK = 16 << 20  # bytes read at a time when indexing
# Rows between seek points of a file behind a URL: a read fetches from the seek point
# before its first row, and fetched bytes cost more than local ones (~128 KiB of Criteo).
REMOTE_STRIDE = 512
_NL, _CR = 10, 13


# --------------------------------------------------------------------------- batch


@dataclass
class Batch:
    """A parsed block of rows, already in the form the model consumes."""

    labels: np.ndarray  # float32 [N]
    dense: np.ndarray  # float32 [N, 13]: log1p(max(x, 0)), empty -> 0
    sparse: np.ndarray  # int64 [N, 26]: categorical value decoded from hex, empty -> 0

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, start: int, stop: int) -> "Batch":
        """Rows ``[start, stop)`` as views (no copy)."""
        return Batch(self.labels[start:stop], self.dense[start:stop], self.sparse[start:stop])

    @staticmethod
    def empty() -> "Batch":
        return Batch(
            np.zeros(0, np.float32),
            np.zeros((0, NUM_DENSE), np.float32),
            np.zeros((0, NUM_SPARSE), np.int64),
        )

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        if not batches:
            return Batch.empty()
        if len(batches) == 1:
            return batches[0]
        return Batch(
            np.concatenate([b.labels for b in batches]),
            np.concatenate([b.dense for b in batches]),
            np.concatenate([b.sparse for b in batches]),
        )


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
    """``"tsv"`` or ``"parquet"``, from the file name; unknown extensions are refused
    rather than guessed, so a stray ``synth.json`` never gets parsed as data."""
    name = os.path.basename(path).lower()
    ext = os.path.splitext(name)[1]
    if ext in _PARQUET_EXTS:
        return "parquet"
    if ext in _TSV_EXTS:
        return "tsv"
    raise DataError(
        f"{path}: unknown data file extension {ext!r} "
        "(expected .tsv, .txt, .csv, .gz, .parquet, .pq or none)"
    )


def _is_data_name(path: str) -> bool:
    try:
        detect_format(path)
    except DataError:
        return False
    return not os.path.basename(path).startswith(".")


def _is_data_file(path: str) -> bool:
    return _is_data_name(path) and os.path.isfile(path)


def expand_paths(patterns: list[str]) -> list[str]:
    """Expand globs (and directories, to the data files inside them) into a sorted,
    deduplicated file list; a pattern that matches nothing is an error, since silently
    training on fewer files than asked for is worse than failing.

    A pattern may be an fsspec URL (``s3://bucket/day_*.tsv``); its files are listed
    as full URLs. ``file://`` URLs are local paths."""
    found: set[str] = set()
    for pattern in patterns:
        if is_url(pattern):
            urls = expand_url(pattern, _is_data_name)
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


def index_file(path: str, stride: int | None = None) -> FileIndex:
    """Count the rows (non-blank lines) of a file; for plain TSV also record a seek
    point every ``stride`` rows (default 4096, :data:`REMOTE_STRIDE` for a URL). Reads
    16 MiB blocks (streamed once from a store) and finds newlines with numpy."""
    remote = is_url(path)
    stride = stride if stride is not None else REMOTE_STRIDE if remote else 4096
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    fmt = detect_format(path)
    if not remote and not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if fmt == "parquet":  # the footer only: a ranged read at the end of the file
        import pyarrow.parquet as pq

        try:
            with open_ranged(path) if remote else open(path, "rb") as f:
                meta = pq.ParquetFile(f).metadata
        except DataError:
            raise
        except Exception as e:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        return FileIndex(path, fmt, int(meta.num_rows), None, stride, groups=groups)

    want_offsets = not path.lower().endswith(".gz")
    offsets: list[int] = []
    line_nos: list[int] = []
    rows = 0  # rows seen before `data`
    lines = 0  # physical lines seen before `data`
    pos = 0  # file offset of data[0]
    tail = b""
    with open_binary(path) as f:
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
        return FileIndex(path, fmt, rows, None, stride)
    return FileIndex(path, fmt, rows, offsets, stride, line_nos, size=pos + len(data))

