"""The click log of ``dlrover bench embeddings --multi-hot``: string ids, a multi-valued
history, read by the job's own schema, the same files for the same config."""

from __future__ import annotations

import numpy as np

from dlrover.bench.embeddings import QUICK_MULTI_HOT, bench_spec
from dlrover.data.criteo import index_file
from dlrover.data.reader import FileReader
from dlrover.data.synth import Oracle
from dlrover.data.synth_clicklog import FEATURES, ClickLogConfig, generate_clicklog


def test_the_click_log_reads_with_its_schema_and_has_a_learnable_signal(tmp_path):
    meta = generate_clicklog(str(tmp_path), ClickLogConfig(rows=4000, files=2, seed=1), progress=False)
    assert 0.6 < meta["best_auc"] < 1 and 0.1 < meta["ctr"] < 0.5
    users, items, history = meta["distinct_ids_seen"]
    assert history > items > 0 and users > 0  # the history holds ~10 items a row
    layout = bench_spec(str(tmp_path), QUICK_MULTI_HOT, dynamic=True).layout()
    assert [f.column for f in layout.schema.sparse][:3] == ["user_id", "item_id", "history"]
    idx = index_file(str(tmp_path / "part-00000.csv"), layout=layout)
    batch, bad = FileReader(layout=layout).read(idx, 0, idx.rows)
    hist = batch.lengths[layout.schema.feature_names.index("history")]
    assert bad == 0 and len(batch) == 2000 and hist.min() >= 1 and hist.max() <= FEATURES["sparse"][2]["max_len"]
    assert (batch.lengths[[0, 1]] == 1).all()  # one user and one item a row
    assert Oracle.from_dir(str(tmp_path)) is None  # synth.json has the best AUC; there is no per-row oracle


def test_the_same_config_writes_the_same_files(tmp_path):
    for d in ("a", "b"):
        generate_clicklog(str(tmp_path / d), ClickLogConfig(rows=500, files=1, seed=4), progress=False)
    assert (tmp_path / "a" / "part-00000.csv").read_bytes() == (tmp_path / "b" / "part-00000.csv").read_bytes()


def test_the_dynamic_job_makes_the_three_large_tables_dynamic_and_pools_the_history_by_mean(tmp_path):
    hashed, dynamic = (bench_spec(str(tmp_path), QUICK_MULTI_HOT, d).schema for d in (False, True))
    kinds = [t.spec.kind.value for t in dynamic.tables]
    assert kinds[:3] == ["dynamic"] * 3 and set(kinds[3:]) == {"hashed"}
    assert {t.name for t in hashed.tables if t.spec.pooling.value == "mean"} == {"history"} == {t.name for t in dynamic.tables if t.spec.pooling.value == "mean"}
    assert np.sum(hashed.table_sizes()[:3]) > np.sum(dynamic.table_sizes()[:3])  # the map's bytes buy the hashed tables rows
