"""The dynamic tables of one PS (:mod:`dlrover.ps.dynamic`): raw ids in, TBE rows out.

A pull's table-major request carries raw ids for dynamic tables. ``translate`` maps them
to local rows under one lock (the maps are shared by the PS's threads), -1 for the ids
not admitted; ``dlrover.ps.layout`` leaves those out of the TBE batch and ``defaults``
gives what they add to the pooled output: the default row is a constant outside the
TBE, so it is never updated.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from dlrover.ps.dynamic import DynamicMap, Lookup, to_ages, vshard_of
from dlrover.ps.vshard import VShardMap
from dlrover.table_spec import TableSpec


def default_row(seed: int, table: int, num_rows: int, dim: int) -> torch.Tensor:
    """The constant row every unadmitted id of a dynamic table reads (same on every PS)."""
    bound = (1.0 / num_rows) ** 0.5
    g = torch.Generator().manual_seed(((seed * 7919 + table) << 20) - 1)  # no row block uses -1
    return torch.empty(dim).uniform_(-bound, bound, generator=g)


@dataclass
class Translated:
    """A request's ids with the dynamic tables' mapped to local rows (-1: not admitted);
    ``pins``, ``changed``: local rows per dynamic table."""

    rows: np.ndarray
    pins: dict[int, np.ndarray] = field(default_factory=dict)
    changed: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class DynamicCounts:
    """What a PS's dynamic tables did in training lookups since it started (all tables):
    the evidence of whether capacity and admission fit the data."""

    lookups: int = 0  # ids looked up (each occurrence)
    hits: int = 0  # of those, ids that had a row already
    defaults: int = 0  # of those, ids not admitted: they read the default row
    admitted: int = 0  # ids given a row
    evicted: int = 0  # rows taken from the id that held them

    def add(self, ids: int, got: Lookup) -> None:
        self.lookups += ids
        self.hits += got.hits
        self.defaults += int((got.rows < 0).sum())
        self.admitted += got.admitted
        self.evicted += len(got.evicted)


class DynamicTables:
    """The id maps of a PS's dynamic tables under one layout (``vmap``); ``clock`` counts
    the PS's training lookups and carries over to the next layout, as ``counts`` does."""

    def __init__(self, vmap: VShardMap, ps_index: int, tables: dict[int, TableSpec], seed: int, dim: int, clock: int = 0, counts: DynamicCounts | None = None) -> None:
        self.vmap, self.clock, self.dim = vmap, clock, dim
        self.counts = counts if counts is not None else DynamicCounts()
        sizes, rpv = vmap.local_table_sizes(ps_index), vmap.rows_per_vshard()
        self.maps: dict[int, DynamicMap] = {}
        for t in sorted(tables):
            valid = np.zeros(sizes[t], dtype=bool)
            rows = vmap.global_rows(ps_index, t)
            valid[: len(rows)] = rows >= 0
            self.maps[t] = DynamicMap(DynamicMap.new_states(sizes[t]), rpv[t], valid, tables[t])
        self.default = {t: default_row(seed, t, vmap.table_sizes[t], dim) for t in self.maps}
        self._slot = np.full(vmap.num_vshards, -1, dtype=np.int64)
        owned = vmap.owned(ps_index)
        self._slot[owned] = vmap.slot[owned]
        self._lock = threading.Lock()

    def states(self, t: int) -> list[torch.Tensor]:
        """The map states of table ``t`` (none for a hashed table)."""
        return self.maps[t].states if t in self.maps else []

    def translate(self, indices: np.ndarray, spans: np.ndarray, train: bool, reset: Callable[[int, np.ndarray], None]) -> Translated:
        """Map the raw ids of the dynamic tables in a request (table ``t``'s ids are
        ``indices[spans[t]:spans[t + 1]]``, see ``dlrover.ps.layout.table_spans``) to local
        rows, -1 for an id not admitted. ``reset(table, rows)`` puts evicted rows back to
        their initial state, under the lock, before any lookup can hand them to another
        batch."""
        idx = indices.copy()
        out = Translated(idx)
        slots = {t: self._slot[vshard_of(idx[spans[t] : spans[t + 1]], self.vmap.num_vshards)] for t in self.maps}
        for t, s in slots.items():  # before anything changes: a refused batch leaves no trace
            if np.any(s < 0):
                raise ValueError(f"table {t}: ids of vshards this PS does not own")
        with self._lock:
            now = None
            if train:
                self.clock += 1
                now = self.clock
            for t, m in self.maps.items():
                ids = idx[spans[t] : spans[t + 1]]
                got = m.lookup(ids, slots[t], now)
                if train:
                    self.counts.add(len(ids), got)
                idx[spans[t] : spans[t + 1]] = got.rows
                if len(got.evicted):
                    reset(t, got.evicted)
                if train:
                    m.pin(got.rows, 1)
                    out.pins[t] = got.rows
                out.changed[t] = got.changed
        return out

    def defaults(self, dropped: np.ndarray, bag_table: np.ndarray) -> torch.Tensor:
        """``[num_bags, D]``: what the ids not admitted add to each bag (``dropped`` of them
        in a bag of table ``bag_table``): their table's default row each."""
        rows = torch.zeros(len(self.vmap.table_sizes), self.dim)
        for t, row in self.default.items():
            rows[t] = row
        return torch.from_numpy(dropped).to(torch.float32).unsqueeze(1) * rows[torch.from_numpy(bag_table)]

    def unpin(self, pins: dict[int, np.ndarray]) -> None:
        """The batch that pinned these rows was pushed (or dropped): they may be evicted."""
        with self._lock:
            for t, rows in pins.items():
                self.maps[t].pin(rows, -1)

    def clear_pins(self) -> None:
        """No batch is in flight any more (a switch staged with the workers parked)."""
        with self._lock:
            for m in self.maps.values():
                m.pins[:] = 0

    def shift_times(self, slots: np.ndarray, by: int) -> None:
        """Move the lookup and sighting times of blocks ``slots`` by ``by`` lookups."""
        for m in self.maps.values():
            m.shift_times(slots, by)

    def reindex(self) -> None:
        for m in self.maps.values():
            m.reindex()

    def ids(self, t: int) -> np.ndarray:
        """The admitted ids of dynamic table ``t`` on this PS, ascending."""
        return self.maps[t].ids()

    def admitted(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The admitted ids of dynamic table ``t`` (ascending) and their local rows."""
        with self._lock:
            return self.maps[t].admitted()

    def as_ages(self, tables: list, dirty: bool = False) -> list:
        """A payload's per-table states (``dirty``: ``(positions, states)`` pairs) with the
        map's times as ages on this PS, or, applied to a payload received, back to times."""
        out = list(tables)
        for t in self.maps:
            out[t] = (tables[t][0], to_ages(tables[t][1], self.clock)) if dirty else to_ages(tables[t], self.clock)
        return out
