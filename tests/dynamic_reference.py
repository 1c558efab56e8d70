"""A dict-based model of the dynamic-table map rules (:mod:`dlrover.ps.dynamic`), the
local reference that the tests check the vectorised map and the PS against."""

from __future__ import annotations

from collections import Counter

import numpy as np

from dlrover.ps.dynamic import wait_position


class ReferenceMap:
    """A dynamic table's map rules, one id at a time over dicts (no sorting, no numpy):
    blocks of ``rpv`` positions (``valid``: positions that are rows), one per vshard."""

    def __init__(self, valid: np.ndarray, rpv: int, admit_after: int, eviction: str, ttl: int | None) -> None:
        self.valid, self.rpv, self.admit, self.eviction, self.ttl = valid, rpv, admit_after, eviction, ttl
        self.rows: dict[int, list[int]] = {}  # position -> [id, last, freq]
        self.wait: dict[int, list[int]] = {}  # position -> [id, last, count]
        self.rows_in_block = np.asarray(valid, dtype=bool)[: len(valid) // rpv * rpv].reshape(-1, rpv).sum(axis=1)

    def _where(self, table: dict, x: int) -> int | None:
        return next((p for p, e in table.items() if e[0] == x), None)

    def lookup(self, ids: list[int], block_of: dict[int, int], now: int) -> tuple[dict[int, int], list[int]]:
        """The position of each id (-1: default row) and the positions evicted."""
        out, counts, evicted = {}, Counter(ids), []
        for x, n in counts.items():
            p = self._where(self.rows, x)
            if p is not None:
                self.rows[p][1], self.rows[p][2], out[x] = now, self.rows[p][2] + n, p
        for s in sorted({block_of[x] for x in counts if x not in out}):
            positions = [p for p in range(s * self.rpv, (s + 1) * self.rpv) if self.valid[p]]
            mine = sorted(x for x in counts if x not in out and block_of[x] == s)
            ready = [x for x in mine if (self.wait[w][2] if (w := self._where(self.wait, x)) is not None else 0) >= self.admit]
            for x in ready:  # admissions first, then the waiting ids
                spot = next((p for p in positions if p not in self.rows), None)
                if spot is None:
                    old = [p for p in positions if self.rows[p][1] < now]
                    if self.eviction == "ttl":
                        old = [p for p in old if now - self.rows[p][1] > self.ttl]
                    key = (lambda p: (self.rows[p][2], self.rows[p][1], p)) if self.eviction == "lfu" else (lambda p: (self.rows[p][1], p))
                    spot = min(old, key=key, default=None)
                if spot is not None:
                    if spot in self.rows:
                        evicted.append(spot)
                    self.rows[spot], out[x] = [x, now, counts[x]], spot
                    self.wait.pop(self._where(self.wait, x), None)
            fresh = []
            for x in (x for x in mine if x not in out):  # waiting ids are counted, then new ones wait
                w = self._where(self.wait, x)
                if w is None:
                    fresh.append(x)
                else:
                    self.wait[w][1], self.wait[w][2] = now, self.wait[w][2] + counts[x]
            for x in fresh:  # each at its own position, unless an id seen in this batch is there
                spot = int(wait_position(np.array([x]), np.array([s]), self.rpv, self.rows_in_block)[0])
                if spot not in self.wait or self.wait[spot][1] < now:
                    self.wait[spot] = [x, now, counts[x]]
        return {x: out.get(x, -1) for x in counts}, evicted
