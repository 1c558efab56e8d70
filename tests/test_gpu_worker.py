"""GPU workers (``resources.worker_gpu``): the worker's DLRM on CUDA, the PS on CPU.

The end-to-end test needs a CUDA device; this project's CI machines have none, so it is
skipped there (README, "GPU workers", says what has and has not been run on a GPU). The
device plumbing itself runs in every CPU test: the same code with the device "cpu".
"""

from __future__ import annotations

import pytest
import torch

from conftest import small_spec


def test_worker_gpu_puts_the_workers_model_on_cuda_and_asks_ray_for_the_gpus(synth_dir):
    from dlrover.spec import spec_from_dict
    from dlrover.worker.worker_spec import WorkerSpec

    assert WorkerSpec.of(small_spec(synth_dir)).device == "cpu"
    assert WorkerSpec.of(small_spec(synth_dir, resources__worker_gpu=1)).device == "cuda"
    doc = small_spec(synth_dir).model_dump(mode="json")
    doc["resources"]["worker_gpu"] = -1
    with pytest.raises(Exception, match="worker_gpu"):
        spec_from_dict(doc)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: GPU workers are not run here")
def test_a_gpu_worker_learns_what_a_cpu_worker_learns(ray_local, synth_dir, tmp_path):
    from dlrover.driver.runner import run_job

    same = dict(seed=1, train__deterministic=True, train__staleness=0, data__epochs=2, resources__workers=1, resources__ps=1)
    cpu, _ = run_job(small_spec(synth_dir, **same), runs_dir=str(tmp_path / "cpu"), progress="none")
    gpu, _ = run_job(small_spec(synth_dir, resources__worker_gpu=1, **same), runs_dir=str(tmp_path / "gpu"), progress="none")
    assert cpu["status"] == gpu["status"] == "succeeded"
    assert gpu["samples_trained"] == cpu["samples_trained"]
    assert abs(gpu["auc"] - cpu["auc"]) < 0.005, (gpu["auc"], cpu["auc"])
    assert abs(gpu["logloss"] - cpu["logloss"]) < 0.01, (gpu["logloss"], cpu["logloss"])
