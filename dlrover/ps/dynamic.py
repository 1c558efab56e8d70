"""Collision-free dynamic tables: raw 64-bit ids -> rows, kept by the PS owning each id's vshard.

Design.
- Routing: a dynamic table's id goes to vshard ``splitmix64(id) % V`` (a hashed table's to
  ``(id % N) % V``); the worker sends the raw id and the owning PS maps it to a row.
- Rows: a dynamic table has ``capacity_rows`` TBE rows laid out as a hashed table's are
  (:mod:`dlrover.ps.vshard`), so each vshard holds a fixed block of them: a vshard's
  capacity is its block, a PS's capacity the blocks of the vshards it owns.
- The map of a block is six int64 arrays aligned with its rows (``MAP_STATES``), appended
  to the table's ``[weights, *optimizer states]``: the id in each row, when it was last
  looked up and how often (``freq`` 0: the row is free), and, in the same positions, the
  ids waiting for admission with their sightings. The waiting room is direct-mapped: an
  id waits at one position of its block, chosen by its hash (``wait_position``), and a
  new id forgets the one waiting there unless that one was seen in the same batch. Being
  per-row state, the map moves and is saved with its rows by every existing path:
  migration's block and dirty-row copies, snapshots, restore, durable deltas.
- Time is a clock of training lookups on the PS; payloads carry ages (``clock - last``)
  instead, so a vshard that moves keeps its ids' ages (``to_ages`` / ``from_ages``).
- Lookups search a sorted copy of the admitted keys, updated by delete/insert as ids come
  and go, in one group-wise pass over the blocks holding misses (docs/decisions/).
- TorchRec's managed-collision modules and fbgemm's ZCH kernel do not fit a PS-owned,
  per-vshard map with counted admission (docs/ARCHITECTURE.md, "Dynamic tables").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from dlrover.hashing import splitmix64
from dlrover.table_spec import Eviction, TableSpec

KEY, LAST, FREQ, PKEY, PLAST, PCOUNT = range(6)  # positions among the map states
MAP_STATES = 6  # int64 arrays appended to a dynamic table's states
_AGES = (LAST - MAP_STATES, PLAST - MAP_STATES)  # their positions counted from the end


def _mix(ids: np.ndarray) -> np.ndarray:
    return splitmix64(np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15))


def vshard_of(ids: np.ndarray, num_vshards: int) -> np.ndarray:
    """The vshard of each raw id of a dynamic table: splitmix64's finaliser, modulo V, so
    that sequential or structured ids spread evenly."""
    return (_mix(ids) % np.uint64(num_vshards)).astype(np.int64)


def wait_position(ids: np.ndarray, slots: np.ndarray, rpv: int, rows_in_block: np.ndarray) -> np.ndarray:
    """Where each id waits for admission: a position among the rows of its block
    (``rows_in_block[slot]``, a block's padding being its last positions), from the hash's
    high bits, which the vshard (its low bits modulo V) leaves independent."""
    slots = np.asarray(slots, dtype=np.int64)
    n = np.maximum(rows_in_block[slots], 1).astype(np.uint64)
    return slots * rpv + ((_mix(ids) >> np.uint64(32)) % n).astype(np.int64)


def to_ages(states: list, clock: int) -> list:
    """A table's states for a payload: the map's times as ages on a PS at ``clock``. The
    same function turns a payload's ages back into times on the PS receiving it."""
    out = list(states)
    for i in _AGES:
        out[i] = clock - np.asarray(states[i])
    return out


@dataclass
class Lookup:
    """What one lookup did: ``rows`` per id (-1: not admitted, reads the default row),
    ``evicted`` rows to reset to their initial values, ``changed`` positions whose map
    state changed (for dirty-row tracking; a position may repeat); ``hits`` and ``admitted`` for the PS's stats."""

    rows: np.ndarray
    evicted: np.ndarray
    changed: np.ndarray
    hits: int = 0  # ids looked up that had a row before this lookup
    admitted: int = 0  # ids given a row by it


def _find(keys: np.ndarray, pos: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Position of each id in a sorted key index, -1 where absent."""
    i = np.minimum(np.searchsorted(keys, ids), max(len(keys) - 1, 0))
    hit = (keys[i] == ids) if len(keys) else np.zeros(len(ids), dtype=bool)
    return np.where(hit, pos[i] if len(keys) else -1, -1)


def _update(keys: np.ndarray, pos: np.ndarray, gone: np.ndarray, new: np.ndarray, new_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted index less the keys ``gone`` (distinct), plus ``new`` (distinct) at ``new_pos``."""
    if len(gone) and len(keys):  # a binary search of the few keys gone, not a pass of isin over the index
        gone = np.sort(gone)  # sorted queries search several times faster
        at = np.minimum(np.searchsorted(keys, gone), len(keys) - 1)
        at = at[keys[at] == gone]
        keys, pos = np.delete(keys, at), np.delete(pos, at)
    if len(new):
        o = np.argsort(new)
        at = np.searchsorted(keys, new[o])
        keys, pos = np.insert(keys, at, new[o]), np.insert(pos, at, new_pos[o])
    return keys, pos


def _distinct(ids: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct ids ascending, the index of each id among them, their counts, their
    blocks. ``np.unique``'s counts and inverse take a stable sort, several times slower."""
    o = np.argsort(ids)
    s = ids[o]
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    u, starts = s[new], np.flatnonzero(new)
    inv = np.empty(len(ids), dtype=np.int64)
    inv[o] = np.cumsum(new) - 1  # a search of unsorted ids would be several times slower
    su = np.empty(len(u), dtype=np.int64)
    su[inv] = slots  # an id's block is the same at every occurrence
    return u, inv, np.diff(np.append(starts, len(s))), su


class DynamicMap:
    """The id -> row map of one dynamic table on one PS: blocks of ``rpv`` positions, one
    per owned vshard, over the map states (shared with the caller's tensors)."""

    def __init__(self, states: list[torch.Tensor], rpv: int, valid: np.ndarray, table: TableSpec) -> None:
        self.states, self.rpv, self.table = states, rpv, table
        self.valid = np.asarray(valid, dtype=bool)  # padding positions hold nothing
        self._a = [s.numpy() for s in states]
        self.pins = np.zeros(len(self.valid), dtype=np.int32)  # pulled-but-not-pushed uses: never evicted
        blocks = len(self.valid) // rpv  # a PS owning no vshard still has a 1-row table
        self.rows_in_block = self.valid[: blocks * rpv].reshape(blocks, rpv).sum(axis=1)
        self.reindex()

    @staticmethod
    def new_states(n: int) -> list[torch.Tensor]:
        return [torch.zeros(n, dtype=torch.int64) for _ in range(MAP_STATES)]

    def reindex(self) -> None:
        """Rebuild the key index from the states (after rows were copied in)."""
        a = self._a
        used = np.flatnonzero(a[FREQ] > 0)
        o = np.argsort(a[KEY][used], kind="stable")
        self._rk, self._rp = a[KEY][used][o], used[o]

    def ids(self) -> np.ndarray:
        """The admitted ids, ascending."""
        return self._rk.copy()

    def admitted(self) -> tuple[np.ndarray, np.ndarray]:
        """The admitted ids, ascending, and the position (local row) of each."""
        return self._rk.copy(), self._rp.copy()

    def shift_times(self, slots: np.ndarray, by: int) -> None:
        """Move the times of blocks ``slots`` by ``by`` (a precopied block whose ages were
        taken against another clock than the one they are now read against)."""
        pos = (np.asarray(slots, dtype=np.int64)[:, None] * self.rpv + np.arange(self.rpv)).ravel()
        self._a[LAST][pos] += by
        self._a[PLAST][pos] += by

    def pin(self, rows: np.ndarray, by: int) -> None:
        rows = rows[rows >= 0]
        if len(self.pins) <= 8 * len(rows):  # a count over the table beats add.at's scatter
            self.pins += (by * np.bincount(rows, minlength=len(self.pins))).astype(np.int32)
        else:
            np.add.at(self.pins, rows, by)

    def lookup(self, ids: np.ndarray, slots: np.ndarray, now: int | None) -> Lookup:
        """Rows of ``ids`` (each in block ``slots[i]``). ``now``: the PS clock of a training
        lookup, which counts sightings, admits and evicts; None: read only.

        One pass over all blocks holding misses, as a grid of their positions: in each
        block the ids ready for admission (ascending) take its free rows, then its
        victims'; the others wait, each at its own position (``wait_position``)."""
        ids = np.asarray(ids, dtype=np.int64)
        none = np.zeros(0, dtype=np.int64)
        if now is None or not len(ids):
            return Lookup(_find(self._rk, self._rp, ids), none, none)
        a = self._a
        u, inv, cnt, su = _distinct(ids, np.asarray(slots, dtype=np.int64))
        rows_u = _find(self._rk, self._rp, u)
        found = rows_u >= 0
        hit = rows_u[found]
        a[FREQ][hit] += cnt[found]
        a[LAST][hit] = now
        miss = np.flatnonzero(~found)
        order = np.sort(su[miss] * len(u) + miss)  # by block, then id
        miss, su = order % len(u), order // len(u)
        step = np.diff(su, prepend=-1) != 0
        g = _Grid(su[step], np.cumsum(step) - 1, self.rpv, self.valid)
        at = wait_position(u[miss], su, self.rpv, self.rows_in_block)
        pend = np.where((a[PKEY][at] == u[miss]) & (a[PCOUNT][at] > 0), at, -1)
        admitted, spots, evicted, was = self._admit(g, miss, pend, u, cnt, now)
        rows_u[miss[admitted]] = spots
        left = ~admitted
        seen = pend[left & (pend >= 0)]
        a[PCOUNT][seen] += cnt[miss[left & (pend >= 0)]]
        a[PLAST][seen] = now
        waits = self._wait(at[left & (pend < 0)], miss[left & (pend < 0)], u, cnt, now)
        return Lookup(rows_u[inv], evicted, np.concatenate([hit, spots, was, seen, waits]), int(cnt[found].sum()), len(spots))

    def _admit(self, g: "_Grid", miss: np.ndarray, pend: np.ndarray, u: np.ndarray, cnt: np.ndarray, now: int) -> tuple[np.ndarray, ...]:
        """Rows for the ready misses: which misses got one, the rows, the rows evicted for
        them, and the waiting positions they leave."""
        a = self._a
        ready = np.where(pend >= 0, a[PCOUNT][np.maximum(pend, 0)], 0) >= self.table.admit_after
        took, cells, out = _place(g.row[ready], g.valid & (g.of(a[FREQ]) == 0), lambda: self._victim_key(g, now))
        spots, evicted = g.pos[cells], g.pos[out]
        admitted = np.zeros(len(miss), dtype=bool)
        admitted[np.flatnonzero(ready)[took]] = True
        ids = u[miss[admitted]]
        gone = a[KEY][evicted]
        a[KEY][spots], a[FREQ][spots], a[LAST][spots] = ids, cnt[miss[admitted]], now
        self._rk, self._rp = _update(self._rk, self._rp, gone, ids, spots)
        was = pend[admitted]
        was = was[was >= 0]
        a[PCOUNT][was] = 0
        return admitted, spots, evicted, was

    def _wait(self, at: np.ndarray, miss: np.ndarray, u: np.ndarray, cnt: np.ndarray, now: int) -> np.ndarray:
        """Misses not waiting yet (ascending in each block) wait at their positions ``at``,
        unless an id seen in this batch waits there; the first one in takes a position
        shared in the batch. Returns the positions taken."""
        a = self._a
        _, first = np.unique(at, return_index=True)
        first = first[(a[PCOUNT][at[first]] == 0) | (a[PLAST][at[first]] < now)]
        waits = at[first]
        a[PKEY][waits], a[PCOUNT][waits], a[PLAST][waits] = u[miss[first]], cnt[miss[first]], now
        return waits

    def _victim_key(self, g: "_Grid", now: int) -> np.ndarray:
        """The eviction order of the grid's rows: rows looked up in this batch or held by
        a pulled-but-not-pushed batch are never taken."""
        freq, last = g.of(self._a[FREQ]), g.of(self._a[LAST])
        ok = (freq > 0) & g.valid & (g.of(self.pins) == 0) & (last < now)
        if self.table.eviction == Eviction.TTL:
            ok &= now - last > self.table.ttl_steps
        return _order_key([freq, last] if self.table.eviction == Eviction.LFU else [last], ok)


class _Grid:
    """The positions of the blocks a lookup touches, one row of the grid per block;
    ``row``: each miss's grid row."""

    def __init__(self, blocks: np.ndarray, row: np.ndarray, rpv: int, valid: np.ndarray) -> None:
        self.shape, self.row = (len(blocks), rpv), row
        self.pos = (blocks[:, None] * rpv + np.arange(rpv)).ravel()
        self.valid = self.of(valid)

    def of(self, state: np.ndarray) -> np.ndarray:
        """A per-position array's values on the grid."""
        return state[self.pos].reshape(self.shape)


NOT_A_CANDIDATE = np.iinfo(np.int64).max


def _order_key(parts: list[np.ndarray], ok: np.ndarray) -> np.ndarray:
    """One int64 per cell of a grid ordering its ``ok`` cells by ``parts`` (most
    significant first), then by column; ``NOT_A_CANDIDATE`` elsewhere. Mixed radix when
    the product of the ranges fits, else ranks from a lexsort."""
    width = ok.shape[1]
    parts = [p - p.min() for p in parts] + [np.broadcast_to(np.arange(width), ok.shape)]
    spans = [int(p.max()) + 1 for p in parts]
    if np.prod([float(x) for x in spans]) < 2.0**62:
        key = parts[0]
        for p, span in zip(parts[1:], spans[1:]):
            key = key * span + p
        return np.where(ok, key, NOT_A_CANDIDATE)
    out = np.full(ok.shape, NOT_A_CANDIDATE, dtype=np.int64)
    cells = [p[ok] for p in parts]
    rank = np.empty(len(cells[0]), dtype=np.int64)
    rank[np.lexsort(cells[::-1])] = np.arange(len(rank))
    out[ok] = rank
    return out


def _place(row: np.ndarray, free: np.ndarray, key: Callable[[], np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Items grouped by grid ``row`` (ascending) onto cells of the grid: in each row the
    ``free`` columns first (ascending), then those of the smallest ``key()`` (computed
    only when some row is short). Returns which items got a cell, their flat cells, and
    the flat cells taken from others, in each row's key order."""
    width = free.shape[1]
    want = np.bincount(row, minlength=len(free))
    n_free = free.sum(axis=1)
    need = np.maximum(want - n_free, 0)
    k = int(need.max(initial=0))
    if k:
        keys = key()
        k = min(k, width)
        part = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < width else np.broadcast_to(np.arange(width), keys.shape)
        vals = np.take_along_axis(keys, part, axis=1)
        o = np.argsort(vals, axis=1)
        cols, vals = np.take_along_axis(part, o, axis=1), np.take_along_axis(vals, o, axis=1)
        vr, vj = np.nonzero((np.arange(k) < need[:, None]) & (vals != NOT_A_CANDIDATE))
        taken_cells = vr * width + cols[vr, vj]
    else:
        vr, taken_cells = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rank = np.arange(len(row)) - np.searchsorted(row, row)
    fr, fc = np.nonzero(free)
    f_at = np.cumsum(n_free) - n_free
    n_taken = np.bincount(vr, minlength=len(free))
    t_at = np.cumsum(n_taken) - n_taken
    spare = rank - n_free[row]
    in_free, in_taken = spare < 0, (spare >= 0) & (spare < n_taken[row])
    cells = np.zeros(len(row), dtype=np.int64)
    cells[in_free] = row[in_free] * width + fc[f_at[row[in_free]] + rank[in_free]]
    cells[in_taken] = taken_cells[t_at[row[in_taken]] + spare[in_taken]]
    got = in_free | in_taken
    return got, cells[got], taken_cells.astype(np.int64)
