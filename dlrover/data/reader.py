"""Reading row ranges (shards) of data files, whatever their format and wherever they
are (a local path or an fsspec URL), into batches as the job's :class:`DataLayout` says."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from dlrover.data.columns import empty_rows, table_to_rows
from dlrover.data.batch import Batch
from dlrover.data.criteo import FileIndex, expand_paths, line_bounds, open_binary, read_bytes
from dlrover.data.delimited import parse_delimited
from dlrover.data.layout import CRITEO_LAYOUT, DataLayout
from dlrover.data.npy import NpyDay, npy_days
from dlrover.data.parquet import open_parquet, read_row_group
from dlrover.data.remote import read_range, size_of
from dlrover.paths import is_url
from dlrover.data.tsv import check_on_bad_line, parse_buffer, read_whole_tsv
from dlrover.errors import DataError

Rows = tuple[Batch, np.ndarray, list[str]]  # good rows, ordinals of the bad ones, why


def data_files(patterns: list[str], layout: DataLayout) -> list[str]:
    """The files (for ``torchrec_npy``: the days) that ``data.paths`` name."""
    return npy_days(patterns) if layout.format == "torchrec_npy" else expand_paths(patterns)


def pick_rows(rows: Rows, start: int, stop: int, on_bad_line: str) -> tuple[Batch, int]:
    """Rows [start, stop) of parsed rows (ordinals counting bad rows too): (the good ones,
    how many were bad); with 'fail', a bad one among them is raised."""
    batch, bad, reasons = rows
    # `bad` holds row ordinals of bad rows; map them to batch rows.
    first_bad, end_bad = np.searchsorted(bad, [start, stop])
    if end_bad > first_bad and on_bad_line == "fail":
        raise DataError(reasons[int(first_bad)])
    lo, hi = start - int(first_bad), stop - int(end_bad)
    return batch.slice(lo, hi), int(end_bad - first_bad)


class FileReader:
    """Reads row ranges [start, stop) of data files; on_bad_line: 'fail' | 'skip'.

    Plain TSV is read by seeking to the nearest indexed row (for a URL: one ranged
    request from there), so a read costs about the rows asked for. Parquet is read by
    row group, ``.gz`` whole, since neither can be seeked by row; what was parsed is
    kept in an LRU of ``cache_files`` entries (row groups or whole files). Bad lines
    are then remembered, so 'fail' raises only for a range that contains one, exactly
    as for plain TSV.
    """

    def __init__(self, on_bad_line: str = "fail", cache_files: int = 2, layout: DataLayout = CRITEO_LAYOUT) -> None:
        check_on_bad_line(on_bad_line)
        self.on_bad_line = on_bad_line
        self.layout = layout
        self.cache_files = max(0, int(cache_files))
        self._cache: OrderedDict[tuple[str, int], Rows] = OrderedDict()
        self._parquet: OrderedDict[str, Any] = OrderedDict()  # open Parquet files (footers read)
        self._days: OrderedDict[str, NpyDay] = OrderedDict()  # memory-mapped .npy days

    def read(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        """Rows [start, stop) of ``index.path`` (rows = non-blank lines, 0-based);
        returns (batch of the good rows, number of bad lines skipped)."""
        if not 0 <= start <= stop <= index.rows:
            raise ValueError(f"rows [{start}, {stop}) outside 0..{index.rows} of {index.path}")
        if start == stop:
            return empty_rows(self.layout)[0], 0
        if index.fmt in ("tsv", "csv") and index.offsets is not None:
            return self._read_seek(index, start, stop)
        if index.fmt == "parquet" and index.groups is not None:
            return self._read_groups(index, start, stop)
        if index.fmt == "npy":
            return self._read_day(index, start, stop)
        return pick_rows(self._whole(index), start, stop, self.on_bad_line)

    def _read_groups(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        """Rows [start, stop) of a Parquet file from the row groups they fall in."""
        assert index.groups is not None
        bounds = np.concatenate([[0], np.cumsum(index.groups)]).astype(int)
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        parts, skipped = [], 0
        for g in range(first, len(index.groups)):
            lo, hi = int(bounds[g]), int(bounds[g + 1])
            if lo >= stop:
                break
            rows = self._cached((index.path, g), index.groups[g], lambda: self._group(index.path, g, lo))
            batch, bad = pick_rows(rows, max(start, lo) - lo, min(stop, hi) - lo, self.on_bad_line)
            parts.append(batch)
            skipped += bad
        return Batch.concat(parts) if parts else empty_rows(self.layout)[0], skipped

    def _read_day(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        if index.path not in self._days:
            self._days[index.path] = NpyDay.open(index.path)
            while len(self._days) > 4:
                self._days.popitem(last=False)
        day = self._days[index.path]
        if day.rows != index.rows:
            raise DataError(f"{index.path}: has {day.rows} rows but was indexed with {index.rows}; was it modified during the job?")
        batch, bad, reasons = day.read(self.layout, start, stop)
        if len(bad) and self.on_bad_line == "fail":
            raise DataError(reasons[0])
        return batch, len(bad)

    def _group(self, path: str, group: int, first_row: int) -> Rows:
        if path not in self._parquet:
            self._parquet[path] = open_parquet(path, None if self.layout.criteo else self.layout.required_columns)
            while len(self._parquet) > 2:
                self._parquet.popitem(last=False)
        if self.layout.criteo:
            raw, bad, reasons = read_row_group(self._parquet[path], path, group, first_row)
            return raw.batch(), bad, reasons
        try:
            table = self._parquet[path].read_row_group(group, columns=self.layout.required_columns)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
        return table_to_rows(table, self.layout, path, lambda o: [f"{path}:{first_row + int(i) + 1}" for i in o])

    def _whole(self, index: FileIndex) -> Rows:
        def load() -> Rows:
            if index.fmt == "csv":
                with open_binary(index.path) as f:
                    data = read_bytes(f, index.path)
                at, lines = index.head
                return parse_delimited(data[at:], index.path, lines + 1, index.columns or [], self.layout)
            raw, bad, reasons = read_whole_tsv(index.path, "skip")
            return raw.batch(), bad, reasons

        path = index.path if is_url(index.path) else os.path.abspath(index.path)
        return self._cached((path, -1), index.rows, load)

    def _cached(self, key: tuple[str, int], rows: int, load: Callable[[], Rows]) -> Rows:
        """``load()`` (checked to hold ``rows`` rows, good and bad), or its cached result."""
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        entry = load()
        if len(entry[0]) + len(entry[1]) != rows:
            raise DataError(
                f"{key[0]}: has {len(entry[0]) + len(entry[1])} rows but was indexed with "
                f"{rows}; was it modified during the job?"
            )
        if self.cache_files:
            self._cache[key] = entry
            while len(self._cache) > self.cache_files:
                self._cache.popitem(last=False)
        return entry

    def _read_seek(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        assert index.offsets is not None
        k = start // index.stride
        skip = start - k * index.stride
        need = skip + (stop - start)
        line0 = index.line_nos[k] if index.line_nos is not None else k * index.stride
        offset = index.offsets[k]
        if is_url(index.path):  # one ranged request per read (more only if rows run long)
            size = index.size if index.size is not None else size_of(index.path)

            def fetch(at: int, n: int) -> bytes:
                return read_range(index.path, at, min(at + n, size))

            data, starts, ends, row_lines = _scan(fetch, offset, size, index.rows, need)
        else:
            try:
                size = os.path.getsize(index.path)
                f = open(index.path, "rb")
            except FileNotFoundError:
                raise DataError(f"{index.path}: no such file") from None
            with f:
                f.seek(offset)
                data, starts, ends, row_lines = _scan(lambda _, n: f.read(n), offset, size, index.rows, need)
        if len(row_lines) < need:
            raise DataError(
                f"{index.path}: ends before row {stop} it was indexed with; "
                "was it modified during the job?"
            )
        first, last = int(row_lines[skip]), int(row_lines[need - 1])
        chunk = data[int(starts[first]) : int(ends[last])]
        if index.fmt == "csv":
            batch, bad, reasons = parse_delimited(chunk + b"\n", index.path, line0 + first + 1, index.columns or [], self.layout)
            if len(bad) and self.on_bad_line == "fail":
                raise DataError(reasons[0])
            return batch, len(bad)
        raw, bad, _ = parse_buffer(chunk, index.path, line0 + first + 1, self.on_bad_line)
        return raw.batch(), len(bad)


def _scan(
    fetch: Callable[[int, int], bytes], offset: int, size: int, rows: int, need: int
) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """Bytes from ``offset`` until they hold ``need`` rows (or the file ends), fetched
    in sequential pieces by ``fetch(at, n)``, with their line bounds and row lines.
    The first piece is sized from the file's bytes per row, so it is usually the only one."""
    want = int(need * size / max(rows, 1) * 1.1) + (64 << 10)
    data = fetch(offset, want) if offset < size else b""
    while True:
        at_eof = len(data) >= size - offset
        starts, ends, is_row = line_bounds(data, at_eof)
        row_lines = np.flatnonzero(is_row)
        if len(row_lines) >= need or at_eof:
            return data, starts, ends, row_lines
        more = fetch(offset + len(data), max(want, len(data)))
        if not more:
            size = offset + len(data)  # shorter than when indexed: at_eof next round
            continue
        data += more
