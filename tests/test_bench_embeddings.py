"""``dlrover bench embeddings --quick``: hashed vs dynamic large tables at equal memory,
two real jobs on the same high-cardinality rows."""

from __future__ import annotations

import pytest

from dlrover.bench.embeddings import FULL, MAP_BYTES_PER_ROW, hashed_rows, model_mb, row_bytes, run_embeddings_bench
from dlrover.ps.dynamic import MAP_STATES


def test_the_hashed_tables_get_the_rows_the_id_map_costs_so_both_hold_the_same_bytes():
    assert MAP_BYTES_PER_ROW >= MAP_STATES * 8  # the map states, at least
    assert hashed_rows(FULL.capacity) * row_bytes() == pytest.approx(FULL.capacity * (row_bytes() + MAP_BYTES_PER_ROW), rel=1e-4)
    assert model_mb(FULL, dynamic=True) == pytest.approx(model_mb(FULL, dynamic=False), rel=1e-4)


@pytest.mark.timeout(600)
def test_quick_bench_reports_both_kinds_and_both_jobs_train_every_sample(ray_local, tmp_path):
    r = run_embeddings_bench(quick=True, work_dir=str(tmp_path))
    for key in ("auc_hashed", "auc_dynamic", "memory_mb_hashed", "memory_mb_dynamic", "samples_per_s_hashed", "samples_per_s_dynamic", "evictions"):
        assert key in r, key
    assert 0.5 < r["auc_hashed"] < r["best_auc"] and 0.5 < r["auc_dynamic"] < r["best_auc"]
    assert r["samples_hashed"] == r["samples_expected_hashed"] == r["samples_dynamic"] == r["samples_expected_dynamic"] > 0
    c = r["dynamic_counts"]  # one training lookup per sample and dynamic table (a missing value is id 0)
    assert c["lookups"] == 4 * r["samples_dynamic"] and c["admitted"] > 0 and c["hits"] + c["defaults"] <= c["lookups"]
    assert r["memory_mb_hashed"] == pytest.approx(r["memory_mb_dynamic"], rel=1e-3) and r["ps_rss_mb_dynamic"] > 0
