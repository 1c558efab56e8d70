"""End-to-end training on real Ray actors: accuracy vs single-process TorchRec, exact accounting."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import small_spec
from dlrover.baseline import train_local
from dlrover.runner import run_job


@pytest.fixture(scope="module")
def two_by_two(ray_local, synth_dir, tmp_path_factory):
    spec = small_spec(synth_dir, data__epochs=2, data__eval_every_steps=25, train__log_every_s=0.5)
    summary, path = run_job(spec, runs_dir=str(tmp_path_factory.mktemp("runs")), progress="none")
    return spec, summary, path


def test_every_row_trained_exactly_once(two_by_two):
    spec, s, path = two_by_two
    assert s["status"] == "succeeded"
    assert s["samples_expected"] == 2 * 36_000  # 2 epochs x (40k rows - 10% held out)
    assert s["samples_trained"] == s["samples_expected"]
    assert s["samples_lost"] == 0
    # Each sample has 26 single-id bags and each bag lives on exactly one PS: the PS
    # applied exactly one update per bag of every trained sample, no more, no less.
    assert s["ps_bags_updated"] == 26 * s["samples_expected"]
    on_disk = json.loads(path.read_text())
    for key in ("job_id", "status", "samples_expected", "samples_trained", "samples_lost", "auc", "logloss",
                "throughput_samples_per_s", "wall_time_s", "scale_events", "failures"):
        assert key in on_disk
    events = pd.read_json(path.parent / "events.jsonl", lines=True)
    assert {"job_start", "launched", "worker_exit", "eval", "job_end"} <= set(events["kind"])


def test_periodic_evaluation_is_logged(two_by_two):
    _, _, path = two_by_two
    events = pd.read_json(path.parent / "events.jsonl", lines=True)
    periodic = events[(events["kind"] == "eval") & (events["periodic"] == True)]  # noqa: E712
    assert len(periodic) >= 1
    assert periodic["auc"].between(0.0, 1.0).all() and (periodic["step"] >= 25).all()


def test_auc_matches_single_process_torchrec(two_by_two):
    spec, s, _ = two_by_two
    local = train_local(spec, threads=2)
    assert local.samples == s["samples_expected"]
    assert s["auc"] > 0.6, s
    assert abs(s["auc"] - local.metrics["auc"]) <= 0.01, (s["auc"], local.metrics["auc"])
