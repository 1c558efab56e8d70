"""The big-table bench's flow on small tables (``dlrover bench bigtable --quick``): a job
with Criteo-Kaggle-shaped tables over 4 PS trains, goes to 6 PS and back to 4 while it
trains, and checkpoints; every bag update is applied exactly once through both moves."""

from __future__ import annotations

import pytest

from dlrover.bench.bigtable import KAGGLE_VOCAB, model_bytes, run_bigtable_bench, table_sizes


def test_table_sizes_are_kaggles_capped_and_the_full_model_is_over_4_gb():
    sizes = table_sizes(3_500_000)
    assert len(sizes) == 26 and max(sizes) == 3_500_000 and sizes[0] == KAGGLE_VOCAB[0]
    assert model_bytes(sizes) >= 4 * 2**30


@pytest.mark.timeout(600)
def test_a_kaggle_shaped_job_rescales_its_ps_4_6_4_and_checkpoints(ray_local, tmp_path):
    r = run_bigtable_bench(quick=True, work_dir=str(tmp_path))
    assert r["status"] == "succeeded" and r["ps_bags_updated"] == r["bags_expected"]
    assert [s["kind"] for s in r["scales"]] == ["scale_out", "scale_in"], r["scales"]
    assert all(s["vshards_moved"] > 0 and s["bytes_moved"] > 0 and s["precopy_gb_per_s"] > 0 for s in r["scales"])
    assert len(r["ps_rss_mb"]) == 6  # the two added PS served and reported their memory
    assert r["durable_checkpoints"] and r["durable_checkpoints"][0]["bytes"] > r["model_bytes"] / 2
