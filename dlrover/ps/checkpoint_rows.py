"""The PS side of incremental durable checkpoints: which rows pushes changed between cuts.

A separate :class:`~dlrover.ps.migration.DirtyRows` from the one live migration uses
(that one lives only between a migration's two rounds). It is swapped for a fresh one at
every cut, while the workers are parked with every push applied, so each report covers
exactly the pushes between two consecutive cuts; the master unions the reports up to
the next durable cut (:class:`dlrover.checkpoint.incremental.RowChanges`).

The tracker records local rows of the layout it was started under. If the tables were
rebuilt or re-mapped since (a rollback's ``restore``, a migration's ``commit_switch``: the
rows that moved were tracked, if at all, on another PS), the report is marked incomplete
and the next durable checkpoint is a full one.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from dlrover.checkpoint.incremental import ChangedRows
from dlrover.ps.migration import DirtyRows
from dlrover.ps.vshard import VShardMap


class CutTracker:
    """Rows pushed on one PS since the last cut, in the layout of that cut."""

    def __init__(self, vmap: VShardMap, ps_index: int, tbe: Any) -> None:
        self.rows = DirtyRows(vmap.local_table_sizes(ps_index))
        self.vmap, self.ps_index = vmap, ps_index
        self.at_slots = vmap.at_slots(ps_index)
        self._tbe = weakref.ref(tbe)  # no strong reference: a replaced TBE is freed

    def mark(self, tbe: Any, flat: torch.Tensor) -> None:
        """Rows of one pushed TBE batch (see ``DirtyRows.mark``), if pushed into the tables
        this tracker counts: after they were rebuilt the report is incomplete anyway."""
        if self._tbe() is tbe:
            self.rows.mark(flat)

    def mark_rows(self, tbe: Any, t: int, rows: np.ndarray) -> None:
        """Local rows of table ``t`` changed outside a push (see ``mark``)."""
        if self._tbe() is tbe:
            self.rows.mark_rows(t, rows)

    def same_layout(self, vmap: VShardMap, tbe: Any) -> bool:
        """True while the tables this tracker counts rows of are still the live ones."""
        # A restore or a switch installs a new map object (and, moving rows, new tables).
        return self._tbe() is tbe and vmap is self.vmap

    def global_rows(self) -> list[np.ndarray]:
        """Per table, the sorted global ids of the rows marked (padding rows left out)."""
        v, out = self.vmap.num_vshards, []
        for t, (n, rpv) in enumerate(zip(self.vmap.table_sizes, self.vmap.rows_per_vshard())):
            local = np.flatnonzero(self.rows.table(t)[: len(self.at_slots) * rpv])
            vs = self.at_slots[local // rpv]
            rows = (local % rpv) * v + vs
            out.append(np.sort(rows[(vs >= 0) & (rows < n)]).astype(np.int64))
        return out


def report(tracker: CutTracker | None, vmap: VShardMap, tbe: Any) -> ChangedRows:
    """What a PS tells the master at a cut about the tracker that ends there."""
    if tracker is None or not tracker.same_layout(vmap, tbe):
        return ChangedRows(False, [])
    return ChangedRows(True, tracker.global_rows())
