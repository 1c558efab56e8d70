"""The high-cardinality generator (``dlrover data synth --high-cardinality``): Zipf ids
over 10M values per large table, weights of the same spread in head and tail, and an
oracle rebuilt from synth.json."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from dlrover.cli.main import main
from dlrover.data.synth import Oracle
from dlrover.data.planted import sigmoid
from dlrover.data.synth_highcard import HighCardConfig, HighCardModel, generate_highcard, permute32
from dlrover.data.tsv import read_whole_tsv

ROWS = 200_000


@pytest.fixture(scope="module")
def sample() -> tuple[HighCardModel, np.ndarray, np.ndarray, np.ndarray]:
    """(model, ids, ranks of the large tables, labels) of ROWS rows under the defaults."""
    model = HighCardModel(HighCardConfig(rows=ROWS, files=1, seed=4))
    rng = np.random.default_rng(0)
    ids, ranks, dense, _ = model.sample(rng, ROWS)
    labels = rng.random(ROWS) < sigmoid(model.logit(ids, np.log1p(dense.astype(np.float32))))
    return model, ids, ranks, labels


def test_ids_of_distinct_ranks_are_distinct_and_never_the_missing_value():
    ranks = np.arange(1, 1 << 22, dtype=np.uint64)
    ids = permute32(ranks ^ np.uint64(0x9E3779B9))
    assert len(np.unique(ids)) == len(ranks) and ids.min() > 0 and ids.max() < 1 << 32


def test_large_tables_spread_over_ten_million_values_with_a_zipf_head(sample):
    model, ids, ranks, _ = sample
    assert model.cfg.distinct_ids == 10_000_000 and model.cfg.large_tables == 4
    assert ranks.max() > 5_000_000  # the support is used to its end
    seen = [len(np.unique(ids[:, t][ids[:, t] != 0])) for t in range(4)]
    assert all(60_000 < n < 120_000 for n in seen), seen  # s = 1 over 10M: ~90k distinct in 200k draws
    counts = np.bincount(ranks[:, 0], minlength=101)[1:101]
    slope = np.polyfit(np.log(np.arange(10, 100)), np.log(counts[9:99]), 1)[0]
    assert -1.15 < slope < -0.85, slope  # frequency ~ rank**-1


def test_the_tail_carries_as_much_weight_as_the_head_and_predicts_labels(sample):
    model, ids, ranks, labels = sample
    w = model.weights(ids)[:, 0]
    head, tail = ranks[:, 0] <= 100, ranks[:, 0] > 10_000
    assert tail.mean() > 0.3  # a third of the lookups go to ids beyond the first 10,000
    assert abs(np.std(w[tail]) - 1.0) < 0.05 and abs(np.std(np.unique(w[head])) - 1.0) < 0.3
    assert roc_auc_score(labels[tail], w[tail]) > 0.56  # one table's weight alone, on tail ids only


def test_same_seed_same_files_and_the_oracle_rebuilds_the_best_auc(tmp_path):
    a, b, c = (str(tmp_path / n) for n in "abc")
    meta = generate_highcard(a, HighCardConfig(rows=3000, files=2, seed=1), progress=False)
    generate_highcard(b, HighCardConfig(rows=3000, files=2, seed=1), progress=False)
    generate_highcard(c, HighCardConfig(rows=3000, files=2, seed=2), progress=False)
    part = "part-00001.tsv"
    assert open(os.path.join(a, part), "rb").read() == open(os.path.join(b, part), "rb").read()
    assert open(os.path.join(a, part), "rb").read() != open(os.path.join(c, part), "rb").read()
    rows = [read_whole_tsv(os.path.join(a, name), "fail")[0] for name in meta["files"]]
    assert sum(len(r.labels) for r in rows) == 3000 and meta["distinct_ids_seen"][0] > 1000
    oracle = Oracle.from_dir(a)
    batches = [r.batch() for r in rows]
    probs = np.concatenate([oracle.probability(bt) for bt in batches])
    labels = np.concatenate([bt.labels for bt in batches])
    assert roc_auc_score(labels, probs) == pytest.approx(meta["best_auc"], abs=1e-6)


def test_distinct_ids_without_high_cardinality_is_one_error_line_naming_the_option(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path), "--distinct-ids", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--distinct-ids" in err[0] and "--high-cardinality" in err[0]
    assert not os.listdir(tmp_path)
