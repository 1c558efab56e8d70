"""Each batch applies at most once on a parameter server, whatever order and repeats its
pushes come in, with memory bounded by the shards still open."""

from __future__ import annotations

import numpy as np

from dlrover.ps.applied import AppliedLog, BatchId
from dlrover.ps.dense_ps import DenseParamServer


def test_a_batch_applies_once_and_repeats_are_refused():
    log = AppliedLog()
    assert log.first_time(BatchId(3, 0)) and log.first_time(BatchId(3, 1))
    assert not log.first_time(BatchId(3, 0)) and not log.first_time(BatchId(3, 1))
    assert log.first_time(BatchId(4, 0))  # another shard's batch 0 is another batch


def test_out_of_order_batches_are_remembered_above_the_prefix_until_the_gap_closes():
    log = AppliedLog()
    for i in (0, 2, 3):
        assert log.first_time(BatchId(1, i))
    assert log.entries() == 1 + 2  # the shard, and 2 and 3 above its prefix [0]
    assert log.first_time(BatchId(1, 1))
    assert log.entries() == 1  # prefix [0..3]: nothing above it
    assert not any(log.first_time(BatchId(1, i)) for i in range(4))


def test_forgetting_a_done_shard_frees_its_memory():
    log = AppliedLog()
    for shard in range(5):
        for i in range(10):
            log.first_time(BatchId(shard, i))
    log.forget([0, 1, 2, 3])
    assert log.entries() == 1


def test_clear_lets_batches_after_a_checkpoint_apply_again():
    log = AppliedLog()
    log.first_time(BatchId(0, 0))
    log.clear()
    assert log.first_time(BatchId(0, 0))


def test_the_dense_server_applies_a_batch_gradient_once():
    ps = DenseParamServer(np.zeros(4, dtype=np.float32), {"name": "sgd", "lr": 1.0})
    g = np.ones(4, dtype=np.float32)
    _, once = ps.push_pull(g, BatchId(0, 0))
    once = once.copy()
    _, twice = ps.push_pull(g, BatchId(0, 0))
    assert np.array_equal(once, twice) and np.allclose(once, -1.0)
    assert ps.stats().updates == 1 and ps.stats().duplicates == 1
    ps.push_pull(g, BatchId(0, 1))
    assert ps.stats().updates == 2
