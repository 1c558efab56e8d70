"""Exactly-once updates through a worker's death, with real actors and a real kill.

A worker killed mid-shard had pushed batches it never reported; its replacement trains
the shard again from the last progress the master heard of, and every PS (and the dense
PS) skips the batches it had applied: no update is lost and none is applied twice.
"""

from __future__ import annotations

from conftest import check_exactly_once, small_spec


def test_a_replacement_redoing_a_dead_workers_unreported_batches_applies_none_twice(ray_local, synth_dir_large, tmp_path):
    from dlrover.driver.runner import run_job

    spec = small_spec(
        synth_dir_large,
        data__epochs=2,
        data__batch_size=512,
        data__shard_rows=16384,  # 32 batches a shard: the kill lands mid-shard
        train__log_every_s=60.0,  # no progress report before the kill: the replacement starts each shard over
        checkpoint__memory_interval_s=0.0,  # no pause (a pause reports progress) after the first cut
        chaos=[{"at_s": 3, "action": "kill", "target": "worker:0"}],
    )
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0
    assert [f["kind"] for f in s["failures"]] == ["worker_death"]
    assert s["duplicate_updates_skipped"] > 0  # the replacement did push batches again
    check_exactly_once(s, spec)
