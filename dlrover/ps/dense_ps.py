"""DenseParamServer: the DLRM's dense (MLP) parameters and their optimizer, as one flat
vector (or one slice of it: see ``dlrover.ps.dense_shards``).

Workers push the flat gradient of a step and get the updated parameters back in the same
call, tagged with its batch: a batch applied before is not applied again (see
``dlrover.ps.applied``). Keeping dense state here (instead of an all-reduce group) is what lets workers come
and go without rebuilding a process group. Adagrad, SGD and Adam are element-wise, so one
optimizer over the flat vector is the same as one per parameter tensor.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import ray
import torch

from dlrover.ids import ProcessInfo
from dlrover.ps.applied import AppliedLog, BatchId
from dlrover.ps.shm import Attached


def make_dense_optimizer(params, spec: dict) -> torch.optim.Optimizer:
    name, lr, eps = spec["name"], float(spec["lr"]), float(spec.get("eps", 1e-8))
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=eps)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, eps=eps)
    raise ValueError(f"unknown dense optimizer {name!r}")


class DenseParamServer:
    def __init__(self, flat_params: np.ndarray, optimizer: dict, threads: int = 1) -> None:
        torch.set_num_threads(max(1, threads))
        self.param = torch.nn.Parameter(torch.as_tensor(np.array(flat_params, dtype=np.float32)))
        self.opt = make_dense_optimizer([self.param], optimizer)
        self.version = 0
        self.applied = AppliedLog()
        self.updates = 0  # gradients applied by this server (a rollback does not take them back)
        self.duplicates = 0  # pushes of a batch applied before, skipped
        self._lock = threading.Lock()
        self._segments = Attached()

    def push_pull(self, grad: np.ndarray | None, batch: BatchId | None = None) -> tuple[int, np.ndarray]:
        """Apply one step's gradient (if any, and if its ``batch`` is new) and return
        (version, parameters)."""
        with self._lock:
            if grad is not None:
                self._step(torch.as_tensor(grad), batch)
            # No copy: Ray serialises the return value before the next call can run.
            return self.version, self.param.detach().numpy()

    def _step(self, grad: torch.Tensor, batch: BatchId | None) -> None:
        if batch is not None and not self.applied.first_time(BatchId(*batch)):
            self.duplicates += 1
            return
        self.param.grad = grad
        self.opt.step()
        self.param.grad = None
        self.version += 1
        self.updates += 1

    def state(self) -> dict:
        """Parameters and optimizer state (a checkpoint; workers parked, so consistent)."""
        with self._lock:
            opt = self.opt.state_dict()
            return {
                "param": self.param.detach().numpy().copy(),
                "version": self.version,
                "opt_state": {k: v.detach().numpy().copy() if torch.is_tensor(v) else v for k, v in opt["state"].get(0, {}).items()},
            }

    def set_state(self, state: dict) -> None:
        """Roll back to ``state()``'s result."""
        with self._lock:
            with torch.no_grad():
                self.param.copy_(torch.as_tensor(np.asarray(state["param"])))
            opt = self.opt.state_dict()
            opt["state"] = {0: {k: torch.as_tensor(np.asarray(v)).clone() if isinstance(v, np.ndarray) or torch.is_tensor(v) else v for k, v in state["opt_state"].items()}} if state["opt_state"] else {}
            self.opt.load_state_dict(opt)
            self.version = int(state["version"])
            self.applied.clear()  # batches after the checkpoint's cut are pushed again

    def pull(self) -> tuple[int, np.ndarray]:
        return self.push_pull(None)

    def push_pull_shm(self, name: str, lo: int, hi: int, batch: BatchId | None = None) -> tuple[int, None]:
        """``push_pull`` through a worker's shared-memory segment of the whole vector: read
        this shard's slice ``[lo, hi)`` of the gradient from it, write the updated slice
        back into it (see ``dlrover.ps.shm``)."""
        buf = self._segments.array(name)[lo:hi]
        with self._lock:
            self._step(torch.from_numpy(buf), batch)
            buf[:] = self.param.detach().numpy()
            return self.version, None

    def forget(self, shards: list[int]) -> None:
        """These shards are done: their batches leave the applied log."""
        with self._lock:
            self.applied.forget(shards)

    def stats(self) -> dict:
        with self._lock:
            return {"updates": self.updates, "duplicates": self.duplicates, "version": self.version, "applied_log": self.applied.entries()}

    def release(self, name: str) -> None:
        self._segments.release(name)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def ping(self) -> ProcessInfo:
        """The liveness probe."""
        return ProcessInfo(os.getpid(), ray.get_runtime_context().get_node_id())
