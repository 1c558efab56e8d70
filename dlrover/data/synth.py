"""Learnable synthetic Criteo data with a known best-possible AUC.

Real Criteo data is large and has no ground truth, so a training run on it cannot
tell "the model is as good as it gets" from "the model is broken". Here labels are
drawn from a planted click model, so the oracle AUC (true probability vs sampled
labels) is the ceiling a trained DLRM should approach.

The planted logit has the three kinds of signal a DLRM captures:

* first-order weights per categorical value (embedding + top MLP),
* ``a_j * standardised(log1p(max(I_j, 0)))`` per dense feature (bottom MLP),
* rank-4 dot products between a few pairs of tables (DLRM's dot interaction).

Categorical values are Zipf-distributed, and weights of rare values are shrunk, so
the signal sits in values a model sees often enough to learn from ~300k rows.
Every parameter is regenerated from the seed, so ``synth.json`` holds only the
config plus summary numbers and :class:`Oracle` rebuilds the model from it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import asdict, dataclass

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.criteo import NUM_DENSE, NUM_SPARSE
from dlrover.data.planted import calibrate, dense_log, sigmoid
from dlrover.data.synth_clicklog import GENERATOR as CLICKLOG_GENERATOR
from dlrover.data.synth_highcard import GENERATOR as HIGHCARD_GENERATOR, HighCardOracle
from dlrover.data.synth_schema import GENERATOR as SCHEMA_GENERATOR
from dlrover.errors import DataError, DLRoverError
from dlrover.hashing import splitmix64

GENERATOR = "dlrover.synth/1"
META_FILE = "synth.json"

_CHUNK_ROWS = 100_000
_REF_ROWS = 300_000  # data size the shrinkage of rare values is tuned for
# A value expected this often in _REF_ROWS rows keeps half its weight variance. Large on
# purpose: a DLRM trained for ~2 epochs on ~300k rows learns frequent values well but
# only memorises noise for rare ones, so the planted signal lives in the head.
_SHRINK_COUNT = 30_000
_RANK = 4
_NUM_PAIRS = 3
_UNINFORMATIVE_TABLES = 5
_UNINFORMATIVE_DENSE = 3
_LOGIT_STD = 1.2  # total planted-logit spread; sets the best AUC (~0.78)
# Shares of the logit variance. First-order effects are the quickest for a DLRM to pick
# up; dense and pairwise terms take more steps, so they get smaller shares.
_SHARES = {"dense": 0.2, "first": 0.65, "pairs": 0.15}
_REFERENCE_SAMPLE = 40_000
_DENSE_STR_MAX = 1 << 16  # dense values below this are formatted by table lookup
_MASK64 = (1 << 64) - 1
_PART_RE = re.compile(r"^part-\d{5}\.tsv(\.gz)?$")


@dataclass
class SynthConfig:
    """What ``dlrover data synth`` generates; all of it is stored in synth.json."""

    rows: int
    files: int
    seed: int = 0
    vocab_sizes: list[int] | None = None
    zipf: float = 1.1
    missing_rate: float = 0.02
    base_ctr: float = 0.25
    gzip: bool = False

    def validate(self) -> None:
        if self.rows < 1 or self.files < 1:
            raise DLRoverError(f"synth: rows and files must be >= 1, got {self.rows}/{self.files}")
        if self.files > self.rows:
            raise DLRoverError(f"synth: more files ({self.files}) than rows ({self.rows})")
        if self.seed < 0:
            raise DLRoverError(f"synth: seed must be >= 0, got {self.seed}")
        if self.vocab_sizes is not None and (
            len(self.vocab_sizes) != NUM_SPARSE or min(self.vocab_sizes) < 1
        ):
            raise DLRoverError(f"synth: vocab_sizes must be {NUM_SPARSE} sizes >= 1")
        if not 0 <= self.missing_rate < 1:
            raise DLRoverError(f"synth: missing_rate must be in [0, 1), got {self.missing_rate}")
        if not 0 < self.base_ctr < 1:
            raise DLRoverError(f"synth: base_ctr must be in (0, 1), got {self.base_ctr}")
        if self.zipf < 0:
            raise DLRoverError(f"synth: zipf must be >= 0, got {self.zipf}")


def default_vocab_sizes(seed: int) -> list[int]:
    """26 sizes spread log-uniformly over ~4..~20000 (jittered, shuffled by seed)."""
    rng = np.random.default_rng([seed, 7, 0])
    sizes = np.geomspace(4, 20_000, NUM_SPARSE) * np.exp(rng.uniform(-0.15, 0.15, NUM_SPARSE))
    return [int(s) for s in rng.permutation(np.maximum(np.round(sizes), 2))]


def _value_hashes(seed: int, table: int, size: int) -> np.ndarray:
    """Distinct non-zero 32-bit ids for the values of one table (0 means missing)."""
    base = np.uint64((seed * 0x9E3779B97F4A7C15 + table * 0xD1B54A32D192ED03) & _MASK64)
    values = np.arange(size, dtype=np.uint64)
    hashes = (splitmix64(values + base) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    salt = 0
    while True:  # rehash collisions (and zero) with a new salt until all distinct
        _, first = np.unique(hashes, return_index=True)
        clash = np.ones(size, bool)
        clash[first] = False
        clash |= hashes == 0
        if not clash.any():
            return hashes
        salt += 1
        salted = values[clash] + base + np.uint64((salt * 0x2545F4914F6CDD1D) & _MASK64)
        hashes[clash] = (splitmix64(salted) & np.uint64(0xFFFFFFFF)).astype(np.int64)


class _Model:
    """The planted click model, rebuilt deterministically from a config."""

    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        vocab = cfg.vocab_sizes or default_vocab_sizes(cfg.seed)
        self.vocab = [int(v) for v in vocab]
        rng = np.random.default_rng([cfg.seed, 7, 1])

        self.cdf: list[np.ndarray] = []
        self.hashes: list[np.ndarray] = []
        shrink: list[np.ndarray] = []
        for t, size in enumerate(self.vocab):
            p = (np.arange(size) + 1.0) ** -cfg.zipf
            p /= p.sum()
            self.cdf.append(np.cumsum(p))
            self.hashes.append(_value_hashes(cfg.seed, t, size))
            count = p * _REF_ROWS
            shrink.append(np.sqrt(count / (count + _SHRINK_COUNT)))

        table_std = rng.uniform(0.4, 1.0, NUM_SPARSE)
        dead = rng.choice(NUM_SPARSE, _UNINFORMATIVE_TABLES, replace=False)
        table_std[dead] = 0.0
        # Index -1 (missing) lands on the appended zero, so lookups need no masking.
        self.weights = [
            np.append(rng.normal(0, 1, size) * table_std[t] * shrink[t], 0.0)
            for t, size in enumerate(self.vocab)
        ]
        live = [t for t in range(NUM_SPARSE) if table_std[t] > 0 and self.vocab[t] >= 8]
        num_pairs = min(_NUM_PAIRS, len(live) // 2)
        picks = rng.choice(len(live), 2 * num_pairs, replace=False)
        self.pairs = [(live[picks[2 * i]], live[picks[2 * i + 1]]) for i in range(num_pairs)]
        self.factors = {
            t: np.vstack([rng.normal(0, 1, (self.vocab[t], _RANK)) * shrink[t][:, None],
                          np.zeros((1, _RANK))])
            for pair in self.pairs for t in pair
        }

        self.dense_mu = rng.uniform(0.5, 3.5, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.7, 1.4, NUM_DENSE)
        self.dense_coef = rng.normal(0, 1, NUM_DENSE)
        self.dense_coef[rng.choice(NUM_DENSE, _UNINFORMATIVE_DENSE, replace=False)] = 0.0
        self.dense_mean = np.zeros(NUM_DENSE)
        self.dense_std = np.ones(NUM_DENSE)
        self.scale = {name: 1.0 for name in _SHARES}
        self.bias = 0.0
        self._calibrate()
        # For mapping decoded values back to ids: hashes sorted, and their ids.
        self._order = [np.argsort(h) for h in self.hashes]
        self._sorted = [h[o] for h, o in zip(self.hashes, self._order)]

    # -- sampling ----------------------------------------------------------------

    def sample(
        self, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw n rows: (ids [n,26] with -1 = missing, dense ints [n,13], dense-missing)."""
        u = rng.random((n, NUM_SPARSE))
        ids = np.empty((n, NUM_SPARSE), np.int64)
        for t in range(NUM_SPARSE):
            ids[:, t] = np.minimum(np.searchsorted(self.cdf[t], u[:, t], side="right"),
                                   self.vocab[t] - 1)
        ids[rng.random((n, NUM_SPARSE)) < self.cfg.missing_rate] = -1

        z = rng.standard_normal((n, NUM_DENSE))
        dense = np.floor(np.exp(self.dense_mu + self.dense_sigma * z)).astype(np.int64)
        negative = rng.random(n) < 0.1  # I2 has small negative values, as in Criteo
        dense[negative, 1] = -rng.integers(1, 4, int(negative.sum()))
        dense_missing = rng.random((n, NUM_DENSE)) < self.cfg.missing_rate
        dense[dense_missing] = 0
        return ids, dense, dense_missing

    # -- the click model ---------------------------------------------------------

    def terms(self, ids: np.ndarray, dense_log: np.ndarray) -> dict[str, np.ndarray]:
        """Unscaled logit components for observed rows (missing = id -1, dense 0)."""
        z = (dense_log.astype(np.float64) - self.dense_mean) / self.dense_std
        first = np.zeros(len(ids))
        for t in range(NUM_SPARSE):
            first += self.weights[t][ids[:, t]]
        pairs = np.zeros(len(ids))
        for a, b in self.pairs:
            pairs += np.einsum("nk,nk->n", self.factors[a][ids[:, a]], self.factors[b][ids[:, b]])
        return {"dense": z @ self.dense_coef, "first": first, "pairs": pairs}

    def logit(self, ids: np.ndarray, dense_log: np.ndarray) -> np.ndarray:
        parts = self.terms(ids, dense_log)
        return self.bias + sum(self.scale[k] * parts[k] for k in _SHARES)

    def _calibrate(self) -> None:
        """Standardise dense features, scale each component to its share of the target
        logit variance, and pick the bias that gives base_ctr, all on a fixed sample."""
        rng = np.random.default_rng([self.cfg.seed, 7, 2])
        ids, dense, _ = self.sample(rng, _REFERENCE_SAMPLE)
        logged = dense_log(dense)
        self.dense_mean = logged.mean(axis=0).astype(np.float64)
        self.dense_std = np.maximum(logged.std(axis=0).astype(np.float64), 1e-6)
        self.scale, self.bias = calibrate(self.terms(ids, logged), _SHARES, _LOGIT_STD, self.cfg.base_ctr)

    def ids_from_values(self, sparse: np.ndarray) -> np.ndarray:
        """Map decoded categorical values back to value ids (-1 for missing/unknown)."""
        ids = np.full(sparse.shape, -1, np.int64)
        for t in range(NUM_SPARSE):
            keys = self._sorted[t]
            pos = np.minimum(np.searchsorted(keys, sparse[:, t]), len(keys) - 1)
            found = keys[pos] == sparse[:, t]
            ids[:, t] = np.where(found, self._order[t][pos], -1)
        return ids


# ------------------------------------------------------------------------- writing


class _Formatter:
    """Turns sampled rows into TSV text via lookup tables of pre-made strings; the
    per-row work is then one ``"\\t".join`` over object references."""

    def __init__(self, model: _Model) -> None:
        # index 0 = missing (""), index k+4 = value k for k >= -3
        self.dense = np.array([""] + [str(v) for v in range(-3, _DENSE_STR_MAX)], dtype=object)
        self.hex = [
            np.array([f"{h:08x}" for h in hashes.tolist()] + [""], dtype=object)
            for hashes in model.hashes
        ]
        self.label = np.array(["0", "1"], dtype=object)

    def lines(self, labels: np.ndarray, ids: np.ndarray, dense: np.ndarray,
              dense_missing: np.ndarray) -> bytes:
        n = len(labels)
        cells = np.empty((n, 1 + NUM_DENSE + NUM_SPARSE), dtype=object)
        cells[:, 0] = self.label[labels]
        idx = np.where(dense_missing, 0, dense + 4)
        big = idx >= len(self.dense)
        cells[:, 1 : 1 + NUM_DENSE] = self.dense[np.where(big, 0, idx)]
        if big.any():
            cells[:, 1 : 1 + NUM_DENSE][big] = [str(v) for v in dense[big].tolist()]
        for t in range(NUM_SPARSE):
            cells[:, 1 + NUM_DENSE + t] = self.hex[t][ids[:, t]]
        return ("\n".join(map("\t".join, cells.tolist())) + "\n").encode("ascii")


def _split_rows(rows: int, files: int) -> list[int]:
    return [rows // files + (1 if i < rows % files else 0) for i in range(files)]


def generate(out_dir: str, cfg: SynthConfig, progress: bool = True) -> dict:
    """Write ``part-00000.tsv`` ... (or ``.tsv.gz``) and ``synth.json`` into out_dir;
    returns the synth.json dict. Output is identical for identical configs."""
    from sklearn.metrics import roc_auc_score
    from tqdm import tqdm

    cfg.validate()
    if cfg.vocab_sizes is None:
        cfg = SynthConfig(**{**asdict(cfg), "vocab_sizes": default_vocab_sizes(cfg.seed)})
    model = _Model(cfg)
    fmt = _Formatter(model)
    os.makedirs(out_dir, exist_ok=True)
    names = [f"part-{i:05d}.tsv" + (".gz" if cfg.gzip else "") for i in range(cfg.files)]
    _remove_stale_parts(out_dir, set(names))

    probs: list[np.ndarray] = []
    labels_all: list[np.ndarray] = []
    with tqdm(total=cfg.rows, unit=" rows", desc="synth", disable=None if progress else True) as bar:  # None: no bar where stderr is not a terminal
        for i, (name, rows) in enumerate(zip(names, _split_rows(cfg.rows, cfg.files))):
            rng = np.random.default_rng([cfg.seed, 7, 3, i])
            path = os.path.join(out_dir, name)
            tmp = path + ".tmp"
            opener = gzip.open(tmp, "wb", compresslevel=1) if cfg.gzip else open(tmp, "wb")
            with opener as f:
                for lo in range(0, rows, _CHUNK_ROWS):
                    n = min(_CHUNK_ROWS, rows - lo)
                    ids, dense, dense_missing = model.sample(rng, n)
                    p = sigmoid(model.logit(ids, dense_log(dense)))
                    labels = (rng.random(n) < p).astype(np.int64)
                    f.write(fmt.lines(labels, ids, dense, dense_missing))
                    probs.append(p.astype(np.float32))
                    labels_all.append(labels.astype(np.int8))
                    bar.update(n)
            os.replace(tmp, path)

    p_all, y_all = np.concatenate(probs), np.concatenate(labels_all)
    auc = float(roc_auc_score(y_all, p_all)) if 0 < y_all.sum() < len(y_all) else float("nan")
    meta = {
        "format": "criteo-tsv",
        "config": asdict(cfg),
        "rows": cfg.rows,
        "files": names,
        "rows_per_file": _split_rows(cfg.rows, cfg.files),
        "ctr": float(y_all.mean()),
        "best_auc": auc,
        "model": {"bias": model.bias, "logit_std": _LOGIT_STD, "pairs": model.pairs},
        "generator": GENERATOR,
    }
    tmp = os.path.join(out_dir, META_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, META_FILE))
    return meta


def _remove_stale_parts(out_dir: str, keep: set[str]) -> None:
    """A re-run with fewer files must not leave old parts to be globbed as data; only
    our own part names in a directory we generated before are touched."""
    if not os.path.exists(os.path.join(out_dir, META_FILE)):
        return
    for name in os.listdir(out_dir):
        if _PART_RE.match(name) and name not in keep:
            os.remove(os.path.join(out_dir, name))


# ------------------------------------------------------------------------- oracle


class Oracle:
    """Recomputes the generator's true click probability for any parsed row, from
    synth.json alone."""

    def __init__(self, cfg: SynthConfig) -> None:
        self._model = _Model(cfg)

    @staticmethod
    def from_dir(data_dir: str) -> "Oracle | HighCardOracle | None":
        """The oracle for a synth output directory (or a file in it), the high-cardinality
        generator's for its data; None if no generator wrote it (no synth.json)."""
        if os.path.isfile(data_dir):
            data_dir = os.path.dirname(data_dir)
        path = os.path.join(data_dir, META_FILE)
        if not os.path.isfile(path):
            return None
        try:
            with open(path) as f:
                meta = json.load(f)
            if meta.get("generator") == HIGHCARD_GENERATOR:
                return HighCardOracle.from_meta(meta)
            if meta.get("generator") in (SCHEMA_GENERATOR, CLICKLOG_GENERATOR):
                return None  # a schema's (or the click log's) synthetic data: synth.json has its best AUC, no per-row oracle
            cfg = SynthConfig(**meta["config"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path}: not a valid synth.json: {e}") from None
        if meta.get("generator") != GENERATOR:
            raise DataError(f"{path}: generator {meta.get('generator')!r}, expected {GENERATOR!r}")
        return Oracle(cfg)

    def logit(self, batch: Batch) -> np.ndarray:
        ids = self._model.ids_from_values(batch.sparse)
        return self._model.logit(ids, batch.dense)

    def probability(self, batch: Batch) -> np.ndarray:
        """True click probability (float64 [N]) of each row as the model sees it."""
        return sigmoid(self.logit(batch))


def best_auc(oracle: Oracle, batch: Batch) -> float:
    """AUC of the true probability against the sampled labels: the ceiling for any
    model evaluated on these rows."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(batch.labels, oracle.probability(batch)))
