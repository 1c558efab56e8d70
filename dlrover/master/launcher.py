"""Launcher: creates the job's actors on Ray with the names and resources of the spec.

Names follow ``<job_id>/ps-<i>``, ``<job_id>/dense-ps``, ``<job_id>/worker-<i>`` so the Ray
dashboard groups a job's actors. Embedded in the master now; the elastic Scaler (issue 3)
grows out of ``add_worker`` / ``forget_worker``.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
from typing import Any

import ray
import torch

from dlrover.data.criteo import FileIndex
from dlrover.errors import DLRoverError
from dlrover.model.dlrm import PSEmbeddingBagCollection, build_dense_dlrm, dense_parameters, table_configs
from dlrover.ps.dense_ps import DenseParamServer
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.vshard import VShardMap
from dlrover.spec import JobSpec
from dlrover.worker.dense_client import shm_prefix
from dlrover.worker.worker import Worker, worker_threads

MB = 2**20
ACTOR_START_TIMEOUT_S = 180.0


def initial_dense_params(spec: JobSpec) -> torch.Tensor:
    model = build_dense_dlrm(spec.model, PSEmbeddingBagCollection(table_configs(spec.model)), spec.seed)
    return torch.nn.utils.parameters_to_vector(dense_parameters(model)).detach()


class Launcher:
    def __init__(self, job_id: str, spec: JobSpec, files: dict[str, FileIndex], master: Any) -> None:
        self.job_id = job_id
        self.spec = spec
        self.files = files
        self.master = master
        self.ps: list[Any] = []
        self.dense_ps: Any = None
        self.workers: dict[str, Any] = {}
        self.vmap: VShardMap | None = None
        self._worker_ids = itertools.count()

    def _name(self, role: str) -> str:
        return f"{self.job_id}/{role}"

    def launch(self, workers: int, ps: int) -> None:
        spec, res = self.spec, self.spec.resources
        self.vmap = VShardMap.round_robin(spec.model.table_sizes(), max(spec.train.vshards, ps), ps)
        ps_cls = ray.remote(EmbeddingPS)
        opt = spec.optimizer.sparse.model_dump()
        self.ps = [
            ps_cls.options(name=self._name(f"ps-{i}"), num_cpus=res.ps_cpu, memory=res.ps_memory_mb * MB).remote(
                i, self.vmap, spec.model.embedding_dim, opt, spec.seed, worker_threads(res.ps_cpu, None)
            )
            for i in range(ps)
        ]
        self.dense_ps = (
            ray.remote(DenseParamServer)
            .options(name=self._name("dense-ps"), num_cpus=0, max_concurrency=1)
            .remote(initial_dense_params(spec).numpy(), spec.optimizer.dense.model_dump())
        )
        for _ in range(workers):
            self.add_worker()
        self._wait_started()

    def _wait_started(self) -> None:
        """Fail fast, with a one-line reason, when actors cannot start: a cluster without
        the CPUs or memory the spec asks for would otherwise leave them pending forever."""
        probes = [p.stats.remote() for p in self.ps] + [self.dense_ps.pull.remote()] + [w.ping.remote() for w in self.workers.values()]
        try:
            ray.get(probes, timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise DLRoverError(
                f"{self.job_id}: actors did not start within {ACTOR_START_TIMEOUT_S:.0f}s; the cluster may lack the "
                f"CPUs/memory in resources (workers x worker_cpu/worker_memory_mb, ps x ps_cpu/ps_memory_mb)"
            ) from None
        except ray.exceptions.RayActorError as e:
            raise DLRoverError(f"{self.job_id}: an actor failed to start: {str(e).strip().splitlines()[0]}") from None

    def add_worker(self) -> str:
        """Create one worker actor and return its name; it trains once ``start``-ed."""
        res = self.spec.resources
        name = self._name(f"worker-{next(self._worker_ids)}")
        self.workers[name] = (
            ray.remote(Worker)
            .options(name=name, num_cpus=res.worker_cpu, memory=res.worker_memory_mb * MB, max_concurrency=2)
            .remote(
                name,
                self.spec.model_dump(),
                self.master,
                self.ps,
                self.dense_ps,
                self.vmap,
                self.files,
                worker_threads(res.worker_cpu, self.spec.train.threads_per_worker),
            )
        )
        return name

    def start(self, name: str) -> Any:
        """Begin training on worker ``name``; returns the ObjectRef of its ``run``."""
        return self.workers[name].run.remote()

    def forget_worker(self, name: str) -> None:
        handle = self.workers.pop(name, None)
        for ps in self.ps:
            ps.drop.remote(name)
        if handle is not None:
            ray.kill(handle, no_restart=True)

    def shutdown(self) -> None:
        for h in [*self.workers.values(), *self.ps, self.dense_ps]:
            if h is not None:
                ray.kill(h, no_restart=True)
        # Exchange segments of workers that were killed before they could remove them
        # (this node only; see dlrover.worker.dense_client).
        for path in glob.glob(f"/dev/shm/{shm_prefix(self.job_id)}*"):
            with contextlib.suppress(OSError):
                os.unlink(path)
