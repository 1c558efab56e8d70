"""Dense PS: the shared-memory exchange gives exactly what the object-store path gives."""

from __future__ import annotations

import uuid

import numpy as np

from dlrover.ps.dense_ps import DenseParamServer
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
            vb, none = b.push_pull_shm(seg.name, init.size)
            assert none is None and va == vb == step + 1
            np.testing.assert_array_equal(seg.array, pa)  # the segment now holds the parameters
        assert not np.allclose(pa, init)
    finally:
        b.release(seg.name)
        seg.close()
