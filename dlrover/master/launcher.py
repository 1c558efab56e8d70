"""Launcher: creates the job's actors on Ray with the names and resources of the spec.

Each actor has a typed :class:`~dlrover.ids.ActorId`; its Ray name (``<job_id>/ps-<i>``,
``<job_id>/dense-ps-<i>-g<generation>``, ``<job_id>/worker-<i>``) lets the Ray dashboard group
a job's actors, and ``id_of`` gives the id back without parsing the name. The launcher knows how to create and kill single actors
and remembers each one's resources; ``dlrover.master.scaler`` decides what to create.
PS ids are stable (``ps-3`` stays ``ps-3`` when ``ps-1`` retires).

Where new actors go: Ray decides, except that they keep off bad nodes (``avoid``) and,
with ``policy.placement: pal``, get a soft affinity to the node PAL picks
(``dlrover.resource.placement``: node speeds from the workers' reported step times, and
before those from a probe run on each node once, K-Means classes, the fastest class with
free CPUs). Soft, so Ray still places an actor
whose node filled up meanwhile.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import math
import os
from collections import Counter
from typing import Any, Callable, Iterable

import numpy as np

from dlrover.data.criteo import FileIndex
from dlrover.errors import DLRoverError
from dlrover.ids import ActorId, Role
from dlrover.model.dlrm import initial_dense_array
from dlrover.master.cluster import ActorDied, CallTimeout, Cluster, get_alive
from dlrover.master.topology import cpu_nodes, node_totals, probe_work_s
from dlrover.ps.dense_rounds import RoundRule
from dlrover.ps.dense_shards import DenseShards, start_dense_shards
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.vshard import VShardMap
from dlrover.resource.configs import Config
from dlrover.resource.fit import Demand, pack
from dlrover.resource.placement import StepSample, merged_speeds, node_speeds, pal_node
from dlrover.spec import JobSpec
from dlrover.ps.shm import shm_prefix
from dlrover.worker.worker import Worker
from dlrover.worker.window import WorkerReport
from dlrover.worker.worker_spec import WorkerSpec, worker_threads

MB = 2**20
ACTOR_START_TIMEOUT_S = 180.0


class Launcher:
    def __init__(
        self, cluster: Cluster, job_id: str, spec: JobSpec, files: dict[str, FileIndex], master: Any, generation: Callable[[], int],
        reports: Callable[[], dict[str, WorkerReport]],
    ) -> None:  # fmt: skip
        """``cluster``: where the actors are made (Ray, or a test's fake).
        ``generation``: the job's rollback count now (the books'): a worker's run
        carries it, and a dense PS re-created by a rollback is named by at least it.
        ``reports``: each worker's latest report (the books'), whose step times and node
        ids measure the nodes for PAL placement."""
        self.cluster = cluster
        self.job_id = job_id
        self.generation = generation
        self.spec = spec
        self.worker_spec = WorkerSpec.of(spec)  # built once: each worker gets only its section
        self.files = files
        # In a Ray task on this node, not here: it builds TorchRec's MLPs, and importing
        # TorchRec (5-6 s of CPU) is all the master would need it for. Started now, it
        # overlaps the PS start-up; a later job of the same driver (a test session, a
        # benchmark) may find a pooled worker that has TorchRec imported already.
        self._initial_ref = cluster.task(initial_dense_array, spec.model, spec.seed, spec.schema, node=cluster.node_id())
        self._initial_dense: np.ndarray | None = None  # kept once fetched: a rollback re-creates the dense PS from it
        self.master = master
        self.ps: dict[int, Any] = {}
        self.dense: DenseShards | None = None  # the dense PS shards
        self._dense_gen = 0  # the generation in their names
        self.workers: dict[str, Any] = {}
        self.latency_ms: dict[int, float] = {}  # PS id -> injected link latency (chaos ``latency``), for every worker
        self.resources: dict[str, tuple[float, int]] = {}  # actor name -> (CPUs, memory MB)
        self.vmap: VShardMap | None = None
        # Pre-started spare actors (``policy.standby``): created, idle, not part of the job
        # until a scale-out takes one, so it skips process start-up and imports.
        self.spare_workers: dict[str, Any] = {}
        self.spare_ps: dict[int, Any] = {}
        self._worker_ids = itertools.count()
        self._ps_ids = itertools.count()
        self.ids: dict[str, ActorId] = {}  # Ray name -> id, of every actor made
        self.nodes: dict[str, str] = {}  # actor name -> node id, once it answered
        self.avoid: set[str] = set()  # bad nodes: new actors go elsewhere when they can
        self._node_rr = itertools.count()
        self.reports = reports
        self._asked: dict[str, str] = {}  # actor -> the node PAL asked for, until it answers from a node
        self._probe_s: dict[str, float] = {}  # PAL: node -> seconds its probe took
        self._probe_tried: set[str] = set()  # nodes probed, answered or not: each is probed once

    def _name(self, actor: ActorId) -> str:
        name = actor.ray_name(self.job_id)
        self.ids[name] = actor
        return name

    def id_of(self, name: str) -> ActorId | None:
        return self.ids.get(name)

    @property
    def dense_names(self) -> tuple[str, ...]:
        return self.dense.names if self.dense is not None else ()

    def launch(self, config: Config) -> None:
        """Start the job's first actors: ``config.ps`` PS, the dense PS, ``config.workers`` workers."""
        spec = self.spec
        dynamic = tuple(spec.schema.dynamic())
        self.vmap = VShardMap.round_robin(spec.schema.table_sizes(), spec.train.vshards_for(config.ps), config.ps, dynamic)
        for _ in range(config.ps):
            self.add_ps(config.ps_cpu, config.ps_memory_mb)
        self.new_dense()
        for _ in range(config.workers):
            self.add_worker(config.worker_cpu, config.worker_memory_mb)
        self.wait_started()

    def check_fits(self, config: Config) -> str | None:
        """Fail at once, naming the shortfall, when the cluster's nodes can never hold
        ``config``'s actors and no autoscaler can add nodes. With one, the job waits (and
        ``wait_started`` gives up after ``ACTOR_START_TIMEOUT_S``): the shortfall is returned."""
        r = self.spec.resources
        demands = [Demand("worker", config.worker_cpu, r.worker_gpu, config.worker_memory_mb)] * config.workers
        demands += [Demand("PS", config.ps_cpu, 0.0, config.ps_memory_mb)] * config.ps + [Demand("dense PS", r.dense_ps_cpu)] * r.dense_ps
        fit = pack(demands, node_totals(self.cluster))
        if not fit.impossible:
            return None
        if not self.cluster.autoscaler_running():
            raise DLRoverError(f"{self.job_id}: the cluster cannot hold the job and no autoscaler can add nodes: {fit.shortfall()} (resources in the spec)")
        return fit.shortfall()

    def initial_dense(self) -> np.ndarray:
        """The MLPs' initial values, the dense PS's starting point."""
        if self._initial_dense is None:
            self._initial_dense, self._initial_ref = self.cluster.get(self._initial_ref), None
        return self._initial_dense

    def new_dense(self) -> None:
        """(Re)create the dense PS shards, on the master's node (with the master, they
        are the part of the job a worker node's loss must not take)."""
        if self.dense is not None:
            for h in self.dense.handles:
                self.cluster.kill(h)
        # A re-created dense PS never takes its predecessor's names (a rollback re-creates
        # it before the books' generation moves on): a late probe answer about a dead
        # shard must not read as news about its replacement.
        gen = self.generation() if self.dense is None else max(self.generation(), self._dense_gen + 1)
        self._dense_gen = gen
        res = self.spec.resources
        self.dense = start_dense_shards(
            self.initial_dense(),
            self.spec.optimizer.dense.model_dump(),
            [self._name(ActorId(Role.DENSE_PS, i, gen)) for i in range(res.dense_ps)],
            RoundRule.of(self.spec.train.dense_sync, self.spec.train.stragglers),
            # A push holds a server thread while it waits for its round: room for as many
            # workers as the budget holds at a quarter CPU each (a policy may size them down).
            max(self.spec.max_actors("worker"), math.ceil((res.elastic_budget_cpu or 0) / 0.25)),
            create=self.cluster.actor,
            num_cpus=res.dense_ps_cpu,
            node=self.cluster.node_id(),
        )

    def _placement(self, cpu: float, name: str) -> str | None:
        """The node for a new actor of ``cpu`` CPUs named
        ``name``: PAL's node with ``policy.placement: pal``, else (or when no node has the
        room) one that is not bad while such nodes are alive."""
        if self.spec.policy.placement != "pal" and not self.avoid:
            return None  # Ray's choice: no need to ask the GCS for the nodes
        alive = cpu_nodes(self.cluster)
        good = sorted(n for n in alive if n not in self.avoid)
        if self.spec.policy.placement == "pal":
            node = self._pal_node({n: alive[n] for n in good} or alive, cpu)
            if node is not None:
                self._asked[name] = node
                return node
        if not self.avoid or not good:
            return None
        return good[next(self._node_rr) % len(good)]

    def _pal_node(self, cpus: dict[str, float], cpu: float) -> str | None:
        """PAL's choice among the nodes of ``cpus`` (node -> its Ray CPUs). A node's room is
        the smaller of Ray's free CPUs there (which count other jobs, but lag a new actor by
        a resource report) and its CPUs less this job's actors on it (where each answered
        from, else where PAL asked it to go), so a placement just made is counted once."""
        for name in [n for n in self._asked if n in self.nodes or n not in self.resources]:
            del self._asked[name]  # its node is known, or it is gone
        ours = dict.fromkeys(cpus, 0.0)
        for name, (actor_cpu, _) in list(self.resources.items()):
            node = self.nodes.get(name) or self._asked.get(name)
            if node in ours:
                ours[node] += actor_cpu
        free = self.cluster.free_cpus()
        room = {n: min(free.get(n, 0.0), cpus[n] - ours[n]) for n in cpus}
        candidates = [n for n in cpus if cpus[n] > 0]
        untried = [n for n in candidates if n not in self._probe_tried]
        if len(candidates) > 1 and untried:  # PAL's profiling run: each node once, once there is a choice
            self._probe_tried.update(untried)
            self._probe_s.update(self.cluster.run_on_nodes(probe_work_s, untried, "node speed"))
        samples = [StepSample(r.node_id, r.step_median_s) for r in self.reports().values() if r.node_id and r.step_median_s]
        return pal_node(room, merged_speeds(node_speeds(samples), self.probed_speeds(), room), cpu)

    def probed_speeds(self) -> dict[str, float]:
        """Each probed node's speed from PAL's probe (1: the probed nodes' median)."""
        return node_speeds(StepSample(n, float(t)) for n, t in self._probe_s.items())

    def ps_name(self, ps_id: int) -> str:
        return ActorId(Role.PS, ps_id).ray_name(self.job_id)

    def add_ps(self, cpu: float, memory_mb: int, reserve_slots: int = 0) -> int:
        """Create one PS actor; it owns the vshards ``self.vmap`` gives its id (none for a
        PS added to a running job, until a migration hands it some, into the
        ``reserve_slots`` it allocates while it starts)."""
        ps_id = next(self._ps_ids)
        if reserve_slots and not self.vmap.dynamic:
            self.vmap = self.vmap.with_reserved(ps_id, reserve_slots)
        name = self._name(ActorId(Role.PS, ps_id))
        self.ps[ps_id] = self.cluster.actor(
            EmbeddingPS, ps_id, self.vmap, self.spec.model.embedding_dim, self.spec.optimizer.sparse.model_dump(), self.spec.seed,
            self.master, name, self.spec.schema.table_specs(),
            name=name, num_cpus=cpu, memory=memory_mb * MB, node=self._placement(cpu, name),
        )  # fmt: skip
        self.resources[name] = (cpu, memory_mb)
        return ps_id

    def switch_map(
        self, vmap: VShardMap, workers: Iterable[str] | None = None, ps: Iterable[int] | None = None, dense: bool = False, alive_only: bool = False,
    ) -> None:  # fmt: skip
        """The one place a running job's vshard map changes and workers learn it, so the
        master's map and the workers' routing never part: ``vmap`` becomes the job's, and
        ``workers`` (default: all; the current map for new ones, or after an aborted
        switch) route by it to the PS ``ps`` (default: all; a switch: those that stay) and,
        with ``dense``, to the dense PS a recovery may have re-created. Waits for every
        answer; ``alive_only``: a worker dead meanwhile is skipped (its run's death is
        handled as any other)."""
        self.vmap = vmap
        to = dict(self.ps) if ps is None else {k: self.ps[k] for k in ps}
        names = list(self.workers) if workers is None else workers
        refs = [self.workers[w].set_routing.remote(to, vmap, self.dense if dense else None) for w in names]
        if alive_only:
            get_alive(self.cluster, refs)
        else:
            self.cluster.get(refs)

    def remove_ps(self, ps_id: int) -> None:
        handle = self.ps.pop(ps_id, None)
        self.resources.pop(self.ps_name(ps_id), None)
        if handle is not None:
            self.cluster.kill(handle)

    def wait_started(self, names: list[str] | None = None) -> None:
        """Fail fast, with a one-line reason, when actors cannot start: a cluster without
        the CPUs or memory the spec asks for would otherwise leave them pending forever.
        ``names``: only these actors (default: all). Each PS's node is known from then on."""
        ps = {self.ps_name(k): h for k, h in self.ps.items() if names is None or self.ps_name(k) in names}
        probes = [h.stats.remote() for h in ps.values()]
        probes += [h.ping.remote() for n, h in self.workers.items() if names is None or n in names]
        if names is None:
            probes += [h.pull.remote() for h in self.dense.handles]
        try:
            replies = self.cluster.get(probes, timeout=ACTOR_START_TIMEOUT_S)
        except CallTimeout:
            raise DLRoverError(
                f"{self.job_id}: actors did not start within {ACTOR_START_TIMEOUT_S:.0f}s; the cluster may lack the "
                f"CPUs/GPUs/memory in resources (workers x worker_cpu/worker_gpu/worker_memory_mb, ps x ps_cpu/ps_memory_mb, dense_ps x dense_ps_cpu)"
            ) from None
        except ActorDied as e:
            raise DLRoverError(f"{self.job_id}: an actor failed to start: {str(e).strip().splitlines()[0]}") from None
        self.nodes.update((n, st.node_id) for n, st in zip(ps, replies) if st.node_id)

    def add_worker(self, cpu: float | None = None, memory_mb: int | None = None) -> str:
        """Create one worker actor and return its name; it trains once ``start``-ed.
        Default size: the spec's ``resources``."""
        res = self.spec.resources
        cpu = res.worker_cpu if cpu is None else cpu
        memory_mb = res.worker_memory_mb if memory_mb is None else memory_mb
        name = self._name(ActorId(Role.WORKER, next(self._worker_ids)))
        # Threads: run, evaluate, pause and set_routing may overlap.
        self.workers[name] = self.cluster.actor(
            Worker, name, self.worker_spec, self.master, dict(self.ps), self.dense, self.vmap, self.files,
            worker_threads(cpu, self.spec.train.threads_per_worker),
            name=name, num_cpus=cpu, num_gpus=res.worker_gpu, memory=memory_mb * MB, max_concurrency=4, node=self._placement(cpu, name),
        )  # fmt: skip
        self.resources[name] = (cpu, memory_mb)
        if self.latency_ms:
            self.workers[name].set_chaos.remote(latency_ms=dict(self.latency_ms))
        return name

    def config(self, exclude: set[str] | frozenset = frozenset()) -> Config:
        """The configuration running now (the most common size per role); ``exclude``:
        workers on their way out (draining)."""
        def common(names: list[str], default: tuple[float, int]) -> tuple[float, int]:
            sizes = [self.resources[n] for n in names if n in self.resources]
            return Counter(sizes).most_common(1)[0][0] if sizes else default

        r = self.spec.resources
        workers = [n for n in list(self.workers) if n not in exclude]  # list(): progress() reads concurrently
        wc, wm = common(workers, (r.worker_cpu, r.worker_memory_mb))
        ps = list(self.ps)
        pc, pm = common([self.ps_name(k) for k in ps], (r.ps_cpu, r.ps_memory_mb))
        return Config(len(workers), len(ps), float(wc), float(pc), int(wm), int(pm))

    def start(self, name: str) -> Any:
        """Begin training on worker ``name``; returns the ObjectRef of its ``run``."""
        return self.workers[name].run.remote(self.generation())

    def handle(self, name: str) -> Any:
        """The handle of an actor of the job by name (None if gone)."""
        actor = self.ids.get(name)
        if actor is None:
            return None
        if actor.role is Role.WORKER:
            return self.workers.get(name)
        if actor.role is Role.PS:
            return self.ps.get(actor.index)
        return self.dense.by_name().get(name) if self.dense is not None else None

    def forget_worker(self, name: str) -> None:
        handle = self.workers.pop(name, None)
        self.resources.pop(name, None)
        for ps in self.ps.values():
            ps.drop.remote(name)
        for h in self.dense.handles if self.dense is not None else ():
            h.drop.remote(name)  # sync rounds stop waiting for it
        if handle is not None:
            self.cluster.kill(handle)

    def add_spares(self, config: Config, n: int) -> None:
        """Keep ``n`` spare workers and PS of ``config``'s sizes (others are given back)."""
        wsize, psize = (config.worker_cpu, config.worker_memory_mb), (config.ps_cpu, config.ps_memory_mb)
        for name in [n_ for n_ in self.spare_workers if self.resources.get(n_) != wsize]:
            self.cluster.kill(self.spare_workers.pop(name))
            self.resources.pop(name, None)
        for k in [k for k in self.spare_ps if self.resources.get(self.ps_name(k)) != psize]:
            self.cluster.kill(self.spare_ps.pop(k))
            self.resources.pop(self.ps_name(k), None)
        while len(self.spare_workers) < n:
            name = self.add_worker(*wsize)
            self.spare_workers[name] = self.workers.pop(name)
        while len(self.spare_ps) < n:
            k = self.add_ps(*psize)
            self.spare_ps[k] = self.ps.pop(k)

    def take_spare_worker(self, cpu: float, memory_mb: int) -> str | None:
        for name in self.spare_workers:
            if self.resources.get(name) == (cpu, memory_mb):
                self.workers[name] = self.spare_workers.pop(name)
                if self.latency_ms:  # started before a link latency was injected
                    self.workers[name].set_chaos.remote(latency_ms=dict(self.latency_ms))
                return name
        return None

    def take_spare_ps(self, cpu: float, memory_mb: int) -> int | None:
        for k in self.spare_ps:
            if self.resources.get(self.ps_name(k)) == (cpu, memory_mb):
                self.ps[k] = self.spare_ps.pop(k)
                return k
        return None

    def shutdown(self) -> None:
        for h in [*self.workers.values(), *self.ps.values(), *self.spare_workers.values(), *self.spare_ps.values(), *(self.dense.handles if self.dense else ())]:
            self.cluster.kill(h)
        # Exchange segments of workers that were killed before they could remove them
        # (this node only; see dlrover.worker.dense_client).
        for path in glob.glob(f"/dev/shm/{shm_prefix(self.job_id)}*"):
            with contextlib.suppress(OSError):
                os.unlink(path)
