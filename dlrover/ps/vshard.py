"""Virtual-shard (vshard) partition of the embedding tables across PS actors.

Row ``r`` of table ``t`` lives in vshard ``r % V`` at position ``r // V`` inside it.
Every table is cut the same way, so one vshard is a slice of every table, and a PS owns
a set of vshards. Moving a vshard (issue: elastic PS) moves whole slices of rows with
their optimizer state, and routing stays a table lookup (no per-id hashing on the hot
path beyond one modulo).

On a PS the owned vshards are laid out back to back: table ``t`` on PS ``k`` has
``len(owned_k) * rows_per_vshard[t]`` rows and global row ``r`` sits at local row
``slot_k(r % V) * rows_per_vshard[t] + r // V``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class VShardMap:
    """Which PS owns which vshard; immutable in use (a new map is a new version)."""

    table_sizes: list[int]
    num_vshards: int
    owner: np.ndarray  # int32 [V]: PS index owning each vshard
    version: int = 0
    _slot: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.owner = np.asarray(self.owner, dtype=np.int32)
        if self.owner.shape != (self.num_vshards,):
            raise ValueError("owner must have one entry per vshard")
        self._slot = np.zeros(self.num_vshards, dtype=np.int64)
        for k in np.unique(self.owner):
            vs = np.flatnonzero(self.owner == k)
            self._slot[vs] = np.arange(len(vs))

    @classmethod
    def round_robin(cls, table_sizes: list[int], num_vshards: int, num_ps: int) -> "VShardMap":
        if num_ps > num_vshards:
            raise ValueError(f"{num_ps} PS need at least as many vshards, got {num_vshards}")
        return cls(list(table_sizes), num_vshards, np.arange(num_vshards) % num_ps)

    @property
    def num_ps(self) -> int:
        return int(self.owner.max()) + 1

    def rows_per_vshard(self) -> list[int]:
        v = self.num_vshards
        return [-(-n // v) for n in self.table_sizes]

    def owned(self, ps: int) -> np.ndarray:
        """Vshards owned by PS ``ps`` in slot order."""
        return np.flatnonzero(self.owner == ps)

    def local_table_sizes(self, ps: int) -> list[int]:
        n = len(self.owned(ps))
        return [max(1, n * r) for r in self.rows_per_vshard()]

    def global_rows(self, ps: int, table: int) -> np.ndarray:
        """Global row id of each local row of ``table`` on ``ps`` (-1 for padding rows)."""
        v, rpv = self.num_vshards, self.rows_per_vshard()[table]
        owned = self.owned(ps)
        rows = (np.arange(rpv)[None, :] * v + owned[:, None]).reshape(-1)
        rows[rows >= self.table_sizes[table]] = -1
        return rows

    def route(self, rows: torch.Tensor, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Owner PS and local row of each global row id (``tables``: the table of each)."""
        v = self.num_vshards
        vs = rows % v
        owner = torch.from_numpy(self.owner)[vs]
        rpv = torch.tensor(self.rows_per_vshard(), dtype=torch.int64)[tables]
        local = torch.from_numpy(self._slot)[vs] * rpv + torch.div(rows, v, rounding_mode="floor")
        return owner, local
