"""A high-cardinality click log with string ids and a multi-valued history: where dynamic
tables are for, on multi-hot bags (``dlrover bench embeddings --multi-hot``).

A row is a user (Zipf over ``users`` ids), the item shown (Zipf over ``items``), the
user's recent items (``history``: 1..``max_history`` items, ``"|"``-separated), a few
small categorical columns and two numbers, all ids as text (``u3f9a..``, ``i07c1..``). As
in :mod:`dlrover.data.synth_highcard`, every id carries a weight of the same spread,
head and tail alike (a normal deviate hashed from the id), so a hashed table that puts
several ids in a row averages their weights away; the history contributes its items'
mean weight (the table pools by mean). Written as CSV with a header; ``synth.json``
holds the config and the best possible AUC.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from dlrover.data.planted import calibrate, sigmoid
from dlrover.data.synth_highcard import permute32, zipf_ranks
from dlrover.errors import DLRoverError
from dlrover.hashing import splitmix64

GENERATOR = "dlrover.synth-clicklog/1"
META_FILE = "synth.json"
SMALL = [("hour", 24), ("device", 50), ("site", 400), ("region", 1000)]
SHARES = {"user": 0.25, "item": 0.25, "history": 0.3, "small": 0.1, "dense": 0.1}
LOGIT_STD = 1.6
CHUNK_ROWS = 100_000

# The job's features: section for these files (and its tables' names).
FEATURES = {
    "label": "click",
    "dense": ["price", "age_days"],
    "sparse": ["user_id", "item_id", {"column": "history", "separator": "|", "max_len": 20}, *[name for name, _ in SMALL]],
}
LARGE = ["user_id", "item_id", "history"]  # the high-cardinality tables


@dataclass
class ClickLogConfig:
    rows: int
    files: int = 4
    seed: int = 0
    users: int = 2_000_000
    items: int = 5_000_000
    max_history: int = 20
    zipf: float = 1.0
    base_ctr: float = 0.25

    def validate(self) -> None:
        if self.rows < 1 or not 1 <= self.files <= self.rows:
            raise DLRoverError(f"synth: need rows >= files >= 1, got rows {self.rows}, files {self.files}")
        if min(self.users, self.items, self.max_history) < 1 or max(self.users, self.items) >= 1 << 31:
            raise DLRoverError("synth: users, items and max_history must be >= 1 (users and items below 2**31)")


class Rows(NamedTuple):
    user: np.ndarray  # [n] ids
    item: np.ndarray  # [n] ids
    history: np.ndarray  # flat ids, row by row
    lengths: np.ndarray  # [n] history items a row
    small: np.ndarray  # [n, len(SMALL)] ids
    dense: np.ndarray  # [n, 2] price, age_days


class ClickLogModel:
    """The planted click model, rebuilt from a config (so ``synth.json`` describes it)."""

    def __init__(self, cfg: ClickLogConfig) -> None:
        from scipy.special import ndtri

        self.cfg, self._ndtri = cfg, ndtri
        rng = np.random.default_rng([cfg.seed, 13])
        self.keys = rng.integers(1 << 31, 1 << 32, 2, dtype=np.int64).astype(np.uint64)  # user, item ids
        self.salts = rng.integers(0, 1 << 62, 2 + len(SMALL), dtype=np.int64).astype(np.uint64)  # user, item, small
        self.dense_coef = rng.normal(0, 1, 2)
        self.scale, self.bias = {k: 1.0 for k in SHARES}, 0.0
        self.scale, self.bias = calibrate(self._parts(self.sample(np.random.default_rng([cfg.seed, 13, 1]), 50_000)), SHARES, LOGIT_STD, cfg.base_ctr)

    def _weight(self, which: int, ids: np.ndarray) -> np.ndarray:
        h = splitmix64(ids.astype(np.uint64) ^ self.salts[which])
        return self._ndtri(((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53))

    def sample(self, rng: np.random.Generator, n: int) -> Rows:
        cfg = self.cfg
        zipf = lambda size, vocab, key: permute32(zipf_ranks(rng.random(size), vocab, cfg.zipf).astype(np.uint64) ^ key)  # noqa: E731
        lengths = rng.integers(1, cfg.max_history + 1, n)
        return Rows(
            zipf(n, cfg.users, self.keys[0]), zipf(n, cfg.items, self.keys[1]), zipf(int(lengths.sum()), cfg.items, self.keys[1]), lengths,
            np.stack([rng.integers(0, v, n) for _, v in SMALL], axis=1),
            np.stack([np.floor(np.exp(rng.normal(2.0, 1.0, n))), rng.integers(0, 365, n)], axis=1).astype(np.float64),
        )  # fmt: skip

    def _parts(self, r: Rows) -> dict[str, np.ndarray]:
        n = len(r.user)
        hist = np.bincount(np.repeat(np.arange(n), r.lengths), weights=self._weight(1, r.history), minlength=n) / r.lengths
        small = sum(self._weight(2 + j, r.small[:, j]) for j in range(len(SMALL)))
        return {"user": self._weight(0, r.user), "item": self._weight(1, r.item), "history": hist, "small": small, "dense": np.log1p(r.dense) @ self.dense_coef}

    def logit(self, r: Rows) -> np.ndarray:
        parts = self._parts(r)
        return self.bias + sum(self.scale[k] * parts[k] for k in SHARES)


def _arrow_schema():
    import pyarrow as pa

    numbers = {"click": pa.int64(), "price": pa.float64(), "age_days": pa.float64()}
    return pa.schema([(c, numbers.get(c, pa.string())) for c in ["click", "price", "age_days", "user_id", "item_id", "history", *[n for n, _ in SMALL]]])


def _text(prefix: str, ids: np.ndarray) -> object:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(pa.array(ids), pa.string()), "")


def generate_clicklog(out_dir: str, cfg: ClickLogConfig, progress: bool = True) -> dict:
    """Write ``part-NNNNN.csv`` and ``synth.json`` into ``out_dir`` (identical configs give
    identical files); returns synth.json's dict."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    from sklearn.metrics import roc_auc_score

    cfg.validate()
    model = ClickLogModel(cfg)
    schema = _arrow_schema()
    os.makedirs(out_dir, exist_ok=True)
    names = [f"part-{i:05d}.csv" for i in range(cfg.files)]
    per_file = [cfg.rows // cfg.files + (i < cfg.rows % cfg.files) for i in range(cfg.files)]
    probs, labels_all = [], []
    seen: dict[str, list[np.ndarray]] = {name: [] for name in LARGE}
    for i, (name, rows) in enumerate(zip(names, per_file)):
        rng = np.random.default_rng([cfg.seed, 13, 2, i])
        path = os.path.join(out_dir, name)
        with pacsv.CSVWriter(path + ".tmp", schema) as w:
            for lo in range(0, rows, CHUNK_ROWS):
                r = model.sample(rng, min(CHUNK_ROWS, rows - lo))
                p = sigmoid(model.logit(r))
                clicks = (rng.random(len(p)) < p).astype(np.int64)
                offsets = pa.array(np.concatenate([[0], np.cumsum(r.lengths)]).astype(np.int32))
                cols = {"click": pa.array(clicks), "price": pa.array(r.dense[:, 0]), "age_days": pa.array(r.dense[:, 1]),
                        "user_id": _text("u", r.user), "item_id": _text("i", r.item),
                        "history": pc.binary_join(pa.ListArray.from_arrays(offsets, _text("i", r.history)), "|"),
                        **{c: _text(c[0], r.small[:, j]) for j, (c, _) in enumerate(SMALL)}}  # fmt: skip
                w.write_table(pa.table([cols[c] for c in schema.names], schema=schema))
                probs.append(p.astype(np.float32))
                labels_all.append(clicks.astype(np.int8))
                for k, ids in zip(LARGE, (r.user, r.item, r.history)):
                    seen[k].append(np.unique(ids))
        os.replace(path + ".tmp", path)
        if progress:
            print(f"[synth] {name}: {rows:,} rows", flush=True)
    p_all, y_all = np.concatenate(probs), np.concatenate(labels_all)
    meta = {
        "generator": GENERATOR, "config": asdict(cfg), "rows": cfg.rows, "files": names, "ctr": float(y_all.mean()),
        "best_auc": float(roc_auc_score(y_all, p_all)) if 0 < y_all.sum() < len(y_all) else float("nan"),
        "distinct_ids_seen": [int(len(np.unique(np.concatenate(seen[k])))) for k in LARGE],
    }  # fmt: skip
    with open(os.path.join(out_dir, META_FILE + ".tmp"), "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(os.path.join(out_dir, META_FILE + ".tmp"), os.path.join(out_dir, META_FILE))
    return meta
