"""The tables a PS holds: one fbgemm TBE table with the optimizer fused into backward,
and their deterministic initial rows."""

from __future__ import annotations

import numpy as np
import torch

from dlrover.hashing import splitmix64
from dlrover.ps.layout import row_bases


def optim_type(name: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {
        "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        "adagrad": EmbOptimType.EXACT_ADAGRAD,
        "sgd": EmbOptimType.EXACT_SGD,
    }[name]


INIT_CHUNK_ROWS = 1 << 16  # rows drawn at a time (bounds the temporaries of a large table)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment


def init_rows(seed: int, table: int, num_rows: int, dim: int, rows: np.ndarray) -> torch.Tensor:
    """Deterministic initial weights of the given global rows of a table.

    Same distribution as TorchRec's default, U(-sqrt(1/n), sqrt(1/n)). Each value is
    SplitMix64 of its own counter ``(seed, table, row, column)``, so a row's starting
    value does not depend on how the table is sharded, and any few rows (a dynamic
    table's evicted rows) cost only themselves.
    """
    bound, unit = np.float32((1.0 / num_rows) ** 0.5), np.float32(2.0**-23)
    key = splitmix64(np.array([seed * 7919 + table], dtype=np.int64).view(np.uint64))[0]
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), dim), dtype=np.float32)
    cols = np.arange(dim, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for at in range(0, len(rows), INIT_CHUNK_ROWS):
            r = rows[at : at + INIT_CHUNK_ROWS].view(np.uint64)
            x = splitmix64(key + (r[:, None] * np.uint64(dim) + cols + np.uint64(1)) * _GAMMA)
            out[at : at + len(r)] = ((x >> np.uint64(40)).astype(np.float32) * unit - np.float32(1.0)) * bound  # 24 bits: [-1, 1)
    return torch.from_numpy(out)


def new_tbe(sizes: list[int], dim: int, optimizer: dict):
    """A CPU TBE of tables with ``sizes`` rows of ``dim``, its optimizer fused into backward."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    return SplitTableBatchedEmbeddingBagsCodegen(
        [(n, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for n in sizes],
        optimizer=optim_type(optimizer["name"]),
        learning_rate=float(optimizer["lr"]),
        eps=float(optimizer.get("eps", 1e-8)),
    )


class PSTables:
    """A PS's local tables back to back in one TBE table: local row ``r`` of table ``t``
    is flat row ``base[t] + r``.

    One table lets a lookup hold any number of bags of each table (``dlrover.ps.layout``):
    a TBE of several tables needs the same number of bags in every table, so a PS request,
    whose tables hold unequal numbers of non-empty bags, would be padded to the largest
    (1.7x the bags at 2 PS on the bench data, 3.2x at 8), and TBE's time grows with the
    bags, empty ones included. The optimizers offered (SGD, Adagrad, row-wise Adagrad)
    update each row from its own gradient and state, so one table of all the rows trains
    exactly as separate tables do (tests/test_layout.py). ``split_embedding_weights`` and
    ``split_optimizer_states`` give per-table views, as a TBE of several tables would."""

    def __init__(self, sizes: list[int], dim: int, optimizer: dict) -> None:
        self.sizes = list(sizes)
        self.base = row_bases(self.sizes)
        self.tbe = new_tbe([int(self.base[-1])], dim, optimizer)

    def __call__(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Pooled rows ``[num_bags, dim]`` of a flat batch (rows ``base[t] + r``)."""
        return self.tbe(indices, offsets)

    def _split(self, whole: torch.Tensor) -> list[torch.Tensor]:
        return [whole[int(a) : int(b)] for a, b in zip(self.base[:-1], self.base[1:])]

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return self._split(self.tbe.split_embedding_weights()[0])

    def split_optimizer_states(self) -> list[list[torch.Tensor]]:
        """Per table, its optimizer states (SGD has none: TBE raises)."""
        states = self.tbe.split_optimizer_states()[0]
        return [list(per_table) for per_table in zip(*(self._split(s) for s in states))]
