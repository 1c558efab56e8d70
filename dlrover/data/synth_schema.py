"""Learnable synthetic data for any feature schema, with a known best AUC.

Every sparse feature has a vocabulary of tokens (Zipf-popular, each with a weight drawn
once), every dense column a coefficient on its transformed value; a row's click
probability is ``sigmoid(bias + sum of the features' contributions)``. A multi-valued
feature holds 0..max_len tokens a row (always max_len with ``fixed_bags``) and contributes their mean weight where its table
pools by mean, their sum otherwise, so the schema's own model can represent the truth.
Single-valued features are missing in ``MISSING`` of the rows (an empty value).

Files are written in the spec's layout (CSV or TSV with a header, or headerless in
``data.columns`` order; Parquet with list columns for multi-valued features without a
separator), then ``synth.json`` last with the generator, the row count and the best
AUC (that of the true probabilities).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np

from dlrover.data.layout import DataLayout
from dlrover.data.schema import IdKind, SparseFeature, Transform
from dlrover.table_spec import Pooling

if TYPE_CHECKING:
    from dlrover.spec import JobSpec

GENERATOR = "dlrover.synth-schema/1"
META_FILE = "synth.json"
MISSING = 0.02
_BIAS = -1.0  # about 30% clicks


@dataclass(frozen=True)
class SchemaSynthConfig:
    rows: int = 100_000
    files: int = 4
    seed: int = 0
    fixed_bags: bool = False  # every multi-valued bag holds max_len ids (MLPerf's materialised multi-hot)


class _Truth:
    """The generator's model: token weights, popularity, dense coefficients."""

    def __init__(self, layout: DataLayout, seed: int, fixed_bags: bool = False) -> None:
        s = layout.schema
        rng = np.random.default_rng([seed, 11])
        f = len(s.sparse)
        self.vocab = [int(v) for v in np.geomspace(8, 1000, f)] if f > 1 else [200]
        rng.shuffle(self.vocab)
        self.weights = [rng.normal(0, rng.uniform(0.3, 0.9), v) for v in self.vocab]
        self.popularity = [(1.0 / np.arange(1, v + 1) ** 1.1) / np.sum(1.0 / np.arange(1, v + 1) ** 1.1) for v in self.vocab]
        self.dense_mu = rng.uniform(0.5, 3.0, len(s.dense))
        self.dense_coef = rng.normal(0, 0.5, len(s.dense))
        self.schema, self.fixed_bags = s, fixed_bags

    def sample(self, rng: np.random.Generator, n: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
        """Per feature (token indices flat, lengths [n]); dense raw values [n, D]; logits [n]."""
        logit = np.full(n, _BIAS)
        bags = []
        for i, feat in enumerate(self.schema.sparse):
            if feat.multi:
                lengths = np.full(n, feat.max_len) if self.fixed_bags else rng.integers(0, feat.max_len + 1, n)
            else:
                lengths = (rng.random(n) >= MISSING).astype(np.int64)
            tokens = rng.choice(self.vocab[i], size=int(lengths.sum()), p=self.popularity[i])
            contrib = np.bincount(np.repeat(np.arange(n), lengths), weights=self.weights[i][tokens], minlength=n)
            if feat.multi and self.schema.tables[feat.table].spec.pooling is Pooling.MEAN:
                contrib = contrib / np.maximum(lengths, 1)
            elif feat.multi:
                contrib = contrib / np.sqrt(feat.max_len)  # a sum of many weights: keep it on the others' scale
            logit += contrib
            bags.append((tokens, lengths))
        dense = np.floor(np.exp(self.dense_mu + rng.standard_normal((n, len(self.schema.dense)))))
        for j, d in enumerate(self.schema.dense):
            x = np.log1p(dense[:, j]) if d.transform is Transform.LOG1P else dense[:, j]
            logit += self.dense_coef[j] * (x - self.dense_mu[j])
        return bags, dense, logit


def _tokens(feat: SparseFeature, idx: np.ndarray, layout_text: bool) -> np.ndarray:
    """The values of token indices as the file holds them."""
    kind = feat.ids or (IdKind.STRING if layout_text else IdKind.INT)
    if kind is IdKind.INT:
        return idx.astype(np.int64) * 7919 + 13
    if kind is IdKind.HEX:
        return np.char.mod("%x", idx.astype(np.int64) * 7919 + 13)
    return np.char.add(f"{feat.column[:3]}-", idx.astype(str))


def _column(feat: SparseFeature, tokens: np.ndarray, lengths: np.ndarray, parquet: bool):
    """One feature's Arrow column: scalars (empty where missing), lists, or joined text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = _tokens(feat, tokens, layout_text=not parquet)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    if not feat.multi:  # a missing value: null (an empty field in text)
        mask = lengths == 0
        full = np.zeros(len(lengths), dtype=values.dtype)
        full[~mask] = values
        return pa.array(full, mask=mask)
    listed = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    if parquet and feat.separator is None:
        return listed
    text = listed if values.dtype.kind == "U" else pa.ListArray.from_arrays(pa.array(offsets), pc.cast(pa.array(values), pa.string()))
    return pc.binary_join(text, feat.separator or "|")


def synth_format(spec: "JobSpec") -> str:
    """The file format to generate for a spec: its data.format, else what its paths end in."""
    fmt = spec.data.format
    if fmt in ("csv", "tsv", "parquet"):
        return fmt
    first = spec.data.paths[0].lower()
    return "parquet" if first.endswith((".parquet", ".pq")) else "tsv" if first.endswith((".tsv", ".txt")) else "csv"


def generate_for_schema(out_dir: str, layout: DataLayout, cfg: SchemaSynthConfig, fmt: str = "csv") -> dict:
    """Write ``part-0000k.{csv,tsv,parquet}`` and ``synth.json`` into ``out_dir``; the
    same config gives the same files. ``fmt``: csv, tsv or parquet."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    s = layout.schema
    truth = _Truth(layout, cfg.seed, cfg.fixed_bags)
    os.makedirs(out_dir, exist_ok=True)
    ext = {"csv": "csv", "tsv": "tsv", "parquet": "parquet"}[fmt]
    names = [f"part-{i:05d}.{ext}" for i in range(cfg.files)]
    per_file = [cfg.rows // cfg.files + (i < cfg.rows % cfg.files) for i in range(cfg.files)]
    probs, labels_all = [], []
    for i, (name, n) in enumerate(zip(names, per_file)):
        rng = np.random.default_rng([cfg.seed, 5, i])
        bags, dense, logit = truth.sample(rng, n)
        p = 1 / (1 + np.exp(-logit))
        clicks = (rng.random(n) < p).astype(np.int64)
        probs.append(p)
        labels_all.append(clicks)
        t = s.label.threshold
        cols = {s.label.column: pa.array(clicks if t is None else np.where(clicks == 1, t + 1, t - 1))}
        for j, d in enumerate(s.dense):
            cols[d.column] = pa.array(dense[:, j])
        for feat, (tokens, lengths) in zip(s.sparse, bags):
            cols[feat.column] = _column(feat, tokens, lengths, parquet=fmt == "parquet")
        order = list(layout.columns) if layout.columns else list(cols)
        table = pa.table({c: cols[c] for c in order if c in cols})
        path = os.path.join(out_dir, name)
        tmp = path + ".tmp"
        if fmt == "parquet":
            pq.write_table(table, tmp, row_group_size=max(1, min(n, 65_536)))
        else:
            sep = layout.delimiter or ("\t" if fmt == "tsv" else ",")
            pacsv.write_csv(table, tmp, pacsv.WriteOptions(include_header=layout.header, delimiter=sep, quoting_style="needed"))
        os.replace(tmp, path)
    labels, p_all = np.concatenate(labels_all), np.concatenate(probs)
    meta = {
        "generator": GENERATOR, "config": {"rows": cfg.rows, "files": cfg.files, "seed": cfg.seed, "format": fmt, "fixed_bags": cfg.fixed_bags},
        "files": names, "rows": cfg.rows, "ctr": float(labels.mean()),
        "best_auc": float(roc_auc_score(labels, p_all)) if 0 < labels.sum() < len(labels) else None,
    }  # fmt: skip
    tmp = os.path.join(out_dir, META_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, META_FILE))
    return meta
