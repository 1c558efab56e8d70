"""A dynamic table's id -> row map as the final model (``final.pt``) carries it.

On the PS the map is spread over the owners of the table's vshards, in local rows
(:mod:`dlrover.ps.dynamic`); when a job ends the master gathers it into one of these per
dynamic table, next to the global tables, so that the final model scores every id as
the job's own evaluation did: an admitted id reads its row, any other the default row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class IdMap:
    """``ids`` int64 [n] ascending (the admitted raw ids), ``rows`` int64 [n] (each id's
    global row), ``default`` [dim] (the constant row every other id reads)."""

    ids: torch.Tensor
    rows: torch.Tensor
    default: torch.Tensor

    def to_doc(self) -> dict[str, torch.Tensor]:
        """The map as ``final.pt`` stores it (plain tensors: loads with ``weights_only``)."""
        return {"ids": self.ids, "rows": self.rows, "default": self.default}

    @classmethod
    def from_doc(cls, doc: object, num_rows: int, dim: int) -> "IdMap":
        """Read back what :meth:`to_doc` wrote, checked against the table's shape;
        ValueError says what is wrong."""
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), torch.Tensor) for k in ("ids", "rows", "default")):
            raise ValueError("expected tensors ids, rows and default")
        ids, rows, default = doc["ids"], doc["rows"], doc["default"]
        if ids.dtype != torch.int64 or rows.dtype != torch.int64 or ids.shape != rows.shape or ids.dim() != 1:
            raise ValueError("ids and rows must be int64 vectors of one length")
        if tuple(default.shape) != (dim,):
            raise ValueError(f"default row of shape {list(default.shape)}, the table's rows have {dim} values")
        if len(ids) and (bool((ids[1:] <= ids[:-1]).any()) or int(rows.min()) < 0 or int(rows.max()) >= num_rows):
            raise ValueError(f"ids must ascend and rows lie in 0..{num_rows - 1}")
        return cls(ids, rows, default)
