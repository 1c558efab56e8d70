"""Moving vshards between PS: block copies, dirty-row tracking, pre-copy + delta.

A vshard is a contiguous block of ``rows_per_vshard[t]`` local rows of every table ``t``
(``dlrover.ps.vshard``), so moving it is a block copy of its weights and optimizer state.
Like live migration of virtual machines, a move is done in two rounds so that training
stops only for the second: the PS start tracking which rows pushes update (``DirtyRows``),
the blocks are copied into the new owners' new tables while training goes on
(``copy_blocks``), then, with the workers paused, only the rows updated since are copied
again (``export_dirty`` / ``apply_dirty``).

Payloads are plain dicts of numpy arrays (they travel as Ray objects):
full ``{"vshards": [k], "tables": [[array per state]...]}`` with the blocks of the listed
vshards back to back; dirty ``{"vshards": [k], "dirty": [(positions, [array per state])...]}``
where a position ``i * rpv + r`` is row ``r`` of the payload's ``i``-th vshard.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dlrover.ps.layout import row_bases


class DirtyRows:
    """Which local rows of each table were updated since tracking began."""

    def __init__(self, local_sizes: list[int]) -> None:
        self.base = row_bases(local_sizes)
        self.flat = np.zeros(int(self.base[-1]), dtype=bool)

    def mark(self, flat: torch.Tensor) -> None:
        """Rows of one pushed TBE batch, as flat rows of the PS's tables (``base[t] + r``,
        see ``dlrover.ps.tables.PSTables``)."""
        self.flat[flat.numpy()] = True

    def mark_rows(self, t: int, rows: np.ndarray) -> None:
        """Local rows of table ``t`` changed outside a push (a dynamic table's id map)."""
        self.flat[self.base[t] + rows] = True

    def table(self, t: int) -> np.ndarray:
        return self.flat[self.base[t] : self.base[t + 1]]


def export_blocks(arrays: list[list[Any]], slots: np.ndarray, rpv: list[int]) -> list[list[np.ndarray]]:
    """Per table, the blocks at ``slots`` of every state (tensors or numpy arrays), back to
    back: views when the slots are consecutive (returned from an actor call, Ray copies
    them into the object store, once), numpy copies otherwise."""
    slots = np.asarray(slots, dtype=np.int64)
    run = len(slots) > 0 and np.array_equal(slots, np.arange(slots[0], slots[0] + len(slots)))
    out = []
    for r, states in zip(rpv, arrays):
        if run:
            out.append([np.asarray(a[slots[0] * r : (slots[-1] + 1) * r]) for a in states])
        else:
            out.append([np.concatenate([np.asarray(a[s * r : (s + 1) * r]) for s in slots]) if len(slots) else np.asarray(a[:0]).copy() for a in states])
    return out


def _blocks_of(mask: np.ndarray, r: int) -> np.ndarray:
    """A table's per-row flags as [slots, rpv] (a PS owning nothing has one padding row)."""
    n = len(mask) // r
    return mask[: n * r].reshape(n, r)


def export_dirty(arrays: list[list[torch.Tensor]], dirty: DirtyRows, slots: np.ndarray, rpv: list[int]) -> list[tuple]:
    """Per table, (positions, values per state) of the dirty rows in the blocks at ``slots``."""
    out = []
    for t, (r, states) in enumerate(zip(rpv, arrays)):
        i, j = np.nonzero(_blocks_of(dirty.table(t), r)[slots])
        rows = torch.from_numpy(slots[i] * r + j)
        out.append((i * r + j, [a[rows].numpy() for a in states]))
    return out


def copy_blocks(dst: list[list[torch.Tensor]], dst_slots: np.ndarray, src: list[list[Any]], src_slots: np.ndarray, rpv: list[int]) -> int:
    """Copy block ``src_slots[k]`` of ``src`` into block ``dst_slots[k]`` of ``dst``, for
    every table and state. ``src`` holds tensors or numpy arrays. Returns bytes copied."""
    nbytes = 0
    with torch.no_grad():
        for r, d_states, s_states in zip(rpv, dst, src):
            for d, s in zip(d_states, s_states):
                s = torch.as_tensor(s)
                for a, b in zip(dst_slots, src_slots):
                    d[a * r : (a + 1) * r] = s[b * r : (b + 1) * r]
                nbytes += len(dst_slots) * r * d[:1].numel() * d.element_size()
    return nbytes


def apply_dirty(dst: list[list[torch.Tensor]], new_slot_of: dict[int, int], vshards: np.ndarray, delta: list[tuple], rpv: list[int]) -> int:
    """Write the rows of a dirty payload (from ``export_dirty``) that belong to this PS
    into its new tables. Returns bytes."""
    nbytes = 0
    # -1: a vshard of this payload that goes to another PS
    slot_map = np.array([new_slot_of.get(int(v), -1) for v in vshards], dtype=np.int64)
    with torch.no_grad():
        for r, d_states, (pos, values) in zip(rpv, dst, delta):
            slots = slot_map[pos // r]
            keep = slots >= 0
            if not keep.any():
                continue
            rows = torch.from_numpy(slots[keep] * r + pos[keep] % r)
            sel = torch.from_numpy(np.flatnonzero(keep))
            for d, v in zip(d_states, values):
                d[rows] = torch.as_tensor(v)[sel]
                nbytes += int(keep.sum()) * v[:1].nbytes
    return nbytes


def copy_dirty_local(dst: list[list[torch.Tensor]], src: list[list[torch.Tensor]], dirty: DirtyRows, old_to_new: dict[int, int], rpv: list[int]) -> int:
    """Rows of kept vshards updated since the pre-copy: old local block -> new local block."""
    nbytes = 0
    old_slots = np.array(sorted(old_to_new), dtype=np.int64)
    new_slots = np.array([old_to_new[s] for s in old_slots], dtype=np.int64)
    with torch.no_grad():
        for t, (r, d_states, s_states) in enumerate(zip(rpv, dst, src)):
            if not len(old_slots):
                continue
            i, j = np.nonzero(_blocks_of(dirty.table(t), r)[old_slots])
            if len(i) == 0:
                continue
            src_rows = torch.from_numpy(old_slots[i] * r + j)
            dst_rows = torch.from_numpy(new_slots[i] * r + j)
            for a, b in zip(d_states, s_states):
                a[dst_rows] = b[src_rows]
                nbytes += len(i) * a[:1].numel() * a.element_size()
    return nbytes
