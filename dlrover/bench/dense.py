"""``dlrover bench dense``: the dense-parameter exchange, dense PS (1 or more shards) vs a
gloo allreduce among the workers, at 1, 2 and 4 workers.

Each worker is a Ray actor training the MLPs of ``bench throughput``'s DLRM (TorchRec's
``DenseArch`` and ``OverArch``, built by ``dense_arches``: 462,609 parameters; the
interaction has none) on synthetic inputs of batch 2048, and exchanging its gradient every
step:

- ``ps-N``: through the job's own code path (``DenseClient`` to ``N`` ``DenseParamServer``
  shards, shared memory on one node): asynchronous, each worker applies its gradient
  and loads the parameters, as a dlrover worker does;
- ``allreduce``: a gloo process group on loopback, the gradient averaged then the same
  optimizer stepped on every worker (synchronous data parallel; with 1 worker: a local
  optimizer step). Also timed: forming the group again, what each rescale would cost.

Embeddings are left out on purpose: both ways leave them on the embedding PS, and this
isolates what differs. Samples/s is over all workers, from the first measured step to
the slowest worker's last.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
import torch

from dlrover.data.schema import CRITEO
from dlrover.driver.localhead import free_port
from dlrover.spec import ModelSpec

BATCH = 2048
OPTIMIZER = {"name": "adagrad", "lr": 0.05}
WARMUP = 3


def bench_model() -> ModelSpec:
    """The MLPs of ``bench throughput``'s model."""
    from dlrover.bench.throughput import bench_spec

    return bench_spec("/nonexistent", rows=BATCH, batch_size=BATCH).model


def dense_mlps(seed: int = 0) -> torch.nn.ModuleDict:
    from dlrover.model.dlrm import dense_arches

    dense, _, over = dense_arches(bench_model(), seed)  # the bench's DLRM: a dot interaction, no parameters
    return torch.nn.ModuleDict({"dense": dense, "over": over})


class DenseBenchWorker:
    """One worker: the MLPs' forward/backward each step, then the exchange of ``mode``."""

    def __init__(self, rank: int, world: int, threads: int, seed: int = 0) -> None:
        torch.set_num_threads(threads)
        self.rank, self.world = rank, world
        self.model = dense_mlps(seed)  # every worker starts from the same parameters
        self.params = list(self.model.parameters())
        g = torch.Generator().manual_seed(rank)
        f = len(CRITEO.sparse)  # the bench's job trains Criteo's layout
        self.x = torch.randn(BATCH, CRITEO.dense_width, generator=g)
        # The over arch's other input: the pairwise interactions and the pooled embeddings.
        self.z = torch.randn(BATCH, f * (f - 1) // 2 + f, generator=g)
        self.y = (torch.rand(BATCH, generator=g) < 0.25).float()

    def initial(self) -> np.ndarray:
        return torch.nn.utils.parameters_to_vector(self.params).detach().numpy().copy()

    def _backward(self) -> None:
        for p in self.params:
            p.grad = None
        h = self.model["dense"](self.x)
        out = self.model["over"](torch.cat([h, self.z], dim=1)).squeeze(-1)
        torch.nn.functional.binary_cross_entropy_with_logits(out, self.y).backward()

    def form_group(self, address: str) -> float:
        """Join (or re-form) the gloo group; seconds it took."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=address, rank=self.rank, world_size=self.world)
        return time.perf_counter() - t0

    def run_allreduce(self, steps: int) -> tuple[float, float, float]:
        """(start, end, exchange seconds) over ``steps`` measured steps."""
        import torch.distributed as dist

        from dlrover.ps.dense_ps import make_dense_optimizer

        opt = make_dense_optimizer(self.params, OPTIMIZER)
        flat = torch.zeros(sum(p.numel() for p in self.params))
        exchange, t_start = 0.0, 0.0
        for i in range(WARMUP + steps):
            if i == WARMUP:
                exchange, t_start = 0.0, time.perf_counter()
            self._backward()
            t0 = time.perf_counter()
            if self.world > 1:
                torch.cat([p.grad.reshape(-1) for p in self.params], out=flat)
                dist.all_reduce(flat)
                flat /= self.world
                torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.params])
            opt.step()
            exchange += time.perf_counter() - t0
        return t_start, time.perf_counter(), exchange

    def run_ps(self, dense: Any, steps: int) -> tuple[float, float, float]:
        """The dlrover worker's loop: load the last push's reply, compute, push."""
        from dlrover.worker.dense_client import DenseClient

        client = DenseClient(self.params, dense, owner=f"bench-dense-{os.getpid()}")
        try:
            client.pull()
            refs: list[Any] = []
            exchange, t_start = 0.0, 0.0
            for i in range(WARMUP + steps):
                if i == WARMUP:
                    exchange, t_start = 0.0, time.perf_counter()
                t0 = time.perf_counter()
                if refs:
                    client.apply(refs)
                exchange += time.perf_counter() - t0
                self._backward()
                t0 = time.perf_counter()
                refs = client.push()
                exchange += time.perf_counter() - t0
            client.apply(refs)
            return t_start, time.perf_counter(), exchange
        finally:
            client.close()


def _row(mode: str, workers: int, spans: list[tuple[float, float, float]], steps: int, **extra: Any) -> dict:
    wall = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return {
        "mode": mode, "workers": workers, "samples_per_s": workers * steps * BATCH / wall,
        "exchange_ms": 1e3 * float(np.mean([x for _, _, x in spans])) / steps, "step_ms": 1e3 * wall / steps, **extra,
    }  # fmt: skip


def measure(mode: str, workers: int, steps: int, threads: int) -> dict:
    """One point: ``workers`` fresh worker actors exchanging the ``mode`` way."""
    import ray

    from dlrover.ps.dense_shards import start_dense_shards

    actor = ray.remote(DenseBenchWorker).options(num_cpus=0)
    ws = [actor.remote(r, workers, threads) for r in range(workers)]
    shards: tuple[Any, ...] = ()
    try:
        if mode == "allreduce":
            address = f"tcp://127.0.0.1:{free_port()}"
            first = max(ray.get([w.form_group.remote(address) for w in ws]))
            address = f"tcp://127.0.0.1:{free_port()}"
            again = max(ray.get([w.form_group.remote(address) for w in ws]))
            spans = ray.get([w.run_allreduce.remote(steps) for w in ws])
            return _row(mode, workers, spans, steps, form_s=first, reform_s=again)
        n = int(mode.split("-")[1])
        dense = start_dense_shards(ray.get(ws[0].initial.remote()), OPTIMIZER, [f"bench-dense-{i}" for i in range(n)], num_cpus=0)
        shards = dense.handles
        spans = ray.get([w.run_ps.remote(dense, steps) for w in ws])
        return _row(mode, workers, spans, steps)
    finally:
        for h in [*ws, *shards]:
            ray.kill(h, no_restart=True)


def run_dense_bench(workers: list[int], shards: list[int], steps: int, progress: bool = True) -> dict:
    """Every (mode, workers) point on an embedded local Ray; rows with efficiency against
    ``workers x`` the mode's 1-worker samples/s (or its smallest worker count)."""
    import ray

    from dlrover.driver.runner import ray_runtime_env

    cores = os.cpu_count() or 1
    modes = [f"ps-{n}" for n in shards] + ["allreduce"]
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=max(cores, 8), include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR",
                 runtime_env=ray_runtime_env())  # fmt: skip
    rows = []
    try:
        for w in workers:
            for mode in modes:
                if progress:
                    print(f"  {mode} x {w} worker(s) ...", flush=True, file=sys.stderr)
                rows.append(measure(mode, w, steps, threads=max(1, cores // w)))
    finally:
        if started:
            ray.shutdown()
    for r in rows:
        base = min((x for x in rows if x["mode"] == r["mode"]), key=lambda x: x["workers"])
        r["efficiency"] = r["samples_per_s"] / (base["samples_per_s"] * r["workers"] / base["workers"])
    dense_params = sum(p.numel() for p in dense_mlps().parameters())
    return {"cores": cores, "batch_size": BATCH, "steps": steps, "dense_params": dense_params, "rows": rows}


def print_dense(result: dict) -> None:
    print(f"dense exchange, {result['dense_params']:,} parameters, batch {result['batch_size']}, {result['steps']} steps per worker, {result['cores']} cores")
    print(f"{'mode':>10} {'workers':>7} {'samples/s':>10} {'step ms':>8} {'exchange ms':>11} {'efficiency':>10} {'re-form s':>9}")
    for r in result["rows"]:
        reform = f"{r['reform_s']:.2f}" if "reform_s" in r else ""
        print(f"{r['mode']:>10} {r['workers']:>7} {r['samples_per_s']:>10,.0f} {r['step_ms']:>8.1f} {r['exchange_ms']:>11.2f} {r['efficiency']:>10.2f} {reform:>9}")
