"""Dynamic data sharding: a todo -> doing -> done queue of row ranges.

Workers pull small shards instead of owning a fixed 1/N of the data, so an elastic
job can add, lose or slow down workers without losing or double-counting rows: a
dead worker's leased shards simply go back to the front of the queue. This module is
pure bookkeeping (no Ray, injectable clock) so the master can persist it and tests
can drive it deterministically.

Shard ids are ``epoch * shards_per_epoch + k``, where ``k`` numbers the shards of one
epoch in file order; the shard for an id is recomputed on demand, so the state is a
few id lists rather than every shard of every epoch. A file may come with cut points
(the first rows of its Parquet row groups) that no shard spans, so a shard's read
fetches one row group. The lease books (:class:`Leases`) are shared with the queue of
a Ray Data stream's blocks (:mod:`dlrover.data.blocks`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

_STATE_VERSION = 2


@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of file ``path`` in epoch ``epoch``. ``skipped``: lines of
    the shard trained before ``start`` (a shard resumed where a checkpoint or a dead
    worker's progress left it); batches are counted from the shard's first line."""

    shard_id: int
    epoch: int
    path: str
    start: int
    stop: int
    skipped: int = 0
    block: Any = None  # a ray_data job's: the block's ObjectRef (``path`` names it); files: None

    @property
    def rows(self) -> int:
        return self.stop - self.start


def split_rows(rows: int, shard_rows: int, cuts: Iterable[int] = ()) -> list[tuple[int, int]]:
    """Rows ``[0, rows)`` as ranges of at most ``shard_rows``, none spanning a cut."""
    edges = sorted({0, rows, *(c for c in cuts if 0 < c < rows)})
    return [(lo, min(lo + shard_rows, b)) for a, b in zip(edges, edges[1:]) for lo in range(a, b, shard_rows)]


class Leases:
    """Who is working on which shard: the todo -> doing -> done books every shard queue keeps.

    ``next`` moves a shard todo -> doing (leased to an owner); ``done`` moves it to
    done; ``requeue_owner`` puts an owner's leased shards back at the front of todo.
    A lease is renewed by its owner's progress (``renew``); one not renewed within the
    liveness timeout is ``expired``: its owner is hung and the master takes it back.
    Subclasses say where a shard's rows are (``_bounds``) and refill todo (``_refill``).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._todo: deque[int] = deque()
        self._doing: dict[int, tuple[str, float]] = {}  # id -> (owner, lease start or last renewal)
        self._done: dict[int, tuple[str, int]] = {}  # id -> (owner, rows trained)
        # Shards whose first rows are already in the model (a checkpoint was cut while they
        # were half trained): id -> (lines, rows) trained. Leasing one hands out the rest.
        self._offset: dict[int, tuple[int, int]] = {}
        self._progress: dict[int, tuple[int, int]] = {}  # leased shard -> (lines, rows) applied of the lease
        self._samples_done = 0
        # Bad lines inside trained prefixes (offsets, a dead worker's progress): the worker
        # that finishes such a shard reports only the lines it read itself.
        self.prefix_bad_lines = 0

    def _bounds(self, shard_id: int) -> tuple[int, str, int, int, Any]:
        """(epoch, path, start, stop, block) of a shard, offsets not applied; ValueError for an unknown id."""
        raise NotImplementedError

    def _refill(self) -> None:
        """todo ran dry: put the next shards in it, if there are any yet."""

    def shard(self, shard_id: int) -> Shard:
        """The shard with this id (from its offset on); ValueError for an unknown id."""
        epoch, path, start, stop, block = self._bounds(shard_id)
        lines = min(self._offset.get(shard_id, (0, 0))[0], stop - start)
        return Shard(shard_id, epoch, path, start + lines, stop, lines, block)

    # -- transitions -------------------------------------------------------------

    def next(self, owner: str) -> Shard | None:
        """Lease the next todo shard to ``owner``; None when nothing is left to hand
        out (shards may still be in progress elsewhere)."""
        if not self._todo:
            self._refill()
        if not self._todo:
            return None
        shard_id = self._todo.popleft()
        self._doing[shard_id] = (owner, self.clock())
        return self.shard(shard_id)

    def done(self, shard_id: int, owner: str, rows_trained: int) -> None:
        """Mark a leased shard done. A repeated report from the same owner is ignored
        (RPC retries); a report from anyone not holding the lease is a ValueError."""
        if shard_id in self._done:
            if self._done[shard_id][0] != owner:
                raise ValueError(f"shard {shard_id} was completed by {self._done[shard_id][0]!r}, "
                                 f"not {owner!r}")
            return
        lease = self._doing.get(shard_id)
        if lease is None or lease[0] != owner:
            holder = f"leased to {lease[0]!r}" if lease else "not leased"
            raise ValueError(f"shard {shard_id} is {holder}, not by {owner!r}")
        rows = self.shard(shard_id).rows
        if not 0 <= rows_trained <= rows:
            raise ValueError(f"rows_trained {rows_trained} outside 0..{rows} for shard {shard_id}")
        del self._doing[shard_id]
        self._progress.pop(shard_id, None)
        lines, rows = self._offset.pop(shard_id, (0, 0))
        self.prefix_bad_lines += lines - rows
        rows_trained = int(rows_trained) + rows
        self._done[shard_id] = (owner, rows_trained)
        self._samples_done += rows_trained

    def requeue_owner(self, owner: str) -> list[Shard]:
        """Return a dead or removed worker's leased shards to the front of todo (in the
        order they were leased) so they are redone first, each from where its reported
        ``progress`` left it (one it had wholly applied is done); returns those requeued."""
        ids = sorted((i for i, (o, _) in self._doing.items() if o == owner),
                     key=lambda i: self._doing[i][1])
        back = []
        for shard_id in reversed(ids):
            lines, rows = self._progress.get(shard_id, (0, 0))
            if lines and lines >= self.shard(shard_id).rows:
                self.prefix_bad_lines += lines - rows
                self.done(shard_id, owner, rows)
                continue
            del self._doing[shard_id]
            self._progress.pop(shard_id, None)
            if lines:
                base = self._offset.get(shard_id, (0, 0))
                self._offset[shard_id] = (base[0] + lines, base[1] + rows)
            self._todo.appendleft(shard_id)
            back.insert(0, shard_id)
        return [self.shard(i) for i in back]

    def progress(self, shard_id: int, owner: str, lines: int, rows: int) -> None:
        """The leaseholder applied the first ``lines`` lines (``rows`` rows) of its lease:
        a replacement resumes after them. A report of anyone else is ignored (a late
        call of a worker that is gone)."""
        lease = self._doing.get(shard_id)
        if lease is None or lease[0] != owner:
            return
        left = self.shard(shard_id)
        if not (0 <= rows <= lines <= left.rows):
            raise ValueError(f"progress ({lines} lines, {rows} rows) outside shard {shard_id}'s {left.rows} lines")
        if lines >= self._progress.get(shard_id, (0, 0))[0]:  # calls may arrive out of order
            self._progress[shard_id] = (int(lines), int(rows))

    def renew(self, owner: str) -> None:
        """``owner`` showed progress: its leases start counting again from now."""
        now = self.clock()
        for shard_id, (o, _) in self._doing.items():
            if o == owner:
                self._doing[shard_id] = (o, now)

    def expired(self, timeout_s: float) -> list[str]:
        """Owners holding a lease not renewed for ``timeout_s`` (hung or frozen workers),
        oldest lease first. The caller decides what to do with them (``requeue_owner``)."""
        now = self.clock()
        stale: dict[str, float] = {}
        for owner, since in self._doing.values():
            if now - since > timeout_s:
                stale[owner] = min(since, stale.get(owner, since))
        return sorted(stale, key=stale.__getitem__)

    # -- progress ----------------------------------------------------------------

    @property
    def doing_count(self) -> int:
        return len(self._doing)

    @property
    def done_count(self) -> int:
        return len(self._done)

    @property
    def samples_done(self) -> int:
        return self._samples_done

    def lease_ages(self) -> dict[int, float]:
        """Seconds since each leased shard's lease was taken or last renewed."""
        now = self.clock()
        return {i: now - since for i, (_, since) in self._doing.items()}

    def doing_owners(self) -> dict[int, str]:
        """Owner per leased shard."""
        return {i: owner for i, (owner, _) in self._doing.items()}


class ShardQueue(Leases):
    """Hands out the shards of files epoch by epoch (their books: :class:`Leases`).
    Epoch ``e + 1`` is opened only when every epoch-``e`` shard has been handed out,
    so epochs never interleave except for requeued stragglers, which go first.
    """

    def __init__(
        self,
        files: list[tuple[str, int]],
        shard_rows: int,
        epochs: int,
        shuffle_seed: int | None = 0,
        clock: Callable[[], float] = time.monotonic,
        cuts: dict[str, list[int]] | None = None,
    ) -> None:
        super().__init__(clock)
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        if shuffle_seed is not None and shuffle_seed < 0:
            raise ValueError(f"shuffle_seed must be >= 0 or None, got {shuffle_seed}")
        self.files = [(str(path), int(rows)) for path, rows in files]
        if any(rows < 0 for _, rows in self.files):
            raise ValueError("file row counts must be >= 0")
        self.shard_rows = int(shard_rows)
        self.epochs = int(epochs)
        self.shuffle_seed = shuffle_seed
        self.cuts = {str(p): sorted({int(c) for c in cs}) for p, cs in (cuts or {}).items() if cs}
        # One epoch's shards in file order: (file index, start, stop).
        self._ranges = [
            (f, lo, hi)
            for f, (path, rows) in enumerate(self.files)
            for lo, hi in split_rows(rows, self.shard_rows, self.cuts.get(path, ()))
        ]
        self._opened = 0  # epochs whose shards have been put in todo

    # -- shards ----------------------------------------------------------------

    @property
    def shards_per_epoch(self) -> int:
        return len(self._ranges)

    @property
    def total_shards(self) -> int:
        return self.shards_per_epoch * self.epochs

    def _bounds(self, shard_id: int) -> tuple[int, str, int, int, Any]:
        if not 0 <= shard_id < self.total_shards:
            raise ValueError(f"unknown shard id {shard_id}")
        epoch, k = divmod(shard_id, self.shards_per_epoch)
        f, start, stop = self._ranges[k]
        return epoch, self.files[f][0], start, stop, None

    def _epoch_order(self, epoch: int) -> list[int]:
        n = self.shards_per_epoch
        order = np.arange(n)
        if self.shuffle_seed is not None:
            order = np.random.default_rng([self.shuffle_seed, epoch]).permutation(n)
        return (epoch * n + order).tolist()

    def _refill(self) -> None:
        while not self._todo and self._opened < self.epochs:
            self._todo.extend(self._epoch_order(self._opened))
            self._opened += 1

    # -- progress ----------------------------------------------------------------

    @property
    def todo_count(self) -> int:
        """Shards not leased yet, including those of epochs not opened yet."""
        return len(self._todo) + (self.epochs - self._opened) * self.shards_per_epoch

    @property
    def finished(self) -> bool:
        return self.done_count == self.total_shards

    @property
    def epoch(self) -> int:
        """The newest epoch handed out so far (0 before the first ``next``)."""
        return max(self._opened - 1, 0)

    @property
    def samples_expected(self) -> int:
        return sum(rows for _, rows in self.files) * self.epochs

    def applied_lines(self, shard_id: int) -> int:
        """Lines of a shard the model holds with nothing leased: all of a done one, the
        offset of a half-trained one, else none."""
        f, start, stop = self._ranges[shard_id % self.shards_per_epoch]
        if shard_id in self._done:
            return stop - start
        if shard_id in self._doing:
            raise ValueError(f"shard {shard_id} is leased: its applied lines are not known here")
        return self._offset.get(shard_id, (0, 0))[0]

    def lines_since(self, before: "ShardQueue") -> list[tuple[str, int, int]]:
        """(path, first line, stop) of every line trained here and not in ``before`` (an
        earlier cut of the same job), both with nothing leased."""
        out = []
        for i in range(self.total_shards):
            a, b = before.applied_lines(i), self.applied_lines(i)
            if b > a:
                f, start, _ = self._ranges[i % self.shards_per_epoch]
                out.append((self.files[f][0], start + a, start + b))
        return out

    def cut(self, trained: dict[int, tuple[int, int]]) -> dict:
        """The state to roll back to for a checkpoint taken now, with every worker parked.

        ``trained``: for leased shards, the (lines, rows) already applied to the model.
        In the returned state no shard is leased: a fully trained one is done, any other
        goes back to the front of todo with its trained part as an offset, so a rollback
        neither loses nor repeats a row the checkpoint holds.
        """
        state = self.state_dict()
        done = {int(i): [owner, rows] for i, owner, rows in state["done"]}
        offsets = {int(i): list(v) for i, v in state["offsets"]}
        back = []
        for i, owner, _age in sorted(state["doing"], key=lambda d: -d[2]):  # oldest lease first
            lines, rows = trained.get(int(i), (0, 0))
            base = self._offset.get(int(i), (0, 0))
            lines, rows = lines + base[0], rows + base[1]
            f, start, stop = self._ranges[int(i) % self.shards_per_epoch]
            if lines >= stop - start:
                done[int(i)] = [owner, rows]
                offsets.pop(int(i), None)
                state["prefix_bad_lines"] += lines - rows
            else:
                if lines:
                    offsets[int(i)] = [lines, rows]
                back.append(int(i))
        state["doing"] = []
        state["done"] = [[i, o, r] for i, (o, r) in done.items()]
        state["todo"] = back + list(state["todo"])
        state["offsets"] = [[i, v] for i, v in offsets.items()]
        return state

    # -- persistence -------------------------------------------------------------

    def state_dict(self) -> dict:
        """JSON-serialisable state. Lease times are stored as ages, since clock values
        (monotonic) mean nothing in another process."""
        now = self.clock()
        return {
            "version": _STATE_VERSION,
            "files": [[p, r] for p, r in self.files],
            "shard_rows": self.shard_rows,
            "epochs": self.epochs,
            "shuffle_seed": self.shuffle_seed,
            "cuts": self.cuts,
            "opened": self._opened,
            "todo": list(self._todo),
            "doing": [[i, owner, now - since] for i, (owner, since) in self._doing.items()],
            "done": [[i, owner, rows] for i, (owner, rows) in self._done.items()],
            "offsets": [[i, list(v)] for i, v in self._offset.items()],
            "prefix_bad_lines": self.prefix_bad_lines,
        }

    @classmethod
    def from_state_dict(cls, d: dict, clock: Callable[[], float] = time.monotonic) -> "ShardQueue":
        if d.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported ShardQueue state version {d.get('version')!r}")
        q = cls([(p, r) for p, r in d["files"]], d["shard_rows"], d["epochs"],
                d["shuffle_seed"], clock, d.get("cuts"))
        now = clock()
        q._opened = int(d["opened"])
        q._todo = deque(int(i) for i in d["todo"])
        q._doing = {int(i): (str(owner), now - float(age)) for i, owner, age in d["doing"]}
        q._done = {int(i): (str(owner), int(rows)) for i, owner, rows in d["done"]}
        q._offset = {int(i): (int(v[0]), int(v[1])) for i, v in d.get("offsets", [])}
        q._samples_done = sum(rows for _, rows in q._done.values())
        q.prefix_bad_lines = int(d.get("prefix_bad_lines", 0))
        return q
