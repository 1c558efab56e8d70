"""Partial PS recovery (``recovery.ps: partial``) with real actors and a real kill: only the
dead PS goes back to its checkpoint, and what it loses is counted exactly."""

from __future__ import annotations

import signal

from conftest import auc_spec, batches_expected, events_of, fault_spec, signal_when_training, sleepy

AUC_TOLERANCE = 0.005
TABLES = 26


def test_a_killed_ps_is_restored_alone_and_its_lost_updates_are_counted_exactly(fault_free, synth_dir_auc, tmp_path):
    from event_sequence import check_same_story
    from dlrover.driver.runner import run_job

    spec = auc_spec(synth_dir_auc, tmp_path, [{"at_s": 4, "action": "kill", "target": "ps:1"}])
    assert spec.recovery.ps == "partial"  # the default
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded"
    assert s["samples_lost"] == 0 and s["samples_trained"] == s["samples_expected"]
    events = events_of(path)
    assert not [e for e in events if e["kind"] == "rollback"]  # no other PS went back
    (part,) = [e for e in events if e["kind"] == "partial_recovery"]
    (f,) = [f for f in s["failures"] if f["kind"] == "ps_death"]
    assert f["actor"].endswith("/ps-1") and f["replacement"] == part["replaced"][f["actor"]]
    assert f["checkpoint"]["at_s"] <= f["at_s"] <= f["detected_s"] <= f["recovered_s"]
    assert s["samples_replayed"] == 0 == f["samples_replayed"]

    # The master counted the lost updates from the data (the lines trained between the
    # checkpoint's cut and where each shard resumed, routed as the workers route them).
    # The PS count what they applied: the survivors and the replacement (ps_bags_updated)
    # plus what the dead one had at its checkpoint, plus what it lost, is every bag once.
    assert part["lines_lost"] > 0 and f["updates_lost"] > 0
    assert s["updates_lost"] == f["updates_lost"]
    at_ckpt = part["bags_at_checkpoint"][f["actor"]]
    assert s["ps_bags_updated"] + at_ckpt + f["updates_lost"] == TABLES * s["samples_expected"], (s["ps_bags_updated"], at_ckpt, f["updates_lost"])
    # The dense PS was not touched: one update per batch, replays after the kill skipped.
    assert s["dense_updates"] == batches_expected(spec)
    print(f"updates_lost {f['updates_lost']} of {TABLES * s['samples_expected']}, recovery {f['rollback_s']}s, AUC {s['auc']:.4f} vs {fault_free['auc']:.4f}")
    # At most 0.005 below: what is lost is a few seconds of one PS's row updates (one run:
    # 0.7565 against 0.7579, with 1.26M of 8.42M bag updates lost).
    assert s["auc"] >= fault_free["auc"] - AUC_TOLERANCE, (s["auc"], fault_free["auc"])
    check_same_story(path, spec, tmp_path)  # the same job on the fake cluster: the same events


def test_partial_recovery_falls_back_to_a_rollback_when_the_dense_ps_dies(ray_local, synth_dir_large, tmp_path):
    from dlrover.driver.runner import run_job

    spec = fault_spec(synth_dir_large, tmp_path, sleepy(3), data__epochs=1)  # lasts as long as 3 epochs
    out: dict = {}
    t = signal_when_training("partial-dense", "dense-ps-0-g0", signal.SIGKILL, out)
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id="partial-dense")
    t.join(timeout=5)
    assert "pid" in out, "the dense PS was never killed"
    assert s["status"] == "succeeded" and s["samples_lost"] == 0, (s["status"], s["samples_lost"], s["failures"])
    assert [f["kind"] for f in s["failures"]] == ["ps_death"], s["failures"]
    kinds = {e["kind"] for e in events_of(path)}
    assert "rollback" in kinds and "partial_recovery" not in kinds
    assert s["updates_lost"] == 0


def test_with_keep_in_memory_false_a_written_checkpoint_is_recovered_from_disk(ray_local, synth_dir_large, tmp_path):
    """keep_in_memory: false (models that fill the object store): once a cut is on disk it
    leaves the object store, and a PS death restores the replacement from disk, with the
    same exact accounting of what was lost."""
    from dlrover.driver.runner import run_job

    # One cut, at the start; ps-1 is SIGKILLed once it is on disk (its manifest written).
    spec = fault_spec(synth_dir_large, tmp_path, sleepy(3), checkpoint__keep_in_memory=False, checkpoint__memory_interval_s=0.0, data__epochs=2)
    manifest = tmp_path / "ckpt" / "keep-false" / "ckpt-00000001" / "manifest.json"
    out: dict = {}
    t = signal_when_training("keep-false", "ps-1", signal.SIGKILL, out, ready=manifest.exists)
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id="keep-false")
    t.join(timeout=5)
    assert "pid" in out, "ps-1 was never killed"
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["samples_replayed"] == 0
    (part,) = [e for e in events_of(path) if e["kind"] == "partial_recovery"]
    assert part["checkpoint"]["seq"] == 1 and part["checkpoint"]["source"] == "durable", part["checkpoint"]
    (f,) = [f for f in s["failures"] if f["kind"] == "ps_death"]
    at_ckpt = part["bags_at_checkpoint"][f["actor"]]
    assert s["ps_bags_updated"] + at_ckpt + f["updates_lost"] == TABLES * s["samples_expected"]
