"""DenseClient: one worker's side of the dense-parameter exchange with the dense PS shards.

Every step the worker pushes the flat MLP gradient to every shard at once (each applies
its slice) and loads the updated parameters. When the dense PS runs on the worker's node
the bytes go through one shared-memory segment of the whole vector (:mod:`dlrover.ps.shm`),
each shard reading and writing its own slice, and the Ray calls carry only its name;
otherwise the slices travel as Ray objects. Same numbers either way.

In round mode (``train.dense_sync: sync | coded``) every call carries the worker's name
and a call number (the dense PS serves it on threads, in this order), and the worker
leaves the rounds whenever it stops pushing for a while (:meth:`leave`).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable

import numpy as np
import ray
import torch

from dlrover.ps.applied import BatchId
from dlrover.ps.dense_rounds import Caller
from dlrover.ps.dense_shards import DenseShards
from dlrover.ps.shm import ShmArray, shm_prefix


class DenseClient:
    def __init__(
        self, params: list[torch.nn.Parameter], dense: DenseShards, owner: str, get: Callable[[Any], Any] = ray.get, rounds: bool = False
    ) -> None:
        """``rounds``: the dense PS combines gradients in rounds (sync, coded)."""
        self.params = params
        self.owner = owner
        self._rounds = rounds
        self._run = uuid.uuid4().hex  # round mode: this run's calls, as opposed to an earlier run's
        self._seq = 0  # the next call's number (round mode)
        self._in_rounds = False  # pushed since the last leave
        self.dense = dense
        self._get = get
        size = sum(p.numel() for p in params)
        if size != dense.bounds[-1]:
            raise ValueError(f"the dense PS holds {dense.bounds[-1]} parameters, the model has {size}")
        # The parameters are views into one buffer this worker owns, so loading new
        # values is one memcpy and never aliases the exchange buffer.
        self._flat = torch.nn.utils.parameters_to_vector(params).detach().clone()
        torch.nn.utils.vector_to_parameters(self._flat, params)
        here = ray.get_runtime_context().get_node_id()
        same_node = not os.environ.get("DLROVER_NO_SHM") and all(n == here for n in get([h.node_id.remote() for h in dense.handles]))
        name = f"{shm_prefix(owner)}{uuid.uuid4().hex[:8]}"
        self._shm = ShmArray(name, size, create=True) if same_node else None

    def pull(self) -> None:
        """Load the current parameters (start of training, evaluation)."""
        self._load(self.dense.pull(self._get))

    def push(self, batch: BatchId | None = None) -> list[Any]:
        """Send this step's gradient (of ``batch``: each shard applies it at most once);
        returns the ObjectRefs (one per shard) that complete when applied."""
        grads = [p.grad.reshape(-1) for p in self.params]
        caller = self._caller()
        self._in_rounds = self._rounds
        if self._shm is None:
            flat = torch.cat(grads).cpu().numpy()
            return [h.push_pull.remote(flat[lo:hi], batch, caller) for h, (lo, hi) in zip(self.dense.handles, self.dense.slices())]
        dst = torch.from_numpy(self._shm.array)
        if self._flat.is_cuda:
            dst.copy_(torch.cat(grads))  # one device-to-host copy
        else:
            torch.cat(grads, out=dst)
        return [h.push_pull_shm.remote(self._shm.name, lo, hi, batch, caller) for h, (lo, hi) in zip(self.dense.handles, self.dense.slices())]

    def leave(self) -> None:
        """Round mode: this worker stops pushing for a while (it parks, waits for input or
        is done), so rounds must not wait for it; its next push joins again. Sent after
        its pushes (by call number); a no-op when not in the rounds."""
        if self._in_rounds:
            caller = self._caller()
            for h in self.dense.handles:
                h.leave.remote(caller)
            self._in_rounds = False

    def _caller(self) -> Caller | None:
        if not self._rounds:
            return None
        self._seq += 1
        return Caller(self.owner, self._run, self._seq - 1)

    def apply(self, refs: list[Any]) -> None:
        """Wait for a push and load the parameters it returned."""
        replies = self._get(refs)
        self._load(self._shm.array if self._shm is not None else np.concatenate([r[1] for r in replies]))

    def _load(self, flat: np.ndarray) -> None:
        self._flat.copy_(torch.as_tensor(flat))

    def close(self) -> None:
        self.leave()
        if self._shm is not None:
            for h in self.dense.handles:
                h.release.remote(self._shm.name)  # the shards unmap their views
            self._shm.close()
            self._shm = None
