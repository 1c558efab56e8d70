"""Launching on a cluster that can never hold the job: one line at once, naming the
shortfall, rather than actors pending until a timeout."""

from __future__ import annotations

import pytest

from conftest import small_spec
from dlrover.errors import DLRoverError


def test_a_job_asking_more_cpus_than_the_cluster_has_fails_at_once_naming_them(ray_local, synth_dir, tmp_path):
    from dlrover.driver.runner import run_job

    total = ray_local.cluster_resources()["CPU"]
    spec = small_spec(synth_dir, resources__worker_cpu=total / 2)  # 2 workers alone take every CPU
    with pytest.raises(DLRoverError) as e:
        run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    # before any actor is asked for: not the timeout's "actors did not start within"
    assert "the cluster cannot hold the job and no autoscaler can add nodes" in str(e.value)
    assert f"need {total + 2 + 0.25:g} CPUs; the cluster has {total:g} CPUs on 1 node" in str(e.value), str(e.value)
