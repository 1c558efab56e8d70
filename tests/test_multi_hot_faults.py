"""Multi-hot bags through a live PS rescale and through a PS killed under ``recovery.ps:
partial``: the id accounting stays exact (each id of each trained row applied once, or
counted as lost with the dead PS)."""

from __future__ import annotations

import pytest

from conftest import events_of, sleepy
from dlrover.data.synth_schema import SchemaSynthConfig, generate_for_schema
from dlrover.spec import spec_from_dict

FEATURES = {
    "label": "y",
    "dense": ["d"],
    "sparse": [{"column": "user", "ids": "int"}, {"column": "history", "max_len": 12}, {"column": "tags", "separator": "|", "max_len": 4}],
}


@pytest.fixture(scope="module")
def multi_hot_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("multi_hot")
    spec = _spec(d, {})
    generate_for_schema(str(d), spec.layout(), SchemaSynthConfig(rows=30_000, files=2, seed=2), "parquet")
    return d


def _spec(data_dir, over: dict, epochs: int = 3):
    doc = {
        "name": "mh", "features": FEATURES,
        "model": {"embedding_dim": 8, "num_embeddings": 3000, "dense_arch": [16, 8], "over_arch": [32, 1], "tables": {"history": {"pooling": "mean"}}},
        "data": {"paths": [f"{data_dir}/*.parquet"], "epochs": epochs, "batch_size": 256, "eval_fraction": 0.1, "shard_rows": 2048},
        "resources": {"workers": 2, "ps": 2, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 2048, "ps_memory_mb": 1024},
        "train": {"log_every_s": 0.5},
    }  # fmt: skip
    doc.update(over)
    return spec_from_dict(doc)


def test_a_live_ps_rescale_applies_every_id_once(ray_local, multi_hot_dir, tmp_path):
    from dlrover.driver.runner import run_job

    # The scale-out fires at the first tick. Both workers run 6x slower (sleeping, so the
    # new PS's process gets the cores): training outlasts its start on a busy machine too.
    steps = [{"at_s": 0.0, "workers": 2, "ps": 3}]
    policy = {"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.2, "warmup_s": 0.2, "history_dir": str(tmp_path / "h")}
    spec = _spec(multi_hot_dir, {"policy": policy, "resources": {"workers": 2, "ps": 2, "budget_cpu": 8}, "chaos": sleepy(6)}, epochs=5)
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_trained"] == s["samples_expected"]
    assert [e["kind"] for e in s["scale_events"]] == ["scale_out"] and s["scale_events"][0]["vshards_moved"] > 0, s["scale_events"]
    assert s["ps_ids_updated"] == s["ids_expected"] > 3 * s["samples_expected"]  # multi-hot: more ids than features


def test_a_killed_ps_under_partial_recovery_keeps_the_id_accounting_exact(ray_local, multi_hot_dir, tmp_path):
    from dlrover.driver.runner import run_job

    over = {
        "chaos": [{"at_s": 4, "action": "kill", "target": "ps:1"}],
        "checkpoint": {"memory_interval_s": 2.0, "interval_s": 5.0, "min_interval_s": 5.0, "dir": str(tmp_path / "ckpt")},
    }
    # 8 epochs: training outlasts the kill at 4 s (3 epochs took 3.6 s on a quick run)
    s, path = run_job(_spec(multi_hot_dir, over, epochs=8), runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0
    (part,) = [e for e in events_of(path) if e["kind"] == "partial_recovery"]
    (f,) = [f for f in s["failures"] if f["kind"] == "ps_death"]
    at_ckpt = part["ids_at_checkpoint"][f["actor"]]
    assert f["updates_lost"] > 0
    # what the PS applied, plus what the dead one had at its checkpoint, plus what it lost: every id once
    assert s["ps_ids_updated"] + at_ckpt + f["updates_lost"] == s["ids_expected"], (s["ps_ids_updated"], at_ckpt, f["updates_lost"], s["ids_expected"])
