"""Which checkpoint a recovery gets when the newest in-memory cut is gone
(``Checkpointer.payloads``): the durable one, else the launch cut, never a silent skip of
a corrupt directory. Pure logic: a stub master and a real CheckpointStore on disk."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from dlrover.checkpoint.store import CheckpointError, CheckpointStore
from dlrover.master.checkpoint import Checkpoint, Checkpointer


def _checkpointer(tmp_path) -> Checkpointer:
    events: list[tuple[str, dict]] = []
    master = SimpleNamespace(
        spec=SimpleNamespace(checkpoint=SimpleNamespace(full_every=5, quantize="none")),
        events=SimpleNamespace(add=lambda kind, **kw: events.append((kind, kw))),
        clock=lambda: 0.0,
        t0=0.0,
    )
    return Checkpointer(master, CheckpointStore(tmp_path / "ckpt"))


def _cut(seq: int, samples: int, steps: int) -> Checkpoint:
    """A cut whose payloads are no longer in memory (released, or its node is gone)."""
    return Checkpoint(seq, float(seq), {"done": []}, samples, 0, steps, {"w": np.zeros(2)}, None)


def test_with_nothing_durable_yet_a_recovery_goes_back_to_the_launch_cut(tmp_path):
    ck = _checkpointer(tmp_path)
    ck.initial, ck.latest = _cut(1, 0, 0), _cut(2, 4096, 2)
    ckpt, payloads, source = ck.payloads()
    assert (ckpt.seq, ckpt.samples, payloads, source) == (1, 0, None, "initial")
    assert ck.latest is ck.initial  # the books now stand at the launch cut


def test_a_directory_holding_only_corrupt_checkpoints_is_an_error_not_a_restart(tmp_path):
    ck = _checkpointer(tmp_path)
    ck.store.save(2, {"dense": {"w": np.ones(2)}}, {"seq": 2})
    pt = tmp_path / "ckpt" / "ckpt-00000002" / "dense.pt"
    with open(pt, "r+b") as f:
        f.seek(os.path.getsize(pt) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    ck.initial, ck.latest = _cut(1, 0, 0), _cut(2, 4096, 2)
    with pytest.raises(CheckpointError):
        ck.payloads()


def test_without_a_launch_cut_a_job_with_nothing_durable_cannot_recover(tmp_path):
    ck = _checkpointer(tmp_path)  # e.g. resumed after a master restart: its first cut is mid-training
    ck.latest = _cut(5, 4096, 2)
    with pytest.raises(CheckpointError, match="no checkpoint found|does not exist"):
        ck.payloads()
