"""The throughput bench compares like with like: one starting model, every layout that
fits the cores, and a layout that is faster only by learning worse does not count."""

import numpy as np
import pytest
import torch

from dlrover.bench.baseline import build_local_model
from dlrover.bench.throughput import AUC_TOLERANCE, Layout, Measured, bench_spec, job_bench_spec, layouts, rate_layouts, run_throughput_bench
from dlrover.errors import DLRoverError
from dlrover.model.dlrm import table_configs
from dlrover.ps.tables import init_rows


def small_bench_spec():
    spec = bench_spec("/nonexistent", rows=1000, batch_size=64)
    return spec.model_copy(update={"model": spec.model.model_copy(update={"num_embeddings": 997}), "seed": 5})


def test_the_baselines_tables_start_from_the_rows_the_ps_starts_from():
    spec = small_bench_spec()
    model, _ = build_local_model(spec)
    weights = model.sparse_arch.embedding_bag_collection.state_dict()
    for t, cfg in enumerate(table_configs(spec.model)):
        w = weights[f"embedding_bags.{cfg.name}.weight"]
        assert torch.equal(w, init_rows(5, t, 997, spec.model.embedding_dim, np.arange(997))), cfg.name


def test_one_single_threaded_worker_per_core_is_measured_beside_one_worker_using_every_core():
    assert layouts(1) == [Layout(1, 1.0)]
    assert layouts(4) == [Layout(1, 4.0), Layout(4, 1.0)]
    assert [x.label for x in layouts(2)] == ["1w x 2cpu + 1ps", "2w x 1cpu + 1ps"]


def test_the_fastest_layout_counts_only_if_it_learns_as_well_as_the_baseline():
    base = Measured(samples_per_s=1000.0, auc=0.75)
    rows = [
        {"layout": "slow", "samples_per_s": 800.0, "auc": 0.75 - AUC_TOLERANCE / 2},
        {"layout": "fast but worse", "samples_per_s": 900.0, "auc": 0.75 - 2 * AUC_TOLERANCE},
    ]
    best = rate_layouts(rows, base)
    assert best["layout"] == "slow" and best["ratio"] == 0.8
    assert [r["counts"] for r in rows] == [True, False]
    assert rate_layouts([{"layout": "no eval", "samples_per_s": 1.0, "auc": None}], base) is None


def test_a_job_file_is_benched_in_its_own_layout_too_for_one_epoch_in_order():
    spec = job_bench_spec("jobs/dcn_multihot.yaml", Layout(2, 1.0, 2))
    assert (spec.resources.workers, spec.resources.ps, spec.data.epochs, spec.data.shuffle, spec.policy.name) == (2, 2, 1, False, "static")
    assert spec.model.arch == "dcn" and spec.schema.max_ids_per_sample() == 214
    assert layouts(2, Layout(2, 1.0, 2))[-1].label == "2w x 1cpu + 2ps"
    assert layouts(2, Layout(2, 1.0, 1)) == layouts(2)  # already measured


def test_flags_of_the_synthetic_bench_are_refused_with_a_job():
    with pytest.raises(DLRoverError, match="--rows, --batch-size and --steps do not apply with --job"):
        run_throughput_bench(rows=1000, job="jobs/dcn_multihot.yaml")
