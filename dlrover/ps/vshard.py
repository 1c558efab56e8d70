"""Virtual-shard (vshard) partition of the embedding tables across PS actors.

Row ``r`` of table ``t`` lives in vshard ``r % V`` at position ``r // V`` inside it.
Every table is cut the same way, so one vshard is a slice of every table, and a PS owns
a set of vshards. Moving a vshard (``dlrover.master.scaler``) moves whole slices of rows
with their optimizer state, and routing stays a table lookup (no per-id hashing on the
hot path beyond one modulo). PS ids are stable names (``ps-<id>``), not positions: after
PS 1 of 0..2 retires, the owners are {0, 2}.

On a PS each owned vshard has a slot: table ``t`` on PS ``k`` has ``capacity[k] *
rows_per_vshard[t]`` rows and global row ``r`` sits at local row ``slot[r % V] *
rows_per_vshard[t] + r // V``. Slots are explicit so that a rescale need not rebuild
every PS's tables: a PS that gives vshards away keeps its tables and the freed slots
(holes), and vshards moving in fill free slots while training goes on (nothing routes to
them yet). A PS whose vshards would not fit, or would fill under half its slots, gets a
new compact layout (slots in vshard order) and rebuilds its tables.

A dynamic table (``dynamic``, :mod:`dlrover.ps.dynamic`) is laid out the same way, but an
id is not a row: it goes to vshard ``vshard_of(id)`` and its owner maps it to a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlrover.ps.dynamic import vshard_of


@dataclass
class VShardMap:
    """Which PS owns which vshard; immutable in use (a new map is a new version)."""

    table_sizes: list[int]
    num_vshards: int
    owner: np.ndarray  # int32 [V]: PS index owning each vshard
    version: int = 0
    dynamic: tuple[int, ...] = ()  # dynamic tables: routed by a hash of the raw id
    slot: np.ndarray | None = None  # int64 [V]: each vshard's slot on its owner (default: compact)
    # Slots of each PS's tables (default: what it owns). A PS owning nothing may have some
    # reserved: one added by a rescale allocates them while it starts (``with_reserved``).
    capacity: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.owner = np.asarray(self.owner, dtype=np.int32)
        if self.owner.shape != (self.num_vshards,):
            raise ValueError("owner must have one entry per vshard")
        if self.slot is None:
            self.slot = np.zeros(self.num_vshards, dtype=np.int64)
            for k in np.unique(self.owner):
                vs = np.flatnonzero(self.owner == k)
                self.slot[vs] = np.arange(len(vs))
        self.slot = np.asarray(self.slot, dtype=np.int64)
        if self.slot.shape != (self.num_vshards,) or any(c < 0 for c in self.capacity.values()):
            raise ValueError("slot must have one entry per vshard, and capacities must be >= 0")
        reserved = {int(k): int(c) for k, c in self.capacity.items() if not np.any(self.owner == k)}
        self.capacity = reserved | {int(k): int(self.capacity.get(int(k), np.sum(self.owner == k))) for k in np.unique(self.owner)}
        for k, cap in self.capacity.items():
            used = self.slot[self.owner == k]
            if len(used) and (len(np.unique(used)) != len(used) or used.min() < 0 or used.max() >= cap):
                raise ValueError(f"ps-{k}: slots {sorted(used.tolist())} are not distinct slots below its capacity {cap}")

    @classmethod
    def round_robin(cls, table_sizes: list[int], num_vshards: int, num_ps: int, dynamic: tuple[int, ...] = ()) -> "VShardMap":
        if num_ps > num_vshards:
            raise ValueError(f"{num_ps} PS need at least as many vshards, got {num_vshards}")
        return cls(list(table_sizes), num_vshards, np.arange(num_vshards) % num_ps, dynamic=tuple(dynamic))

    def with_owner(self, owner: np.ndarray) -> "VShardMap":
        """The next version, with vshard ``v`` on PS ``owner[v]``. A PS keeps its slots
        and tables when what it will own fits in them and fills at least half (never with
        dynamic tables, whose id maps are rebuilt); otherwise it gets a compact layout."""
        owner = np.asarray(owner, dtype=np.int32)
        slot, capacity = np.zeros(self.num_vshards, dtype=np.int64), {}
        for k in (int(k) for k in np.unique(owner)):
            mine, before = owner == k, self.owner == k
            stay, incoming = np.flatnonzero(mine & before), np.flatnonzero(mine & ~before)
            cap = self.capacity.get(k, 0)
            # Free under the old map: a slot given away in this move is still trained until the switch.
            free = np.setdiff1d(np.arange(cap), self.slot[before])
            if not self.dynamic and cap and len(incoming) <= len(free) and 2 * int(mine.sum()) >= cap:
                slot[stay], slot[incoming], capacity[k] = self.slot[stay], free[: len(incoming)], cap
            else:
                slot[mine], capacity[k] = np.arange(int(mine.sum())), int(mine.sum())
        return VShardMap(list(self.table_sizes), self.num_vshards, owner, self.version + 1, self.dynamic, slot, capacity)

    def with_reserved(self, ps: int, slots: int) -> "VShardMap":
        """The same map (same version: routing does not change) with ``slots`` reserved for
        PS ``ps``, which owns nothing yet: it builds tables of that many slots when it
        starts, and takes its first vshards into them without allocating."""
        if np.any(self.owner == ps):
            raise ValueError(f"ps-{ps} owns vshards: only a PS owning nothing can reserve slots")
        return VShardMap(list(self.table_sizes), self.num_vshards, self.owner, self.version, self.dynamic, self.slot, {**self.capacity, ps: slots})

    def same_layout(self, ps: int, new: "VShardMap") -> bool:
        """Whether PS ``ps`` holds the same vshards in the same slots under ``new``."""
        return np.array_equal(self.at_slots(ps), new.at_slots(ps))

    def keeps_tables(self, ps: int, new: "VShardMap") -> bool:
        """Whether PS ``ps`` keeps its tables under ``new``: no dynamic tables (their id maps
        are rebuilt), same capacity, every vshard it owns in both maps in the same slot,
        and every vshard moving in to a slot free under this map."""
        both = np.flatnonzero((self.owner == ps) & (new.owner == ps))
        incoming = np.flatnonzero((self.owner != ps) & (new.owner == ps))
        return (
            not self.dynamic and ps in self.capacity and self.capacity[ps] == new.capacity.get(ps)
            and bool(np.all(self.slot[both] == new.slot[both])) and bool(np.all(self.at_slots(ps)[new.slot[incoming]] < 0))
        )  # fmt: skip

    @property
    def ps_ids(self) -> list[int]:
        """The PS that own at least one vshard, ascending."""
        return [int(k) for k in np.unique(self.owner)]

    @property
    def num_ps(self) -> int:
        return len(np.unique(self.owner))

    def ids_on(self, ids: np.ndarray, tables: np.ndarray, ps_ids: list[int]) -> int:
        """How many of these raw ids (``tables``: the table of each) go to the PS
        ``ps_ids``, routed as the workers route them."""
        ids, tables = np.asarray(ids, dtype=np.int64), np.asarray(tables, dtype=np.int64)
        vs = np.remainder(ids, np.asarray(self.table_sizes, dtype=np.int64)[tables]) % self.num_vshards
        raw = np.isin(tables, self.dynamic) if self.dynamic else None
        if raw is not None:
            vs[raw] = vshard_of(ids[raw], self.num_vshards)
        return int(np.isin(self.owner[vs], ps_ids).sum())

    def reassigned(self, ps_ids: list[int], load: dict[int, float] | None = None) -> "VShardMap":
        """A new version spreading the vshards over ``ps_ids`` with as few moves as possible.

        Vshards of PS that leave go to the PS with the fewest; then vshards move one at a
        time from the most to the least loaded PS until counts (or, given ``load`` per PS,
        the load each vshard carries on average) are as even as they can be.
        """
        ids = sorted(set(int(k) for k in ps_ids))
        if not ids or len(ids) > self.num_vshards:
            raise ValueError(f"cannot spread {self.num_vshards} vshards over {len(ids)} PS")
        owner = self.owner.copy()
        per_vshard = {k: (load or {}).get(k, 1.0) / max(1, int(np.sum(self.owner == k))) for k in self.ps_ids}
        # A PS with no measured load yet (busy 0) still carries its vshards: a floor keeps
        # every weight positive, so moves always make progress.
        weight = np.maximum(np.array([per_vshard.get(int(k), 1.0) for k in self.owner]), 1e-3)
        if load is None or not any(v > 0 for v in load.values()):
            weight[:] = 1.0
        held = {k: float(weight[owner == k].sum()) for k in ids}
        for v in np.flatnonzero(~np.isin(owner, ids)):  # orphans of leaving PS
            k = min(ids, key=lambda i: held[i])
            owner[v] = k
            held[k] += weight[v]
        while True:  # move the lightest vshard of the heaviest PS while that narrows the gap
            hi, lo = max(ids, key=lambda i: held[i]), min(ids, key=lambda i: held[i])
            cand = np.flatnonzero(owner == hi)
            cand = cand[np.argsort(-self.slot[cand], kind="stable")] if hi in self.capacity else cand[::-1]
            if hi == lo or len(cand) <= 1:
                break
            # Of equal weights the highest slot: a PS gives away the end of its slot order,
            # one consecutive run of blocks that it exports without a copy, and its holes
            # stay at the end of its tables.
            v = cand[np.argmin(weight[cand])]
            if held[hi] - weight[v] < held[lo] + weight[v] - 1e-9:
                break
            owner[v] = lo
            held[hi] -= weight[v]
            held[lo] += weight[v]
        return self.with_owner(owner)

    def moves(self, new: "VShardMap") -> list[tuple[int, int, int]]:
        """``(vshard, from_ps, to_ps)`` for every vshard whose owner differs in ``new``."""
        return [(int(v), int(self.owner[v]), int(new.owner[v])) for v in np.flatnonzero(self.owner != new.owner)]

    def rows_per_vshard(self) -> list[int]:
        v = self.num_vshards
        return [-(-n // v) for n in self.table_sizes]

    def owned(self, ps: int) -> np.ndarray:
        """Vshards owned by PS ``ps`` in slot order."""
        vs = np.flatnonzero(self.owner == ps)
        return vs[np.argsort(self.slot[vs], kind="stable")]

    def at_slots(self, ps: int) -> np.ndarray:
        """The vshard in each slot of PS ``ps`` (-1: a free slot)."""
        out = np.full(self.capacity.get(ps, 0), -1, dtype=np.int64)
        vs = np.flatnonzero(self.owner == ps)
        out[self.slot[vs]] = vs
        return out

    def local_table_sizes(self, ps: int) -> list[int]:
        n = self.capacity.get(ps, 0)
        return [max(1, n * r) for r in self.rows_per_vshard()]

    def global_rows(self, ps: int, table: int) -> np.ndarray:
        """Global row id of each local row of ``table`` on ``ps`` (-1 for padding rows and
        free slots)."""
        v, rpv = self.num_vshards, self.rows_per_vshard()[table]
        at = self.at_slots(ps)
        rows = (np.arange(rpv)[None, :] * v + at[:, None]).reshape(-1)
        rows[(rows >= self.table_sizes[table]) | np.repeat(at < 0, rpv)] = -1
        return rows

    def route(self, rows: np.ndarray, tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Owner PS and local row of each global row id (``tables``: the table of each). The
        ids of dynamic tables are raw ids: routed by their hash, sent as they are. numpy:
        its fancy indexing is 2-3x torch's on these sizes (the worker's input thread)."""
        v = self.num_vshards
        vs = rows % v
        raw = np.isin(tables, self.dynamic) if self.dynamic else None
        if raw is not None:
            vs[raw] = vshard_of(rows[raw], v)
        owner = self.owner[vs]
        local = self.slot[vs] * np.asarray(self.rows_per_vshard(), dtype=np.int64)[tables] + rows // v
        if raw is not None:
            local[raw] = rows[raw]
        return owner, local
