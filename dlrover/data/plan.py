"""The job's data: files with their row counts, split into training and held-out rows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from dlrover.data.criteo import FileIndex, index_file
from dlrover.data.layout import DataLayout
from dlrover.data.reader import FileReader, data_files
from dlrover.data.shards import ShardQueue, split_rows
from dlrover.errors import DataError
from dlrover.spec import JobSpec


@dataclass
class DataPlan:
    """Files (local paths or URLs) with their row counts, split into training and
    held-out rows."""

    files: dict[str, FileIndex]
    train_rows: dict[str, int]

    @classmethod
    def build(cls, spec: JobSpec) -> "DataPlan":
        layout = spec.layout()
        files = {p: index_file(p, layout=layout) for p in data_files(spec.data.paths, layout)}
        train = {p: idx.rows - int(idx.rows * spec.data.eval_fraction) for p, idx in files.items()}
        if not any(train.values()):  # else the job would "succeed" having trained nothing
            rows, n = sum(idx.rows for idx in files.values()), len(files)
            raise DataError(
                f"data.paths: {', '.join(spec.data.paths)}: no training rows ({rows} rows in {n} file{'s' if n > 1 else ''}, "
                f"data.eval_fraction {spec.data.eval_fraction:g})"
            )
        return cls(files, train)

    def cuts(self) -> dict[str, list[int]]:
        """First rows of the Parquet row groups of each file: no shard spans one, so a
        shard's read fetches the row groups it covers and nothing more."""
        out = {}
        for p, idx in self.files.items():
            if idx.groups and len(idx.groups) > 1:
                starts, row = [], 0
                for n in idx.groups[:-1]:
                    row += n
                    starts.append(row)
                out[p] = starts
        return out

    def shard_queue(self, spec: JobSpec, clock: Callable[[], float] = time.monotonic) -> ShardQueue:
        """The training rows as the job's shard queue (row groups cut, seed-shuffled)."""
        return ShardQueue(
            list(self.train_rows.items()),
            shard_rows=spec.data.shard_rows,
            epochs=spec.data.epochs,
            shuffle_seed=spec.seed if spec.data.shuffle else None,
            clock=clock,
            cuts=self.cuts(),
        )

    def training_ids(self, layout: DataLayout, read_rows: int = 65_536) -> tuple[int, int]:
        """(ids, bags cut to max_len) in one epoch's training rows, as the readers count
        them (bad lines skipped): what the PS must have applied, epoch after epoch."""
        if layout.criteo and layout.format != "torchrec_npy":  # one id per feature and row, always (a missing value is id 0)
            return -1, 0
        reader, ids, cut = FileReader(on_bad_line="skip", cache_files=0, layout=layout), 0, 0
        for path, rows in self.train_rows.items():
            for a in range(0, rows, read_rows):
                batch, _ = reader.read(self.files[path], a, min(rows, a + read_rows))
                ids, cut = ids + batch.num_ids, cut + batch.long_bags
        return ids, cut

    def expected_ids(self, layout: DataLayout, epochs: int) -> tuple[int, int]:
        """``training_ids`` over ``epochs`` epochs: what the PS must have applied in the job
        (-1 ids: Criteo's layout, one per feature and row)."""
        ids, cut = self.training_ids(layout)
        return (ids if ids < 0 else ids * epochs), cut * epochs

    def ids_per_sample(self, layout: DataLayout, rows: int = 8192) -> float:
        """Mean ids a training row carries, what the PS's work per sample grows with (the
        performance model's ``k``), from the first ``rows`` training rows of the first file;
        Criteo's own layout has one per sparse feature, known without reading."""
        if layout.criteo and layout.format != "torchrec_npy":
            return float(len(layout.schema.sparse))
        path = next((p for p, n in self.train_rows.items() if n > 0), None)
        if path is not None:
            reader = FileReader(on_bad_line="skip", cache_files=0, layout=layout)
            batch, _ = reader.read(self.files[path], 0, min(rows, self.train_rows[path]))
            if len(batch):
                return batch.num_ids / len(batch)
        return float(layout.schema.max_ids_per_sample())

    def eval_ranges(self, shard_rows: int) -> list[tuple[str, int, int]]:
        out = []
        cuts = self.cuts()
        for p, idx in self.files.items():
            first = self.train_rows[p]
            tail = split_rows(idx.rows - first, shard_rows, [c - first for c in cuts.get(p, [])])
            out += [(p, first + a, first + b) for a, b in tail]
        return out
