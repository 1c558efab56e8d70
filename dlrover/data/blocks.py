"""The shard queue of a Ray Data stream (``data.source: ray_data``): blocks come in as
the Dataset streams, each cut into shards of ``data.shard_rows`` rows, and each is held
(pinned: the queue keeps its ObjectRef) until every one of its shards is done.

At most ``max_blocks`` blocks are pinned at once: the master's feed asks ``room()``
before it takes the next block from the stream, so Ray Data backpressures the rest and
the object store holds a bounded window of the data whatever its size. A dead worker's
shards go back to todo as in the files' queue, and their block is still pinned: the
replacement reads the same rows from the same ref, nothing is recomputed. Pure
bookkeeping (no Ray: a ref is an opaque value here), clock injectable, as
:mod:`dlrover.data.shards`, whose lease books (:class:`Leases`) it shares.

Shard ids number the stream's shards in the order they came, over all epochs; a block
released is forgotten, so the state is the pinned window plus the done ids.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from dlrover.data.shards import Leases, Shard, split_rows


@dataclass(frozen=True)
class Block:
    """Rows ``[start, stop)`` of one block of the stream (a Ray Data bundle may hand out a
    slice of a block) and what the master counted in them: the ids of their good rows and
    the bags cut to ``max_len`` (what the PS must apply; 0 for Criteo's layout)."""

    ref: Any
    start: int
    stop: int
    ids: int = 0
    long_bags: int = 0

    @property
    def rows(self) -> int:
        return self.stop - self.start


class BlockShardQueue(Leases):
    """Shards of the blocks added so far; ``finished`` once the stream ``ended`` and
    every shard is done."""

    def __init__(self, shard_rows: int, epochs: int, max_blocks: int, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        if shard_rows < 1 or epochs < 1 or max_blocks < 1:
            raise ValueError(f"shard_rows, epochs and max_blocks must be >= 1, got {shard_rows}, {epochs}, {max_blocks}")
        self.shard_rows, self.epochs, self.max_blocks = int(shard_rows), int(epochs), int(max_blocks)
        self._pinned: dict[int, Block] = {}  # block number -> block, until its shards are done
        self._left: dict[int, int] = {}  # block number -> its shards not done yet
        self._shards: dict[int, tuple[int, int, int, int]] = {}  # shard id -> (block, epoch, start, stop), of pinned blocks
        self._blocks = 0  # blocks added
        self._shard_count = 0  # shards cut
        self._rows = 0  # rows added (ints, not a dict: progress reads them from another thread)
        self._first_epoch_rows = 0
        self._epoch = 0  # the newest epoch a block came in for
        self.ids = 0  # ids in the blocks added (their good rows)
        self.long_bags = 0
        self.ended = False

    # -- the stream ----------------------------------------------------------------

    def room(self) -> bool:
        """Another block may be pinned."""
        return len(self._pinned) < self.max_blocks

    def add(self, epoch: int, block: Block) -> list[Shard]:
        """Pin ``block`` of ``epoch`` and queue its shards at the back of todo; returns them.
        A block without rows pins nothing."""
        if self.ended:
            raise ValueError("the stream has ended: no block may be added")
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} outside 0..{self.epochs - 1}")
        n = self._blocks
        self._blocks += 1
        self._rows += block.rows
        self._first_epoch_rows += block.rows if epoch == 0 else 0
        self._epoch = max(self._epoch, epoch)
        self.ids, self.long_bags = self.ids + block.ids, self.long_bags + block.long_bags
        ranges = split_rows(block.rows, self.shard_rows)
        if not ranges:
            return []
        self._pinned[n], self._left[n] = block, len(ranges)
        ids = range(self._shard_count, self._shard_count + len(ranges))
        self._shard_count += len(ranges)
        for shard_id, (a, b) in zip(ids, ranges):
            self._shards[shard_id] = (n, epoch, block.start + a, block.start + b)
        self._todo.extend(ids)
        return [self.shard(i) for i in ids]

    def end(self) -> None:
        """The stream ended: no more blocks, in any epoch."""
        self.ended = True

    # -- shards --------------------------------------------------------------------

    def _bounds(self, shard_id: int) -> tuple[int, str, int, int, Any]:
        if shard_id not in self._shards:
            raise ValueError(f"unknown shard id {shard_id} (or its block was released)")
        n, epoch, start, stop = self._shards[shard_id]
        return epoch, f"block {n}", start, stop, self._pinned[n].ref

    def done(self, shard_id: int, owner: str, rows_trained: int) -> None:
        """As :meth:`Leases.done`; a block whose last shard this was is released."""
        repeated = shard_id in self._done
        super().done(shard_id, owner, rows_trained)
        if repeated:
            return
        n = self._shards.pop(shard_id)[0]
        self._left[n] -= 1
        if not self._left[n]:
            del self._left[n], self._pinned[n]

    # -- progress ------------------------------------------------------------------

    @property
    def todo_count(self) -> int:
        """Shards queued and not leased (blocks still to come are not known yet)."""
        return len(self._todo)

    @property
    def finished(self) -> bool:
        return self.ended and self.done_count == self._shard_count

    @property
    def epoch(self) -> int:
        """The newest epoch a block came in for (0 before the first)."""
        return self._epoch

    @property
    def samples_expected(self) -> int:
        """Rows of the blocks added; before the stream ended, at least the first epoch's
        rows times the epochs once that epoch is complete (the progress shown)."""
        if self.ended or self._epoch == 0:
            return self._rows
        return max(self._rows, self._first_epoch_rows * self.epochs)

    def cut(self, trained: dict[int, tuple[int, int]]) -> dict:
        """A checkpoint's record of the stream, every worker parked: the done shards and,
        as offsets, the (lines, rows) trained of the leased ones (``trained``). A stream
        is never restored from it (its trained blocks are gone): it counts what the
        checkpoint holds (``held_samples``)."""
        offsets = dict(self._offset)
        for i in self._doing:
            lines, rows = trained.get(i, (0, 0))
            base = offsets.get(i, (0, 0))
            if lines:
                offsets[i] = (base[0] + lines, base[1] + rows)
        return {
            "version": "blocks",
            "done": [[i, owner, rows] for i, (owner, rows) in self._done.items()],
            "offsets": [[i, list(v)] for i, v in offsets.items()],
            "prefix_bad_lines": self.prefix_bad_lines,
        }
