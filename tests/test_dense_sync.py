"""Live jobs with ``train.dense_sync: sync | coded``: every batch's dense gradient is
applied exactly once (sync) or applied or dropped exactly once (coded), across elastic
pauses, and a slow worker holds back a sync job but not a coded one."""

from __future__ import annotations

from conftest import batches_expected, sleepy, small_spec


def _run(spec, tmp_path):
    from dlrover.driver.runner import run_job

    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0, s.get("error")
    assert s["samples_trained"] == s["samples_expected"]
    assert s["ps_bags_updated"] == 26 * s["samples_expected"]  # embeddings stay exactly once
    return s


def test_sync_rounds_apply_every_batch_once_through_a_scale_out_and_in(ray_local, synth_dir, tmp_path):
    """Two then three then two workers: pauses and new members never leave a round waiting
    for a worker that will not push, and no dense gradient is lost or applied twice."""
    steps = [{"at_progress": 0.2, "workers": 3}, {"at_progress": 0.5, "workers": 2}]
    spec = small_spec(
        synth_dir,
        # Many small steps, slept once more after each: the job outlasts starting the
        # scale-out's worker on 2 busy cores.
        data__epochs=3,
        chaos=sleepy(2),
        data__batch_size=128,
        resources__budget_cpu=8,
        train__log_every_s=0.2,
        train__dense_sync="sync",
        policy={"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.2, "warmup_s": 0.2, "history_dir": str(tmp_path / "h")},
    )
    s = _run(spec, tmp_path)
    assert [e["kind"] for e in s["scale_events"]] == ["scale_out", "scale_in"], (s["scale_events"], s["dense_rounds"], s["wall_time_s"])
    assert s["dense_updates"] == batches_expected(spec)
    r = s["dense_rounds"]
    assert r["mode"] == "sync" and r["ignored"] == 0
    assert r["rounds"] < s["dense_updates"]  # most rounds combined several workers' gradients
    assert s["auc"] > 0.6


def test_coded_rounds_go_without_a_slow_worker_and_account_for_every_gradient(ray_local, synth_dir, tmp_path):
    """Three workers, one of them 4x slow, rounds closing once two gave: the slow worker's
    late gradients are dropped, each batch's gradient applied or dropped exactly once."""
    spec = small_spec(
        synth_dir,
        data__batch_size=256,
        resources__workers=3,
        resources__ps=1,
        train__dense_sync="coded",
        train__stragglers=1,
        chaos=[{"at_s": 0, "action": "slow", "target": "worker:0", "factor": 4}],
    )
    s = _run(spec, tmp_path)
    r = s["dense_rounds"]
    assert r["mode"] == "coded" and r["ignored"] > 0
    assert s["dense_updates"] + r["ignored"] == batches_expected(spec)
    assert s["auc"] > 0.6


def test_a_killed_worker_does_not_hold_a_sync_round_and_no_gradient_is_applied_twice(ray_local, synth_dir, tmp_path):
    """A worker killed mid-training (a real kill) is dropped from the rounds: the others go
    on, its replacement joins, and the batches it redoes are skipped, so every batch's
    dense gradient is applied exactly once."""
    from conftest import check_exactly_once, fault_spec

    # worker 1 sleeps twice its step's time after each once the chaos clock starts (the rounds wait for it)
    chaos = [{"at_s": 1, "action": "kill", "target": "worker:0"}, {"at_s": 0, "action": "slow", "target": "worker:1", "factor": 3}]
    spec = fault_spec(synth_dir, tmp_path, chaos, train__dense_sync="sync", data__epochs=3)
    s = _run(spec, tmp_path)
    assert [f["kind"] for f in s["failures"]] == ["worker_death"], s["failures"]
    check_exactly_once(s, spec)
    assert s["dense_rounds"]["ignored"] == 0
