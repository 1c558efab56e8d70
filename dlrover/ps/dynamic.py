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
  ids waiting for admission with their sightings (at most as many as rows; when full, the
  least recently seen waiting id is forgotten). Being per-row state, the map moves and is
  saved with its rows by every existing path: migration's block and dirty-row copies,
  snapshots, restore, durable deltas.
- Time is a clock of training lookups on the PS; payloads carry ages (``clock - last``)
  instead, so a vshard that moves keeps its ids' ages (``to_ages`` / ``from_ages``).
- Lookups search sorted copies of the keys, updated by delete/insert as ids come and go.
- TorchRec's managed-collision modules and fbgemm's ZCH kernel do not fit a PS-owned,
  per-vshard map with counted admission (docs/ARCHITECTURE.md, "Dynamic tables").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dlrover.hashing import splitmix64
from dlrover.table_spec import Eviction, TableSpec

KEY, LAST, FREQ, PKEY, PLAST, PCOUNT = range(6)  # positions among the map states
MAP_STATES = 6  # int64 arrays appended to a dynamic table's states
_AGES = (LAST - MAP_STATES, PLAST - MAP_STATES)  # their positions counted from the end


def vshard_of(ids: np.ndarray, num_vshards: int) -> np.ndarray:
    """The vshard of each raw id of a dynamic table: splitmix64's finaliser, modulo V, so
    that sequential or structured ids spread evenly."""
    z = splitmix64(np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    return (z % np.uint64(num_vshards)).astype(np.int64)


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
    state changed (for dirty-row tracking); ``hits`` and ``admitted`` for the PS's stats."""

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
    """The sorted index less the keys ``gone``, plus ``new`` at ``new_pos``."""
    if len(gone) and len(keys):  # a binary search of the few keys gone, not a pass of isin over the index
        g = np.unique(gone)
        at = np.minimum(np.searchsorted(keys, g), len(keys) - 1)
        at = at[keys[at] == g]
        keys, pos = np.delete(keys, at), np.delete(pos, at)
    if len(new):
        o = np.argsort(new, kind="stable")
        at = np.searchsorted(keys, new[o])
        keys, pos = np.insert(keys, at, new[o]), np.insert(pos, at, new_pos[o])
    return keys, pos


class DynamicMap:
    """The id -> row map of one dynamic table on one PS: blocks of ``rpv`` positions, one
    per owned vshard, over the map states (shared with the caller's tensors)."""

    def __init__(self, states: list[torch.Tensor], rpv: int, valid: np.ndarray, table: TableSpec) -> None:
        self.states, self.rpv, self.table = states, rpv, table
        self.valid = np.asarray(valid, dtype=bool)  # padding positions hold nothing
        self._a = [s.numpy() for s in states]
        self.pins = np.zeros(len(self.valid), dtype=np.int32)  # pulled-but-not-pushed uses: never evicted
        self.reindex()

    @staticmethod
    def new_states(n: int) -> list[torch.Tensor]:
        return [torch.zeros(n, dtype=torch.int64) for _ in range(MAP_STATES)]

    def reindex(self) -> None:
        """Rebuild the key indexes from the states (after rows were copied in)."""
        a = self._a
        used = np.flatnonzero(a[FREQ] > 0)
        o = np.argsort(a[KEY][used], kind="stable")
        self._rk, self._rp = a[KEY][used][o], used[o]
        waiting = np.flatnonzero(a[PCOUNT] > 0)
        o = np.argsort(a[PKEY][waiting], kind="stable")
        self._pk, self._pp = a[PKEY][waiting][o], waiting[o]

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
        np.add.at(self.pins, rows[rows >= 0], by)

    def lookup(self, ids: np.ndarray, slots: np.ndarray, now: int | None) -> Lookup:
        """Rows of ``ids`` (each in block ``slots[i]``). ``now``: the PS clock of a training
        lookup, which counts sightings, admits and evicts; None: read only."""
        ids = np.asarray(ids, dtype=np.int64)
        none = np.zeros(0, dtype=np.int64)
        if now is None or not len(ids):
            return Lookup(_find(self._rk, self._rp, ids), none, none)
        a, rpv = self._a, self.rpv
        u, first, inv, cnt = np.unique(ids, return_index=True, return_inverse=True, return_counts=True)
        su = np.asarray(slots, dtype=np.int64)[first]
        rows_u = _find(self._rk, self._rp, u)
        hit = rows_u[rows_u >= 0]
        hits, admitted = int(cnt[rows_u >= 0].sum()), 0
        a[FREQ][hit] += cnt[rows_u >= 0]
        a[LAST][hit] = now
        pend = _find(self._pk, self._pp, u)
        prior = np.where(pend >= 0, a[PCOUNT][np.maximum(pend, 0)], 0)
        changed, evicted = [hit], []
        gone_r, new_r, new_rp, gone_p, new_p, new_pp = [], [], [], [], [], []
        miss = np.flatnonzero(rows_u < 0)
        for s in np.unique(su[miss]):
            base, block = s * rpv, slice(s * rpv, (s + 1) * rpv)
            mine = miss[su[miss] == s]  # ascending ids
            is_ready = prior[mine] >= self.table.admit_after
            ready = mine[is_ready]
            if len(ready):
                free = base + np.flatnonzero((a[FREQ][block] == 0) & self.valid[block])
                victims = self._victims(s, len(ready) - len(free), now)
                spots = np.concatenate([free, victims])[: len(ready)]
                took = ready[: len(spots)]
                admitted += len(took)
                out = spots[len(free) :]
                gone_r.append(a[KEY][out])
                evicted.append(out)
                a[KEY][spots], a[FREQ][spots], a[LAST][spots] = u[took], cnt[took], now
                new_r.append(u[took])
                new_rp.append(spots)
                rows_u[took] = spots
                was = pend[took][pend[took] >= 0]
                a[PCOUNT][was] = 0
                gone_p.append(a[PKEY][was])
                changed += [spots, was]
                left = np.ones(len(mine), dtype=bool)
                left[np.flatnonzero(is_ready)[: len(took)]] = False  # took: the first ready ones
                mine = mine[left]
            waiting = mine[pend[mine] >= 0]
            a[PCOUNT][pend[waiting]] += cnt[waiting]
            a[PLAST][pend[waiting]] = now
            changed.append(pend[waiting])
            fresh = mine[pend[mine] < 0]
            if len(fresh):
                spots, gone = self._waiting_room(s, len(fresh), now)
                gone_p.append(gone)
                a[PKEY][spots], a[PCOUNT][spots], a[PLAST][spots] = u[fresh[: len(spots)]], cnt[fresh[: len(spots)]], now
                new_p.append(u[fresh[: len(spots)]])
                new_pp.append(spots)
                changed.append(spots)
        cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else none  # noqa: E731
        self._rk, self._rp = _update(self._rk, self._rp, cat(gone_r), cat(new_r), cat(new_rp))
        self._pk, self._pp = _update(self._pk, self._pp, cat(gone_p), cat(new_p), cat(new_pp))
        return Lookup(rows_u[inv], cat(evicted), np.unique(cat(changed)), hits, admitted)

    def _victims(self, s: int, need: int, now: int) -> np.ndarray:
        """Up to ``need`` rows of block ``s`` to evict, by the table's policy. Rows looked up
        in this batch or held by a pulled-but-not-pushed batch are never taken."""
        if need <= 0:
            return np.zeros(0, dtype=np.int64)
        a, block = self._a, slice(s * self.rpv, (s + 1) * self.rpv)
        ok = (a[FREQ][block] > 0) & self.valid[block] & (self.pins[block] == 0) & (a[LAST][block] < now)
        if self.table.eviction == Eviction.TTL:
            ok &= now - a[LAST][block] > self.table.ttl_steps
        pos = np.flatnonzero(ok)
        last, freq = a[LAST][block][pos], a[FREQ][block][pos]
        order = np.lexsort((pos, last, freq) if self.table.eviction == Eviction.LFU else (pos, last))
        return s * self.rpv + pos[order][:need]

    def _waiting_room(self, s: int, need: int, now: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``need`` waiting-id positions of block ``s``: free ones first, then those of
        the least recently seen waiting ids (not seen in this batch), whose ids are returned
        as forgotten."""
        a, block = self._a, slice(s * self.rpv, (s + 1) * self.rpv)
        count = a[PCOUNT][block]
        free = np.flatnonzero((count == 0) & self.valid[block])
        if len(free) >= need:  # room enough: nobody is forgotten
            return s * self.rpv + free[:need].astype(np.int64), np.zeros(0, dtype=np.int64)
        taken = np.flatnonzero((count > 0) & (a[PLAST][block] < now))
        taken = taken[np.lexsort((taken, a[PLAST][block][taken]))][: max(0, need - len(free))]
        gone = a[PKEY][block][taken].copy()
        return s * self.rpv + np.concatenate([free[:need], taken]).astype(np.int64), gone
