"""Incremental durable checkpoints: the embedding rows changed since the previous one.

A full checkpoint holds each PS payload as the cut produced it
(``{"vshards": [k], "tables": [[weights, *optimizer states] per table]}``, blocks of the
listed vshards back to back, :mod:`dlrover.ps.migration`), one file per payload. A delta
holds, per table, the *global* row ids pushed since the previous durable cut and those
rows' weights and optimizer state, also one file per payload (the rows it holds).
Global ids make a delta independent of which PS held what: replaying it onto a full
checkpoint written under another vshard map (or restoring the result onto yet another)
needs only ``row % V`` and ``row // V``.

``quantize`` applies to the embedding weights written (full and delta): fp16, or int8
with a per-row scale and offset (``lo + (q + 128) * scale``, error at most half a step).
Optimizer state stays fp32: row-wise Adagrad keeps one accumulator per row (1/dim of the
bytes), and quantizing an accumulator would change every later step size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

QUANTIZE_MODES = ("none", "fp16", "int8")


@dataclass(frozen=True)
class ChangedRows:
    """What a PS reports at a cut: the global rows of each table pushed since its previous
    report. ``complete`` is False when that cannot be proven (first report, tables rebuilt
    by a restore or a migration since): the next durable checkpoint must then be full."""

    complete: bool
    rows: list[np.ndarray]  # per table, int64 global row ids


class RowChanges:
    """Union of the rows changed since the last durable cut, as one mask per table."""

    def __init__(self, table_sizes: list[int]) -> None:
        self.masks = [np.zeros(int(n), dtype=bool) for n in table_sizes]
        self.complete = False  # nothing proven until a durable cut resets it

    def add(self, reports: list[ChangedRows]) -> None:
        for r in reports:
            self.complete &= r.complete
            if r.complete:
                for mask, rows in zip(self.masks, r.rows):
                    mask[rows] = True

    def reset(self, complete: bool) -> None:
        for mask in self.masks:
            mask[:] = False
        self.complete = complete

    def rows(self) -> list[np.ndarray]:
        return [np.flatnonzero(m) for m in self.masks]


# -- quantization ------------------------------------------------------------------------


def pack_weights(w: np.ndarray, mode: str) -> Any:
    """Weights ``[rows, dim]`` as stored under ``mode`` (``none`` leaves them as they are)."""
    if mode == "none":
        return w
    if mode == "fp16":
        return {"fp16": np.asarray(w, dtype=np.float16)}
    if mode != "int8":
        raise ValueError(f"quantize: unknown mode {mode!r} (one of {', '.join(QUANTIZE_MODES)})")
    w = np.asarray(w, dtype=np.float32)
    if w.shape[0] == 0:
        return {"int8": np.zeros(w.shape, np.int8), "scale": np.zeros(0, np.float32), "offset": np.zeros(0, np.float32)}
    lo, hi = w.min(axis=1), w.max(axis=1)
    scale = ((hi.astype(np.float64) - lo) / 255.0).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    q = np.rint((w - lo[:, None]) / safe[:, None]) - 128.0
    return {"int8": np.clip(q, -128, 127).astype(np.int8), "scale": scale, "offset": lo.astype(np.float32)}


def unpack_weights(obj: Any) -> np.ndarray:
    """Inverse of :func:`pack_weights`, as fp32 (exact for ``none``)."""
    if not isinstance(obj, dict):
        return np.asarray(obj)
    if "fp16" in obj:
        return np.asarray(obj["fp16"]).astype(np.float32)
    q = np.asarray(obj["int8"]).astype(np.float32) + 128.0
    return q * np.asarray(obj["scale"])[:, None] + np.asarray(obj["offset"])[:, None]


# -- files -------------------------------------------------------------------------------


def full_part(payload: dict, mode: str) -> dict:
    """One PS payload as a full checkpoint stores it (file ``ps_<i>``), weights packed."""
    return {**payload, "tables": [[pack_weights(s[0], mode), *s[1:]] for s in payload["tables"]]}


def _locate(payloads: list[dict], num_vshards: int) -> tuple[np.ndarray, np.ndarray]:
    """For each vshard: which payload holds it and at which slot (-1: none does)."""
    which = np.full(num_vshards, -1, dtype=np.int64)
    slot = np.zeros(num_vshards, dtype=np.int64)
    for k, p in enumerate(payloads):
        vs = np.asarray(p["vshards"], dtype=np.int64)
        which[vs], slot[vs] = k, np.arange(len(vs))
    return which, slot


def _positions(payloads: list[dict], rows: np.ndarray, num_vshards: int, rpv: int, where: tuple) -> list[tuple]:
    """Per payload: (indices into ``rows``, local row positions in that payload)."""
    which, slot = where
    vs = rows % num_vshards
    if len(rows) and np.any(which[vs] < 0):
        raise ValueError(f"vshards {sorted(set(vs[which[vs] < 0].tolist()))[:8]} are in no payload")
    out = []
    for k in range(len(payloads)):
        sel = np.flatnonzero(which[vs] == k)
        out.append((sel, slot[vs[sel]] * rpv + rows[sel] // num_vshards))
    return out


def delta_part(payload: dict, rows: list[np.ndarray], num_vshards: int, rpv: list[int], mode: str) -> dict:
    """The rows of ``rows`` (global ids per table, pushed since the last durable cut) that
    ``payload`` holds, as its delta file (``emb_<i>``)."""
    which, slot = _locate([payload], num_vshards)
    tables = []
    for t, ids in enumerate(rows):
        ids = np.asarray(ids, dtype=np.int64)
        ids = ids[which[ids % num_vshards] == 0]
        local = slot[ids % num_vshards] * rpv[t] + ids // num_vshards
        states = [np.asarray(a)[local] for a in payload["tables"][t]]
        small = ids.astype(np.int32) if len(ids) == 0 or ids[-1] < 2**31 else ids
        tables.append({"rows": small, "states": [pack_weights(states[0], mode), *states[1:]]})
    return {"tables": tables}


def unpack_full(files: dict[str, Any]) -> list[dict]:
    """The fp32 PS payloads of a full checkpoint's files (``ps_<i>``, in order)."""
    keys = sorted((k for k in files if k.startswith("ps_")), key=lambda k: int(k[3:]))
    return [
        {**files[k], "tables": [[unpack_weights(s[0]), *[np.asarray(a) for a in s[1:]]] for s in files[k]["tables"]]}
        for k in keys
    ]


def apply_delta(payloads: list[dict], delta: dict, num_vshards: int, rpv: list[int]) -> int:
    """Write a delta's rows into full fp32 ``payloads`` (in place). Returns rows written."""
    where, n = _locate(payloads, num_vshards), 0
    for t, table in enumerate(delta["tables"]):
        ids = np.asarray(table["rows"], dtype=np.int64)
        values = [unpack_weights(table["states"][0]), *table["states"][1:]]
        for k, (sel, local) in enumerate(_positions(payloads, ids, num_vshards, rpv[t], where)):
            dst = payloads[k]["tables"][t]
            for i, v in enumerate(values):
                if not dst[i].flags.writeable:
                    dst[i] = np.array(dst[i])
                dst[i][local] = np.asarray(v)[sel]
        n += len(ids)
    return n
