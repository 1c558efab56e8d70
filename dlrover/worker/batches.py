"""What flows through a worker: a batch on its way (``Step``), the books of a shard it
holds (``ShardProgress``), and the reading of a shard's rows (of a file, or of a Ray Data
block) as batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dlrover.data.batch import Batch
from dlrover.data.criteo import FileIndex
from dlrover.data.layout import DataLayout
from dlrover.data.ray_source import block_rows
from dlrover.data.reader import FileReader, pick_rows
from dlrover.data.shards import Shard
from dlrover.model.dlrm import make_kjt
from dlrover.ps.applied import BatchId


@dataclass
class Step:
    """One batch on its way through the worker (``shard`` is None when evaluating)."""

    shard: Shard | None
    batch: Batch
    last_of_shard: bool
    bad_lines: int = 0
    batch_id: BatchId | None = None  # its updates carry it (applied at most once)
    kjt: Any = None
    routed: Any = None  # the batch split by owning PS, computed on the input thread
    dense: torch.Tensor | None = None
    labels: torch.Tensor | None = None


@dataclass
class ShardProgress:
    """A held shard's books. ``refs``: its pushes, which must all be applied before the
    shard is reported done ("done" means "applied"); rows and lines feed checkpoint cuts.
    ``pending``: per batch not known applied yet, (lines, rows) after it and its pushes;
    ``applied``: (lines, rows) of the prefix whose pushes every PS acknowledged, what the
    master resumes the shard from if this worker dies."""

    shard: Shard
    rows: int = 0
    bad_lines: int = 0
    refs: list[Any] = field(default_factory=list)
    pending: deque = field(default_factory=deque)
    applied: tuple[int, int] = (0, 0)

    def add(self, rows: int, bad_lines: int, refs: list[Any]) -> None:
        self.rows += rows
        self.bad_lines += bad_lines
        self.refs.extend(refs)
        self.pending.append((self.rows + self.bad_lines, self.rows, refs))

    def advance(self, ready: Callable[[list[Any]], bool]) -> bool:
        """Move ``applied`` past the batches whose pushes are all ``ready``; True if it moved."""
        moved = False
        while self.pending and ready(self.pending[0][2]):
            lines, rows, _ = self.pending.popleft()
            self.applied, moved = (lines, rows), True
        return moved


def batches_of(reader: FileReader, index: FileIndex, start: int, stop: int, batch_size: int) -> Iterator[tuple[Batch, int, bool]]:
    """Read rows [start, stop) of a file as batches of ``batch_size`` (last one shorter),
    each with its count of skipped lines and whether it is the last."""
    for a in range(start, stop, batch_size):
        batch, bad = reader.read(index, a, min(stop, a + batch_size))
        yield batch, bad, a + batch_size >= stop


def block_batches(block: Any, shard: Shard, layout: DataLayout, on_bad_line: str, batch_size: int) -> Iterator[tuple[Batch, int, bool]]:
    """A ray_data shard's rows (``shard.start`` to ``shard.stop`` of a Ray Data block) as
    batches, as ``batches_of`` reads a file's: parsed once, then cut."""
    rows = block_rows(block, layout, shard.path, shard.start, shard.stop)
    for a in range(0, shard.rows, batch_size):
        batch, bad = pick_rows(rows, a, min(shard.rows, a + batch_size), on_bad_line)
        yield batch, bad, a + batch_size >= shard.rows


def with_tensors(step: Step, keys: list[str]) -> Step:
    """Fill in the model's inputs (KJT keyed by the schema's ``keys``, dense features,
    labels) from the step's batch."""
    b = step.batch
    step.kjt = make_kjt(b, keys)
    step.dense = torch.from_numpy(b.dense)
    step.labels = torch.from_numpy(b.labels)
    return step
