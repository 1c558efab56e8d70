"""The job's data: files with their row counts, split into training and held-out rows."""

from __future__ import annotations

from dataclasses import dataclass

from dlrover.data.criteo import FileIndex, expand_paths, index_file
from dlrover.errors import DataError
from dlrover.spec import JobSpec


@dataclass
class DataPlan:
    """Files with their row counts, split into training and held-out rows."""

    files: dict[str, FileIndex]
    train_rows: dict[str, int]

    @classmethod
    def build(cls, spec: JobSpec) -> "DataPlan":
        files = {p: index_file(p) for p in expand_paths(spec.data.paths)}
        if spec.data.format != "auto":
            for p, idx in files.items():
                if idx.fmt != spec.data.format:
                    raise DataError(f"{p}: looks like {idx.fmt} (by its extension) but data.format is {spec.data.format}")
        train = {p: idx.rows - int(idx.rows * spec.data.eval_fraction) for p, idx in files.items()}
        if not any(train.values()):  # else the job would "succeed" having trained nothing
            rows, n = sum(idx.rows for idx in files.values()), len(files)
            raise DataError(
                f"data.paths: {', '.join(spec.data.paths)}: no training rows ({rows} rows in {n} file{'s' if n > 1 else ''}, "
                f"data.eval_fraction {spec.data.eval_fraction:g})"
            )
        return cls(files, train)

    def eval_ranges(self, shard_rows: int) -> list[tuple[str, int, int]]:
        out = []
        for p, idx in self.files.items():
            for a in range(self.train_rows[p], idx.rows, shard_rows):
                out.append((p, a, min(idx.rows, a + shard_rows)))
        return out
