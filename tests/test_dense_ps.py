"""Dense PS: the shared-memory exchange gives exactly what the object-store path gives, and
n shards of the vector compute exactly what one dense PS computes."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from dlrover.ps.dense_ps import DenseParamServer
from dlrover.ps.dense_shards import merge_states, shard_bounds, split_state
from dlrover.ps.shm import ShmArray


def test_shm_push_pull_equals_object_push_pull():
    rng = np.random.default_rng(0)
    init = rng.standard_normal(1000).astype(np.float32)
    a = DenseParamServer(init, {"name": "adagrad", "lr": 0.05})
    b = DenseParamServer(init, {"name": "adagrad", "lr": 0.05})
    seg = ShmArray(f"dlr_test_{uuid.uuid4().hex[:8]}", init.size, create=True)
    try:
        for step in range(5):
            g = rng.standard_normal(init.size).astype(np.float32)
            va, pa = a.push_pull(g)
            seg.array[:] = g
            vb, none = b.push_pull_shm(seg.name, 0, init.size)
            assert none is None and va == vb == step + 1
            np.testing.assert_array_equal(seg.array, pa)  # the segment now holds the parameters
        assert not np.allclose(pa, init)
    finally:
        b.release(seg.name)
        seg.close()


def test_shard_bounds_cut_the_vector_into_near_equal_contiguous_slices():
    assert shard_bounds(10, 1) == (0, 10)
    assert shard_bounds(10, 3) == (0, 3, 7, 10)
    b = shard_bounds(462_000, 4)
    assert b[0] == 0 and b[-1] == 462_000 and max(np.diff(b)) - min(np.diff(b)) <= 1
    with pytest.raises(ValueError, match="cannot cut 3 dense parameters into 4 shards"):
        shard_bounds(3, 4)


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "sgd"])
def test_three_shards_through_one_segment_equal_one_dense_ps_bit_for_bit(optimizer):
    rng = np.random.default_rng(1)
    init = rng.standard_normal(1001).astype(np.float32)
    opt = {"name": optimizer, "lr": 0.05}
    whole = DenseParamServer(init, opt)
    bounds = shard_bounds(init.size, 3)
    shards = [DenseParamServer(init[lo:hi], opt) for lo, hi in zip(bounds, bounds[1:])]
    seg = ShmArray(f"dlr_test_{uuid.uuid4().hex[:8]}", init.size, create=True)
    try:
        for step in range(4):
            g = rng.standard_normal(init.size).astype(np.float32)
            _, expected = whole.push_pull(g, (0, step))
            seg.array[:] = g
            for s, (lo, hi) in zip(shards, zip(bounds, bounds[1:])):
                s.push_pull_shm(seg.name, lo, hi, (0, step))
            np.testing.assert_array_equal(seg.array, expected)
        merged = merge_states([s.state() for s in shards])
        one = whole.state()
        np.testing.assert_array_equal(merged["param"], one["param"])
        assert merged["version"] == one["version"] == 4 and merged["opt_state"].keys() == one["opt_state"].keys()
        for k, v in one["opt_state"].items():
            np.testing.assert_array_equal(np.asarray(merged["opt_state"][k]), np.asarray(v))
    finally:
        for s in shards:
            s.release(seg.name)
        seg.close()


def test_a_merged_checkpoint_restores_into_another_shard_count():
    rng = np.random.default_rng(2)
    init = rng.standard_normal(500).astype(np.float32)
    opt = {"name": "adagrad", "lr": 0.1}
    whole = DenseParamServer(init, opt)
    for step in range(3):
        whole.push_pull(rng.standard_normal(init.size).astype(np.float32), (0, step))
    bounds = shard_bounds(init.size, 2)
    two = [DenseParamServer(np.zeros(hi - lo, dtype=np.float32), opt) for lo, hi in zip(bounds, bounds[1:])]
    for s, part in zip(two, split_state(whole.state(), bounds)):
        s.set_state(part)
    g = rng.standard_normal(init.size).astype(np.float32)
    _, expected = whole.push_pull(g, (0, 3))
    got = np.concatenate([s.push_pull(g[lo:hi], (0, 3))[1] for s, (lo, hi) in zip(two, zip(bounds, bounds[1:]))])
    np.testing.assert_array_equal(got, expected)  # same parameters and same optimizer state


def test_a_job_with_three_dense_ps_shards_learns_exactly_what_one_dense_ps_learns(ray_local, synth_dir, tmp_path):
    """Deterministic mode (one shard of data at a time, no staleness): the dense
    parameters and tables after training are bit-equal, and each shard applied every
    batch once."""
    import torch
    from conftest import batches_expected, small_spec

    from dlrover.driver.runner import run_job

    def run(shards: int):
        spec = small_spec(
            synth_dir, seed=1, train__deterministic=True, train__staleness=0, data__batch_size=512,
            optimizer__dense={"name": "adagrad", "lr": 0.05}, resources__dense_ps=shards, checkpoint__dir=str(tmp_path / "ckpt"),
        )  # fmt: skip
        s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id=f"dense-{shards}")
        assert s["status"] == "succeeded" and s["dense_updates_per_shard"] == [batches_expected(spec)] * shards
        assert s["config"]["dense_ps"] == shards
        return torch.load(tmp_path / "ckpt" / f"dense-{shards}" / "final.pt", weights_only=True)

    one, three = run(1), run(3)
    assert torch.equal(one["dense"], three["dense"])
    assert all(torch.equal(a, b) for a, b in zip(one["tables"], three["tables"]))
