"""Where a simulated job's actors run, and the cluster totals that follow from it.

A mixin of :class:`dlrover.sim.engine.Simulator`: placing a job, moving it to a new
configuration the way the live scaler does, moving single workers off slow nodes, and
keeping the allocated / used CPU and memory totals the utilisation figures integrate.
"""

from __future__ import annotations

import numpy as np

from dlrover.resource.configs import Config
from dlrover.sim.job import SimJob


class PlacementMixin:
    """Actor placement of :class:`~dlrover.sim.engine.Simulator`'s jobs on its cluster."""

    def _place(self, j: SimJob, c: Config, avoid_slow: bool = False) -> bool:
        got = self.cluster.place(
            c.workers, c.worker_cpu, c.worker_memory_mb, c.ps, c.ps_cpu, c.ps_memory_mb, pal=self.s.placement == "pal", avoid_slow=avoid_slow
        )
        if got is None:
            return False
        self._occupy(j, *got, taken=True)
        return True

    def _occupy(self, j: SimJob, worker_nodes: np.ndarray, ps_nodes: np.ndarray, taken: bool = False) -> None:
        """``j`` (of ``j.config``) runs on these nodes; ``taken``: the cluster already counts it."""
        c = j.config
        assert c is not None
        if not taken:
            self.cluster.take(worker_nodes, c.worker_cpu, c.worker_memory_mb)
            self.cluster.take(ps_nodes, c.ps_cpu, c.ps_memory_mb)
        old = j.worker_nodes
        j.worker_nodes, j.ps_nodes = worker_nodes, ps_nodes
        for node in set(worker_nodes.tolist()) | set(ps_nodes.tolist()):
            self.node_jobs.setdefault(node, set()).add(j.idx)
        self._set_alloc(j, c.cpu, c.memory_mb)
        self._workers_placed(j, old)

    def _unplace(self, j: SimJob) -> None:
        c = j.config
        assert c is not None and j.worker_nodes is not None and j.ps_nodes is not None
        self.cluster.release(j.worker_nodes, c.worker_cpu, c.worker_memory_mb)
        self.cluster.release(j.ps_nodes, c.ps_cpu, c.ps_memory_mb)
        for node in set(j.worker_nodes.tolist()) | set(j.ps_nodes.tolist()):
            s = self.node_jobs.get(node)
            if s is not None:
                s.discard(j.idx)
        j.worker_nodes = j.ps_nodes = None
        self._set_alloc(j, 0.0, 0.0)
        self._set_used(j, 0.0, 0.0)

    def _set_alloc(self, j: SimJob, cpu: float, mem: float) -> None:
        self.tot["alloc_cpu"] += cpu - j.alloc_cpu
        self.tot["alloc_mem"] += mem - j.alloc_mem
        j.alloc_cpu, j.alloc_mem = cpu, mem

    def _set_used(self, j: SimJob, cpu: float, mem: float) -> None:
        self.tot["used_cpu"] += cpu - j.used_cpu
        self.tot["used_mem"] += mem - j.used_mem
        j.used_cpu, j.used_mem = cpu, mem

    def _replace_actors(self, j: SimJob, new: Config) -> bool:
        """Move ``j`` to ``new`` as the live scaler does: a role whose actor size stays
        keeps its actors (surplus ones retire, new ones go next to the job's nodes); a
        resized role is placed anew. False, and nothing changed, if it does not fit."""
        old = j.config
        assert old is not None and j.worker_nodes is not None and j.ps_nodes is not None
        cl = self.cluster
        kept = (j.worker_nodes, j.ps_nodes)
        roles = [
            (kept[0], old.workers, new.workers, (old.worker_cpu, old.worker_memory_mb), (new.worker_cpu, new.worker_memory_mb)),
            (kept[1], old.ps, new.ps, (old.ps_cpu, old.ps_memory_mb), (new.ps_cpu, new.ps_memory_mb)),
        ]
        for nodes, _, _, size, _ in roles:  # release everything, then take what is kept back
            cl.release(nodes, *size, undo=True)
        prefer = np.zeros(len(cl.cpu), dtype=bool)
        prefer[np.concatenate(kept)] = True
        out: list[np.ndarray] = []
        taken: list[tuple[np.ndarray, tuple]] = []
        for nodes, n_old, n_new, size_old, size_new in roles:
            if size_old == size_new:
                keep = nodes[: min(n_old, n_new)]
                cl.take(keep, *size_new)
                taken.append((keep, size_new))
                more = cl.fill(n_new - len(keep), *size_new, cl.alive, prefer) if n_new > len(keep) else keep[:0]
            else:
                keep, more = nodes[:0], cl.fill(n_new, *size_new, cl.alive, prefer)
            if more is None:
                for got, size in taken:
                    cl.release(got, *size, undo=True)
                for nodes_, _, _, size, _ in roles:
                    cl.take(nodes_, *size)
                return False
            taken.append((more, size_new))
            out.append(np.concatenate([keep, more]))
        for node in set(np.concatenate(kept).tolist()):
            self.node_jobs.get(node, set()).discard(j.idx)
        cl.released += 1  # a role may have shrunk: queued jobs may fit now
        j.config = new
        self._occupy(j, out[0], out[1], taken=True)
        return True

    def _move_workers(self, j: SimJob, moved: list[int]) -> bool:
        """Workers ``moved`` (indices) go to fresh nodes that are alive and not slow; False,
        and nothing changed, if there is no room for them."""
        c = j.config
        assert c is not None and j.worker_nodes is not None and j.ps_nodes is not None
        idx = [k for k in moved if k < len(j.worker_nodes)]
        nodes = j.worker_nodes[idx]
        self.cluster.release(nodes, c.worker_cpu, c.worker_memory_mb, undo=True)
        got = self.cluster.fill(len(idx), c.worker_cpu, c.worker_memory_mb, self.cluster.alive & ~self.cluster.slow, None)
        if got is None:
            self.cluster.take(nodes, c.worker_cpu, c.worker_memory_mb)
            return False
        self.cluster.released += 1
        self._settle(j)
        old = j.worker_nodes
        j.worker_nodes = old.copy()
        j.worker_nodes[idx] = got
        now_on = set(j.worker_nodes.tolist()) | set(j.ps_nodes.tolist())
        for node in set(old.tolist()) - now_on:
            self.node_jobs.get(node, set()).discard(j.idx)
        for node in got.tolist():
            self.node_jobs.setdefault(node, set()).add(j.idx)
        self._workers_placed(j, old)
        return True
