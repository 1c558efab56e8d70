"""DenseClient: one worker's side of the dense-parameter exchange with the dense PS.

Every step the worker pushes the flat MLP gradient and loads the updated parameters.
When the dense PS runs on the worker's node the bytes go through a shared-memory
segment (:mod:`dlrover.ps.shm`) and the Ray call carries only its name; otherwise they
travel as Ray objects. Same numbers either way.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable

import numpy as np
import ray
import torch

from dlrover.ps.applied import BatchId
from dlrover.ps.shm import ShmArray, shm_prefix


class DenseClient:
    def __init__(self, params: list[torch.nn.Parameter], dense_ps: Any, owner: str, get: Callable[[Any], Any] = ray.get) -> None:
        self.params = params
        self.dense_ps = dense_ps
        self._get = get
        size = sum(p.numel() for p in params)
        # The parameters are views into one buffer this worker owns, so loading new
        # values is one memcpy and never aliases the exchange buffer.
        self._flat = torch.nn.utils.parameters_to_vector(params).detach().clone()
        torch.nn.utils.vector_to_parameters(self._flat, params)
        same_node = get(dense_ps.node_id.remote()) == ray.get_runtime_context().get_node_id() and not os.environ.get("DLROVER_NO_SHM")
        name = f"{shm_prefix(owner)}{uuid.uuid4().hex[:8]}"
        self._shm = ShmArray(name, size, create=True) if same_node else None

    def pull(self) -> None:
        """Load the current parameters (start of training, evaluation)."""
        self._load(self._get(self.dense_ps.pull.remote())[1])

    def push(self, batch: BatchId | None = None) -> Any:
        """Send this step's gradient (of ``batch``: the dense PS applies it at most once);
        returns the ObjectRef that completes when applied."""
        grads = [p.grad.reshape(-1) for p in self.params]
        if self._shm is None:
            return self.dense_ps.push_pull.remote(torch.cat(grads).cpu().numpy(), batch)
        dst = torch.from_numpy(self._shm.array)
        if self._flat.is_cuda:
            dst.copy_(torch.cat(grads))  # one device-to-host copy
        else:
            torch.cat(grads, out=dst)
        return self.dense_ps.push_pull_shm.remote(self._shm.name, self._shm.array.size, batch)

    def apply(self, ref: Any) -> None:
        """Wait for a push and load the parameters it returned."""
        reply = self._get(ref)
        self._load(self._shm.array if self._shm is not None else reply[1])

    def _load(self, flat: np.ndarray) -> None:
        self._flat.copy_(torch.as_tensor(flat))

    def close(self) -> None:
        if self._shm is not None:
            self.dense_ps.release.remote(self._shm.name)  # the PS unmaps its view
            self._shm.close()
            self._shm = None
