"""DenseParamServer: the DLRM's dense (MLP) parameters and their optimizer, as one flat
vector (or one slice of it: see ``dlrover.ps.dense_shards``).

Workers push the flat gradient of a step and get the updated parameters back in the same
call, tagged with its batch: a batch applied before is not applied again (see
``dlrover.ps.applied``). Keeping dense state here (instead of an all-reduce group) is what lets workers come
and go without rebuilding a process group. Adagrad, SGD and Adam are element-wise, so one
optimizer over the flat vector is the same as one per parameter tensor.

With ``train.dense_sync: sync | coded`` the server combines the workers' gradients in
rounds instead (:mod:`dlrover.ps.dense_rounds`): a push waits in the server (one of its
threads) until its round closes and then returns the parameters after it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np
import ray
import torch

from dlrover.ids import ProcessInfo
from dlrover.optimizer_spec import DenseOptimizerSpec
from dlrover.ps.applied import AppliedLog, BatchId
from dlrover.ps.dense_rounds import Caller, RoundRule, Rounds
from dlrover.ps.ps_stats import DenseStats
from dlrover.ps.shm import Attached


def make_dense_optimizer(params: Iterable[torch.nn.Parameter], spec: dict[str, Any]) -> torch.optim.Optimizer:
    """The optimizer of a ``DenseOptimizerSpec`` dump (what crosses to the actor); its
    defaults fill what the dict leaves out."""
    opt = DenseOptimizerSpec.model_validate(spec)
    if opt.name == "adagrad":
        return torch.optim.Adagrad(params, lr=opt.lr, eps=opt.eps, initial_accumulator_value=opt.accumulator_start)
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=opt.lr)
    return torch.optim.Adam(params, lr=opt.lr, eps=opt.eps)


class DenseParamServer:
    def __init__(self, flat_params: np.ndarray, optimizer: dict, threads: int = 1, rule: RoundRule | None = None) -> None:
        """``rule``: how rounds close (None: every push is applied on its own, async)."""
        torch.set_num_threads(max(1, threads))
        self.param = torch.nn.Parameter(torch.as_tensor(np.array(flat_params, dtype=np.float32)))
        self.opt = make_dense_optimizer([self.param], optimizer)
        self.version = 0
        self.applied = AppliedLog()
        self.updates = 0  # gradients applied by this server (a rollback does not take them back)
        self.duplicates = 0  # pushes of a batch applied before, skipped
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)  # round mode: calls wait for their turn, and for their round
        self._rounds = Rounds(rule) if rule is not None else None
        self._next_seq: dict[str, int] = {}  # round mode: each worker's next call in its current run
        self._runs: dict[str, str] = {}  # round mode: each worker's current run
        self._retired_runs: set[tuple[str, str]] = set()  # (worker, run): runs after which it started another
        self.rounds_closed = 0  # round mode: optimizer steps taken (a round of replays only takes none)
        self._segments = Attached()

    def push_pull(self, grad: np.ndarray | None, batch: BatchId | None = None, caller: Caller | None = None) -> tuple[int, np.ndarray]:
        """Apply one step's gradient (if any, and if its ``batch`` is new) and return
        (version, parameters). In round mode ``caller`` orders the worker's calls, and the
        gradient joins a round: the reply waits until the round is applied."""
        if self._rounds is not None:
            with self._turn:
                if grad is not None:
                    self._in_round(caller, torch.as_tensor(grad).clone(), batch)
                return self.version, self.param.detach().numpy().copy()  # threads: another round may step meanwhile
        with self._lock:
            if grad is not None:
                self._step(torch.as_tensor(grad), batch)
            # No copy: Ray serialises the return value before the next call can run.
            return self.version, self.param.detach().numpy()

    def _in_round(self, caller: Caller, grad: torch.Tensor, batch: BatchId | None) -> None:
        """(Lock held.) Give ``grad`` to the caller's round and wait until it is applied
        (at once if it came late and was dropped)."""
        rounds = self._rounds
        if not self._wait_turn(caller):
            return
        r = rounds.push(caller.name, (grad, batch))
        self._close_rounds()
        if r is not None:
            self._turn.wait_for(lambda: rounds.is_closed(r) or self._rounds is not rounds)

    def _wait_turn(self, caller: Caller) -> bool:
        """(Lock held.) Wait until ``caller`` is its run's next call, and count it; False if
        the call is void: its run is over (the worker started another), or a rollback
        (``set_state``) came meanwhile."""
        rounds = self._rounds

        def ready() -> bool:
            if self._rounds is not rounds or (caller.name, caller.run) in self._retired_runs or caller.name in rounds.gone or caller.seq == 0:
                return True
            return self._runs.get(caller.name) == caller.run and self._next_seq.get(caller.name, 0) >= caller.seq

        self._turn.wait_for(ready)
        if self._rounds is not rounds or (caller.name, caller.run) in self._retired_runs:
            return False
        if self._runs.get(caller.name) != caller.run:  # this run's first call: the one before is over
            if caller.name in self._runs:
                self._retired_runs.add((caller.name, self._runs[caller.name]))
            self._runs[caller.name] = caller.run
        self._next_seq[caller.name] = caller.seq + 1
        self._turn.notify_all()
        return True

    def _close_rounds(self) -> None:
        """(Lock held.) One optimizer step per round that may close, with the mean of its
        gradients whose batch is new; wake the pushes waiting for them."""
        for payloads in self._rounds.close_ready():
            fresh = [g for g, b in payloads if b is None or self.applied.first_time(BatchId(*b))]
            self.duplicates += len(payloads) - len(fresh)
            if fresh:
                self.rounds_closed += 1
                self.param.grad = torch.stack(fresh).mean(dim=0)
                self.opt.step()
                self.param.grad = None
                self.version += 1
                self.updates += len(fresh)
        self._turn.notify_all()

    def leave(self, caller: Caller) -> None:
        """Round mode: the worker stops pushing for now (parks, waits for input, is done);
        rounds stop waiting for it. Served after its earlier calls."""
        with self._turn:
            if self._wait_turn(caller):
                self._rounds.leave(caller.name)
                self._close_rounds()

    def drop(self, worker: str) -> None:
        """Round mode: ``worker`` is gone (the master forgot it); rounds stop waiting for it."""
        if self._rounds is None:
            return
        with self._turn:
            self._rounds.drop(worker)
            self._close_rounds()

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
            if self._rounds is not None:  # open rounds hold gradients from after the cut: void
                old = self._rounds
                self._rounds = Rounds(old.rule, gone=old.gone, ignored=old.ignored)
                self._retired_runs |= set(self._runs.items())
                self._runs, self._next_seq = {}, {}
                self._turn.notify_all()

    def pull(self) -> tuple[int, np.ndarray]:
        return self.push_pull(None)

    def push_pull_shm(self, name: str, lo: int, hi: int, batch: BatchId | None = None, caller: Caller | None = None) -> tuple[int, None]:
        """``push_pull`` through a worker's shared-memory segment of the whole vector: read
        this shard's slice ``[lo, hi)`` of the gradient from it, write the updated slice
        back into it (see ``dlrover.ps.shm``)."""
        buf = self._segments.array(name)[lo:hi]
        if self._rounds is not None:
            with self._turn:
                self._in_round(caller, torch.from_numpy(buf).clone(), batch)
                buf[:] = self.param.detach().numpy()
                return self.version, None
        with self._lock:
            self._step(torch.from_numpy(buf), batch)
            buf[:] = self.param.detach().numpy()
            return self.version, None

    def forget(self, shards: list[int]) -> None:
        """These shards are done: their batches leave the applied log."""
        with self._lock:
            self.applied.forget(shards)

    def stats(self) -> DenseStats:
        with self._lock:
            rounds = self._rounds is not None
            return DenseStats(
                self.updates, self.duplicates, self.version, self.applied.entries(),
                self.rounds_closed if rounds else None, self._rounds.ignored if rounds else None,
            )  # fmt: skip

    def release(self, name: str) -> None:
        self._segments.release(name)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def ping(self) -> ProcessInfo:
        """The liveness probe."""
        return ProcessInfo(os.getpid(), ray.get_runtime_context().get_node_id())
