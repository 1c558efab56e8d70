"""Which batches a parameter server applied: every update carries the id of its batch, and
a server applies a given id at most once.

A worker that dies mid-shard has pushed some of the shard's batches; its replacement
resumes from the last progress the worker reported, so it may push a batch again. The
server that already applied it skips it (and says so); one that had not applies it. So
each batch updates each server exactly once, whatever the worker failed to report.

Memory is bounded: per shard, the length of the contiguous prefix of batches applied and
the indices above it (a server that got no row of some batch never closes that gap, so
at most the shard's batches); a shard is forgotten once the master has it done.
"""

from __future__ import annotations

from typing import NamedTuple


class BatchId(NamedTuple):
    """A batch of the job: its shard (ids are unique across epochs) and its index in the
    shard, counted from the shard's first line."""

    shard: int
    index: int


class AppliedLog:
    def __init__(self) -> None:
        self._prefix: dict[int, int] = {}  # shard -> batches 0..n-1 all applied
        self._above: dict[int, set[int]] = {}  # shard -> applied indices past the prefix

    def first_time(self, batch: BatchId) -> bool:
        """Record ``batch`` as applied; False if it was already (skip the update)."""
        prefix = self._prefix.get(batch.shard, 0)
        above = self._above.setdefault(batch.shard, set())
        if batch.index < prefix or batch.index in above:
            return False
        above.add(batch.index)
        while prefix in above:
            above.discard(prefix)
            prefix += 1
        self._prefix[batch.shard] = prefix
        return True

    def forget(self, shards: list[int]) -> None:
        """These shards are done: no batch of theirs can come again."""
        for s in shards:
            self._prefix.pop(s, None)
            self._above.pop(s, None)

    def clear(self) -> None:
        """Back to a checkpoint: batches after its cut will be pushed again and must apply."""
        self._prefix.clear()
        self._above.clear()

    def entries(self) -> int:
        """What the log holds (shards plus indices above their prefixes): its memory."""
        return len(self._prefix) + sum(len(a) for a in self._above.values())
