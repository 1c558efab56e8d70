"""The JobMaster stepped on a fake cluster (``tests/fake_job.py``): no Ray, real books,
states, recovery, checkpoints and summary."""

from __future__ import annotations

import json

from conftest import small_spec
from fake_job import event_rows, fake_cluster, fake_master


def states_of(master) -> list[str]:
    return [e["state"] for e in event_rows(master) if e["kind"] == "state"]


def test_a_job_whose_workers_train_every_shard_succeeds_with_every_sample_counted(synth_dir, tmp_path):
    master, cluster = fake_master(small_spec(synth_dir), tmp_path)
    summary = master.run().to_json()
    assert summary["status"] == "succeeded"
    assert states_of(master) == ["Launching", "Running", "Evaluating", "Succeeded"]
    assert summary["samples_trained"] == master.books.queue.samples_expected > 0
    assert (tmp_path / "final.pt").exists()


def test_a_killed_worker_s_shards_are_trained_by_its_replacement_and_the_failure_recorded(synth_dir, tmp_path):
    cluster = fake_cluster()
    cluster.stall["fake-job/worker-0"] = 2  # takes two shards, then trains no more
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name("fake-job/worker-0")))
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    assert summary["status"] == "succeeded"
    assert summary["samples_trained"] == master.books.queue.samples_expected
    (failure,) = master.failures
    assert failure.kind.value == "worker_death" and failure.actor == "fake-job/worker-0"
    assert failure.replacement is not None or "fake-job/worker-2" in [h.name for h in cluster.alive()]
    assert states_of(master) == ["Launching", "Running", "Evaluating", "Succeeded"]  # a worker is replaced while running


def test_under_on_failure_restart_a_worker_death_restarts_every_actor_through_the_restarting_state(synth_dir, tmp_path):
    cluster = fake_cluster()
    cluster.stall["fake-job/worker-0"] = 2
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name("fake-job/worker-0")))
    master, _ = fake_master(small_spec(synth_dir, checkpoint__on_failure="restart"), tmp_path, cluster)
    summary = master.run().to_json()
    assert summary["status"] == "succeeded"
    assert states_of(master) == ["Launching", "Running", "Restarting", "Running", "Evaluating", "Succeeded"]
    assert summary["samples_trained"] == master.books.queue.samples_expected
    (failure,) = master.failures
    assert failure.actor == "fake-job/worker-0" and failure.checkpoint is not None
    assert not [h for h in cluster.alive() if h.name in ("fake-job/worker-1", "fake-job/ps-0", "fake-job/ps-1")]  # every actor replaced
