"""The JobMaster stepped on a fake cluster (``tests/fake_job.py``): no Ray, real books,
states, recovery, checkpoints and summary."""

from __future__ import annotations

import json

from conftest import small_spec
from fake_job import fake_master


def states_of(master) -> list[str]:
    return [e["state"] for e in master.events.rows() if e["kind"] == "state"]


def test_a_job_whose_workers_train_every_shard_succeeds_with_every_sample_counted(synth_dir, tmp_path):
    master, cluster = fake_master(small_spec(synth_dir), tmp_path)
    summary = master.run()
    assert summary["status"] == "succeeded"
    assert states_of(master) == ["Launching", "Running", "Evaluating", "Succeeded"]
    assert summary["samples_trained"] == master.books.queue.samples_expected > 0
    assert (tmp_path / "final.pt").exists()
