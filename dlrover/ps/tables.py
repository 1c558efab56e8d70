"""The tables a PS holds: fbgemm TBEs with the optimizer fused into backward, and their
deterministic initial rows."""

from __future__ import annotations

import numpy as np
import torch


def optim_type(name: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {
        "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        "adagrad": EmbOptimType.EXACT_ADAGRAD,
        "sgd": EmbOptimType.EXACT_SGD,
    }[name]


INIT_CHUNK_ROWS = 1 << 16  # rows per independently seeded block of initial weights


def init_rows(seed: int, table: int, num_rows: int, dim: int, rows: np.ndarray) -> torch.Tensor:
    """Deterministic initial weights of the given global rows of a table.

    Same distribution as TorchRec's default, U(-sqrt(1/n), sqrt(1/n)). Values come in
    blocks of ``INIT_CHUNK_ROWS`` rows, each from its own ``(seed, table, block)``
    generator, so a row's starting value does not depend on how the table is sharded,
    and a PS never holds more than one block of a table it does not own.
    """
    bound = (1.0 / num_rows) ** 0.5
    out = torch.empty(len(rows), dim)
    block_of = rows // INIT_CHUNK_ROWS
    for b in np.unique(block_of):
        g = torch.Generator().manual_seed(((seed * 7919 + table) << 20) + int(b))
        n = min(INIT_CHUNK_ROWS, num_rows - int(b) * INIT_CHUNK_ROWS)
        block = torch.empty(n, dim).uniform_(-bound, bound, generator=g)
        sel = np.flatnonzero(block_of == b)
        out[torch.from_numpy(sel)] = block[torch.from_numpy(rows[sel] - int(b) * INIT_CHUNK_ROWS)]
    return out


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
