"""The shard queue of a followed stream of files (``data.follow``): files are appended as
they arrive, each trained exactly once, their shards queued in arrival order.

It is the files' queue (:class:`~dlrover.data.shards.ShardQueue`) with one epoch that
grows: a shard's id is its place in that epoch, so cuts, rollbacks, partial recovery's
``lines_since`` and the state dict work unchanged. A restored queue (a rollback, a
restarted master) knows the files of its cut; files that arrived after the cut are
appended again by the master's follower (``has`` tells which).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from dlrover.data.shards import ShardQueue, split_rows


class FollowQueue(ShardQueue):
    """``add_file`` appends a file's shards (shuffled within the file by the seed);
    ``end`` says no file will come; ``finished`` once ended and every shard is done."""

    def __init__(
        self,
        files: list[tuple[str, int]],
        shard_rows: int,
        epochs: int = 1,
        shuffle_seed: int | None = 0,
        clock: Callable[[], float] = time.monotonic,
        cuts: dict[str, list[int]] | None = None,
    ) -> None:
        if epochs != 1:
            raise ValueError(f"a followed stream trains each file once, got epochs={epochs}")
        super().__init__([], shard_rows, 1, shuffle_seed, clock)
        self._opened = 1  # todo is filled by add_file, never by epochs
        self.ended = False
        self._paths: set[str] = set()
        for path, rows in files:
            self.add_file(path, rows, (cuts or {}).get(str(path), ()))

    def has(self, path: str) -> bool:
        return path in self._paths

    def add_file(self, path: str, rows: int, cuts: list[int] | tuple[int, ...] = ()) -> int:
        """Queue a new file's rows (split at ``cuts``, its row groups); returns its shards."""
        if self.ended:
            raise ValueError("the stream has ended: no file may be added")
        if path in self._paths:
            raise ValueError(f"{path}: already in the queue")
        if rows < 0:
            raise ValueError("file row counts must be >= 0")
        f, first = len(self.files), len(self._ranges)
        self.files.append((str(path), int(rows)))
        self._paths.add(str(path))
        if cuts:
            self.cuts[str(path)] = sorted({int(c) for c in cuts})
        self._ranges += [(f, lo, hi) for lo, hi in split_rows(rows, self.shard_rows, self.cuts.get(str(path), ()))]
        order = np.arange(first, len(self._ranges))
        if self.shuffle_seed is not None:
            order = np.random.default_rng([self.shuffle_seed, f]).permutation(order)
        self._todo.extend(order.tolist())
        return len(order)

    def end(self) -> None:
        """No more files: the job ends once their shards are done."""
        self.ended = True

    def _refill(self) -> None:
        """Nothing to open: files come through ``add_file``."""

    @property
    def finished(self) -> bool:
        return self.ended and self.done_count == self.total_shards

    @property
    def todo_count(self) -> int:
        return len(self._todo)

    def applied_lines(self, shard_id: int) -> int:
        """As the files' queue; a shard of a file that came after this queue's cut: none."""
        return super().applied_lines(shard_id) if shard_id < self.total_shards else 0

    def oldest_open(self) -> str | None:
        """The first-queued file with rows not trained yet (None: all trained)."""
        open_files = self._open_files()
        return self.files[min(open_files)][0] if open_files else None

    def _open_files(self) -> set[int]:
        return {self._ranges[i][0] for i in range(self.total_shards) if i not in self._done}

    def trained_files(self) -> list[str]:
        """Files every shard of which is done, in arrival order (a version's watermark)."""
        open_files = self._open_files()
        return [p for f, (p, _) in enumerate(self.files) if f not in open_files]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "ended": self.ended}

    @classmethod
    def from_state_dict(cls, d: dict, clock: Callable[[], float] = time.monotonic) -> "FollowQueue":
        q = super().from_state_dict(d, clock)
        q.ended = bool(d.get("ended", False))
        return q
