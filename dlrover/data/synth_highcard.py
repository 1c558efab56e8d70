"""High-cardinality synthetic Criteo data: where hashed tables collide and it costs AUC.

:mod:`dlrover.data.synth` shrinks the weights of rare values, so its signal lives in a
few thousand frequent values per table and a hashed table loses nothing to collisions.
Here the first ``large_tables`` columns draw Zipf ranks over ``distinct_ids`` values
(10M by default), and every id carries a weight of the same spread, head and tail alike:
an id seen a few dozen times is worth learning, and a hashed row it shares with other ids
averages their weights into its own. That is the case a collision-free dynamic table is
for (``dlrover bench embeddings``).

Ids are 32-bit (the Criteo readers take at most 8 hex digits), non-zero and distinct per
table: a bijection of ``rank ^ key``. Every weight is a function of the id (a hash turned
into a normal deviate), so the model needs no 10M-entry table and :class:`HighCardOracle`
scores any row. The other tables (small Zipf vocabularies) and the dense features add a
little signal each; the labels' best possible AUC is recorded in ``synth.json``.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.criteo import NUM_DENSE, NUM_SPARSE
from dlrover.data.planted import calibrate, dense_log, sigmoid
from dlrover.errors import DLRoverError
from dlrover.hashing import splitmix64

GENERATOR = "dlrover.synth-highcard/1"
META_FILE = "synth.json"  # the name dlrover.data.synth's Oracle.from_dir looks for

CHUNK_ROWS = 100_000
SMALL_VOCAB_MAX = 1000  # the small tables' vocabularies: ~4 .. this, log-spaced
LOGIT_STD = 1.6
SHARES = {"large": 0.8, "small": 0.1, "dense": 0.1}  # of the planted logit's variance
REFERENCE_ROWS = 50_000  # the sample the scales and the bias are calibrated on
_M32 = np.uint64(0xFFFFFFFF)


@dataclass
class HighCardConfig:
    """What ``dlrover data synth --high-cardinality`` generates (stored in synth.json)."""

    rows: int
    files: int
    seed: int = 0
    distinct_ids: int = 10_000_000  # Zipf support of each large table
    large_tables: int = 4  # columns C1.. with distinct_ids values each
    zipf: float = 1.0
    missing_rate: float = 0.02
    base_ctr: float = 0.25
    gzip: bool = False

    def validate(self) -> None:
        if self.rows < 1 or self.files < 1 or self.files > self.rows:
            raise DLRoverError(f"synth: need rows >= files >= 1, got rows {self.rows}, files {self.files}")
        if not 1 <= self.distinct_ids < 1 << 31:
            raise DLRoverError(f"synth: --distinct-ids must be in [1, 2**31), got {self.distinct_ids}")
        if not 1 <= self.large_tables <= NUM_SPARSE:
            raise DLRoverError(f"synth: large_tables must be in [1, {NUM_SPARSE}], got {self.large_tables}")
        if not 0 < self.zipf <= 3:
            raise DLRoverError(f"synth: zipf must be in (0, 3], got {self.zipf}")
        if not 0 <= self.missing_rate < 1 or not 0 < self.base_ctr < 1:
            raise DLRoverError("synth: missing_rate must be in [0, 1) and base_ctr in (0, 1)")


def permute32(x: np.ndarray) -> np.ndarray:
    """A bijection of [0, 2**32) (Wellons' lowbias32) with 0 -> 0: distinct inputs give
    distinct ids, and a non-zero input a non-zero id (0 is a missing value)."""
    x = x.astype(np.uint64) & _M32
    x = ((x ^ (x >> np.uint64(16))) * np.uint64(0x7FEB352D)) & _M32
    x = ((x ^ (x >> np.uint64(15))) * np.uint64(0x846CA68B)) & _M32
    return (x ^ (x >> np.uint64(16))).astype(np.int64)


def zipf_ranks(u: np.ndarray, n: int, s: float) -> np.ndarray:
    """Ranks 1..n, P(rank) ~ rank**-s, by the inverse CDF of the continuous power law on
    [1, n+1) (floored): O(1) memory for any n, exact in shape past the first few ranks."""
    top = float(n + 1)
    if abs(s - 1.0) < 1e-9:
        x = top**u
    else:
        x = (1.0 + u * (top ** (1.0 - s) - 1.0)) ** (1.0 / (1.0 - s))
    return np.clip(np.floor(x), 1, n).astype(np.int64)


class HighCardModel:
    """The planted click model, rebuilt deterministically from a config."""

    def __init__(self, cfg: HighCardConfig) -> None:
        from scipy.special import ndtri

        self.cfg, self._ndtri = cfg, ndtri
        rng = np.random.default_rng([cfg.seed, 11, 0])
        # key >= 2**31 > every rank, so rank ^ key is never 0 and no id is 0
        self.keys = rng.integers(1 << 31, 1 << 32, NUM_SPARSE, dtype=np.int64).astype(np.uint64)
        self.salts = rng.integers(0, 1 << 62, NUM_SPARSE, dtype=np.int64).astype(np.uint64)
        k = cfg.large_tables
        self.small_vocab = [int(v) for v in np.round(np.geomspace(4, SMALL_VOCAB_MAX, max(NUM_SPARSE - k, 1)))][: NUM_SPARSE - k]
        self.small_cdf = [np.cumsum(p / p.sum()) for p in ((np.arange(v) + 1.0) ** -1.1 for v in self.small_vocab)]
        self.dense_mu = rng.uniform(0.5, 3.5, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.7, 1.4, NUM_DENSE)
        self.dense_coef = rng.normal(0, 1, NUM_DENSE)
        self.dense_mean, self.dense_std = np.zeros(NUM_DENSE), np.ones(NUM_DENSE)
        self.scale, self.bias = {name: 1.0 for name in SHARES}, 0.0
        self._calibrate()

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """n rows: (ids [n,26], 0 = missing; large tables' ranks [n,k]; dense ints; dense missing)."""
        k, cfg = self.cfg.large_tables, self.cfg
        ranks = zipf_ranks(rng.random((n, k)), cfg.distinct_ids, cfg.zipf)
        ids = np.empty((n, NUM_SPARSE), np.int64)
        ids[:, :k] = permute32(ranks.astype(np.uint64) ^ self.keys[:k])
        u = rng.random((n, NUM_SPARSE - k))
        for j, cdf in enumerate(self.small_cdf):
            r = np.minimum(np.searchsorted(cdf, u[:, j], side="right"), len(cdf) - 1) + 1
            ids[:, k + j] = permute32(r.astype(np.uint64) ^ self.keys[k + j])
        ids[rng.random((n, NUM_SPARSE)) < cfg.missing_rate] = 0
        dense = np.floor(np.exp(self.dense_mu + self.dense_sigma * rng.standard_normal((n, NUM_DENSE)))).astype(np.int64)
        dense_missing = rng.random((n, NUM_DENSE)) < cfg.missing_rate
        dense[dense_missing] = 0
        return ids, ranks, dense, dense_missing

    def weights(self, ids: np.ndarray) -> np.ndarray:
        """Each id's weight in its table: a standard normal deviate drawn from a hash of
        (table, id), 0 for a missing value. Same spread for every id, head or tail."""
        h = splitmix64(ids.astype(np.uint64) ^ self.salts[: ids.shape[1]])
        u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        return np.where(ids != 0, self._ndtri(u), 0.0)

    def terms(self, ids: np.ndarray, dense_log: np.ndarray) -> dict[str, np.ndarray]:
        w, k = self.weights(ids), self.cfg.large_tables
        z = (dense_log.astype(np.float64) - self.dense_mean) / self.dense_std
        return {"large": w[:, :k].sum(1), "small": w[:, k:].sum(1), "dense": z @ self.dense_coef}

    def logit(self, ids: np.ndarray, dense_log: np.ndarray) -> np.ndarray:
        parts = self.terms(ids, dense_log)
        return self.bias + sum(self.scale[name] * parts[name] for name in SHARES)

    def _calibrate(self) -> None:
        """Scale each component to its share of LOGIT_STD**2 and pick the bias giving
        base_ctr, on a fixed sample (so the oracle rebuilds the same numbers)."""
        ids, _, dense, _ = self.sample(np.random.default_rng([self.cfg.seed, 11, 1]), REFERENCE_ROWS)
        logged = dense_log(dense)
        self.dense_mean, self.dense_std = logged.mean(0).astype(np.float64), np.maximum(logged.std(0).astype(np.float64), 1e-6)
        self.scale, self.bias = calibrate(self.terms(ids, logged), SHARES, LOGIT_STD, self.cfg.base_ctr)


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def tsv_lines(labels: np.ndarray, ids: np.ndarray, dense: np.ndarray, dense_missing: np.ndarray) -> bytes:
    """Rows as Criteo TSV, built as one fixed-width byte matrix (dense values right-aligned
    in as many digits as the largest has, ids in 8 hex digits) whose padding and missing
    fields are then dropped: no Python object per cell, which costs ~10x more."""
    n = len(labels)
    wide = len(str(int(dense.max()))) if n else 1
    digits = (dense[..., None] // 10 ** np.arange(wide - 1, -1, -1, dtype=np.int64)) % 10  # [n, 13, wide]
    width = np.maximum(np.floor(np.log10(np.maximum(dense, 1))).astype(np.int64) + 1, 1)
    dense_keep = (np.arange(wide) >= wide - width[..., None]) & ~dense_missing[..., None]
    octets = ids.astype("<u4").view(np.uint8).reshape(n, NUM_SPARSE, 4)[..., ::-1]  # most significant first
    nibbles = np.stack([octets >> 4, octets & 15], axis=-1).reshape(n, NUM_SPARSE, 8)
    tabs = lambda k, kind: np.full((n, k, 1), ord("\t") if kind is np.uint8 else True, kind)  # noqa: E731
    end = lambda kind, v: np.full((n, 1), v, kind)  # noqa: E731
    matrix = np.concatenate([
        (labels[:, None] + ord("0")).astype(np.uint8),
        np.concatenate([tabs(NUM_DENSE, np.uint8), (digits + ord("0")).astype(np.uint8)], axis=2).reshape(n, -1),
        np.concatenate([tabs(NUM_SPARSE, np.uint8), _HEX[nibbles]], axis=2).reshape(n, -1),
        end(np.uint8, 10),
    ], axis=1)  # fmt: skip
    sparse_keep = np.broadcast_to((ids != 0)[..., None], (n, NUM_SPARSE, 8))
    keep = np.concatenate([
        end(bool, True),
        np.concatenate([tabs(NUM_DENSE, bool), dense_keep], axis=2).reshape(n, -1),
        np.concatenate([tabs(NUM_SPARSE, bool), sparse_keep], axis=2).reshape(n, -1),
        end(bool, True),
    ], axis=1)  # fmt: skip
    return matrix[keep].tobytes()


def generate_highcard(out_dir: str, cfg: HighCardConfig, progress: bool = True) -> dict:
    """Write ``part-NNNNN.tsv[.gz]`` and ``synth.json`` into out_dir; returns synth.json's
    dict. Identical configs give identical files."""
    from sklearn.metrics import roc_auc_score

    cfg.validate()
    model = HighCardModel(cfg)
    os.makedirs(out_dir, exist_ok=True)
    names = [f"part-{i:05d}.tsv" + (".gz" if cfg.gzip else "") for i in range(cfg.files)]
    for name in os.listdir(out_dir):  # parts of an earlier, larger run would be read as data
        if name.startswith("part-") and name not in names:
            os.remove(os.path.join(out_dir, name))
    if os.path.exists(os.path.join(out_dir, META_FILE)):
        os.remove(os.path.join(out_dir, META_FILE))
    per_file = [cfg.rows // cfg.files + (i < cfg.rows % cfg.files) for i in range(cfg.files)]
    probs, labels_all, seen = [], [], []
    for i, (name, rows) in enumerate(zip(names, per_file)):
        rng = np.random.default_rng([cfg.seed, 11, 2, i])
        path = os.path.join(out_dir, name)
        with (gzip.open(path + ".tmp", "wb", compresslevel=1) if cfg.gzip else open(path + ".tmp", "wb")) as f:
            for lo in range(0, rows, CHUNK_ROWS):
                n = min(CHUNK_ROWS, rows - lo)
                ids, ranks, dense, dense_missing = model.sample(rng, n)
                p = sigmoid(model.logit(ids, dense_log(dense)))
                labels = (rng.random(n) < p).astype(np.int64)
                f.write(tsv_lines(labels, ids, dense, dense_missing))
                probs.append(p.astype(np.float32))
                labels_all.append(labels.astype(np.int8))
                seen.append(ids[:, : cfg.large_tables])
        os.replace(path + ".tmp", path)
        if progress:
            print(f"[synth] {name}: {rows:,} rows", flush=True)
    p_all, y_all = np.concatenate(probs), np.concatenate(labels_all)
    meta = {
        "format": "criteo-tsv", "generator": GENERATOR, "config": asdict(cfg), "rows": cfg.rows, "files": names,
        "rows_per_file": per_file, "ctr": float(y_all.mean()),
        "best_auc": float(roc_auc_score(y_all, p_all)) if 0 < y_all.sum() < len(y_all) else float("nan"),
        "distinct_ids_seen": distinct_counts(np.concatenate(seen)),  # per large table, in the rows written
    }  # fmt: skip
    with open(os.path.join(out_dir, META_FILE + ".tmp"), "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(os.path.join(out_dir, META_FILE + ".tmp"), os.path.join(out_dir, META_FILE))
    return meta


def distinct_counts(ids: np.ndarray) -> list[int]:
    """Distinct non-missing ids of each column."""
    return [int(len(np.unique(c[c != 0]))) for c in ids.T]


class HighCardOracle:
    """The generator's true click probability of any parsed row, from synth.json alone."""

    def __init__(self, cfg: HighCardConfig) -> None:
        self._model = HighCardModel(cfg)

    @staticmethod
    def from_meta(meta: dict) -> "HighCardOracle":
        return HighCardOracle(HighCardConfig(**meta["config"]))

    def probability(self, batch: Batch) -> np.ndarray:
        return sigmoid(self._model.logit(batch.sparse, batch.dense))
