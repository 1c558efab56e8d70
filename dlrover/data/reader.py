"""Reading row ranges (shards) of Criteo data files, whatever their format."""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np

from dlrover.data.criteo import Batch, FileIndex, line_bounds
from dlrover.data.parquet import read_parquet
from dlrover.data.tsv import check_on_bad_line, parse_buffer, read_whole_tsv
from dlrover.errors import DataError


class FileReader:
    """Reads row ranges [start, stop) of data files; on_bad_line: 'fail' | 'skip'.

    Plain TSV is read by seeking to the nearest indexed row, so a read costs about
    the rows asked for. ``.gz`` and Parquet files are parsed whole once and kept in
    an LRU of ``cache_files`` files, because they cannot be seeked by row. Bad lines
    are then remembered, so 'fail' raises only for a range that contains one, exactly
    as for plain TSV.
    """

    def __init__(self, on_bad_line: str = "fail", cache_files: int = 2) -> None:
        check_on_bad_line(on_bad_line)
        self.on_bad_line = on_bad_line
        self.cache_files = max(0, int(cache_files))
        self._cache: OrderedDict[str, tuple[Batch, np.ndarray, list[str]]] = OrderedDict()

    def read(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        """Rows [start, stop) of ``index.path`` (rows = non-blank lines, 0-based);
        returns (batch of the good rows, number of bad lines skipped)."""
        if not 0 <= start <= stop <= index.rows:
            raise ValueError(f"rows [{start}, {stop}) outside 0..{index.rows} of {index.path}")
        if start == stop:
            return Batch.empty(), 0
        if index.fmt == "tsv" and index.offsets is not None:
            return self._read_seek(index, start, stop)
        batch, bad, reasons = self._whole(index)
        # `bad` holds file row ordinals of bad rows; map file rows to batch rows.
        first_bad, end_bad = np.searchsorted(bad, [start, stop])
        if end_bad > first_bad and self.on_bad_line == "fail":
            raise DataError(reasons[int(first_bad)])
        lo, hi = start - int(first_bad), stop - int(end_bad)
        return batch.slice(lo, hi), int(end_bad - first_bad)

    def _whole(self, index: FileIndex) -> tuple[Batch, np.ndarray, list[str]]:
        key = os.path.abspath(index.path)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if index.fmt == "parquet":
            raw, bad, reasons = read_parquet(index.path)
        else:
            raw, bad, reasons = read_whole_tsv(index.path, "skip")
        if len(raw.labels) + len(bad) != index.rows:
            raise DataError(
                f"{index.path}: has {len(raw.labels) + len(bad)} rows but was indexed with "
                f"{index.rows}; was it modified during the job?"
            )
        entry = (raw.batch(), bad, reasons)
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
        try:
            size = os.path.getsize(index.path)
            f = open(index.path, "rb")
        except FileNotFoundError:
            raise DataError(f"{index.path}: no such file") from None
        with f:
            f.seek(index.offsets[k])
            per_row = size / max(index.rows, 1)
            want = int(need * per_row * 1.1) + (64 << 10)
            data = f.read(want)
            while True:
                at_eof = len(data) >= size - index.offsets[k]
                starts, ends, is_row = line_bounds(data, at_eof)
                row_lines = np.flatnonzero(is_row)
                if len(row_lines) >= need or at_eof:
                    break
                more = f.read(max(want, len(data)))
                if not more:
                    at_eof = True
                    size = index.offsets[k] + len(data)
                    continue
                data += more
        if len(row_lines) < need:
            raise DataError(
                f"{index.path}: ends before row {stop} it was indexed with; "
                "was it modified during the job?"
            )
        first, last = int(row_lines[skip]), int(row_lines[need - 1])
        chunk = data[int(starts[first]) : int(ends[last])]
        raw, bad, _ = parse_buffer(chunk, index.path, line0 + first + 1, self.on_bad_line)
        return raw.batch(), len(bad)
