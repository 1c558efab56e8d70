"""The simulated cluster: nodes with CPU and memory, speed variability and failures.

* **Speed variability (PAL, arXiv 2408.11919).** Each node has a fixed performance
  factor (median 1, log-normal spread ``perf_sigma``). K-Means over the factors gives
  ``perf_classes`` classes; a class's score is its centroid over the median centroid
  (``dlrover.resource.placement``, which live jobs' ``policy.placement: pal`` uses too).
* **Stragglers (two-class slow/active model, Johri et al. arXiv 2105.06124).** A node is
  *active* or *slow*; every ``straggle_step_s`` an active node turns slow with
  probability ``p_slow`` and a slow node stays slow with probability ``p_stay`` (the
  persistence). A slow node runs at ``slow_factor`` of its speed. Spells are drawn as
  geometric numbers of steps, so a node costs one event per spell, not one per step.
* **Failures (Kokolis et al. arXiv 2410.21680).** Each node fails at ``failure_rate``
  per node-day (exponential times), so the cluster's MTTF is ``1 / (nodes x rate)``;
  a failed node is back after ``repair_s``.

Placement is vectorised over the nodes (numpy): ``packed`` is best fit (fewest nodes,
the fullest that fits first); ``pal`` tries the fastest performance class first and
keeps the placement with the best expected speed x locality.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrover.resource.placement import kmeans_classes


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 40
    node_cpu: float = 64.0
    node_memory_mb: float = 256 * 1024
    perf_sigma: float = 0.12  # log-normal spread of node speed (PAL measured ~10-20% on GPUs)
    perf_classes: int = 3  # K-Means classes over node speed (PAL)
    p_slow: float = 0.01  # active -> slow per straggle step (Johri et al.: p_a = 0.01)
    p_stay: float = 0.8  # slow -> slow per straggle step (persistence; p_s = 0.8)
    slow_factor: float = 0.4  # speed of a slow node
    straggle_step_s: float = 600.0
    failure_rate: float = 6.5e-3  # failures per node-day (RSC-1: 6.50 per 1000 node-days)
    repair_s: float = 3600.0
    locality_factor: float = 0.95  # speed when a job's actors span several nodes (PAL's lf_across)
    node_cores: float | None = None  # physical cores per node when CPUs are over-committed (None: node_cpu, no over-commit)


def cores_speed(load: float, cores: float, smt_gain: float) -> float:
    """Speed of actors keeping ``load`` CPUs busy on ``cores`` physical cores: 1 up to the
    cores; past them each busy CPU beyond a core gets ``smt_gain`` of one."""
    if load <= cores or load <= 0:
        return 1.0
    return (cores + smt_gain * (load - cores)) / load


class Cluster:
    """Node state (numpy arrays) and placement. Times and randomness come from the caller."""

    def __init__(self, spec: ClusterSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        n = spec.nodes
        self.cpu = np.full(n, float(spec.node_cpu))
        self.mem = np.full(n, float(spec.node_memory_mb))
        self.free_cpu = self.cpu.copy()
        self.free_mem = self.mem.copy()
        self.perf = np.exp(rng.normal(0.0, spec.perf_sigma, n)) if spec.perf_sigma > 0 else np.ones(n)
        self.perf /= np.median(self.perf)
        if spec.perf_classes > 1 and spec.perf_sigma > 0 and n > spec.perf_classes:
            self.cls, self.cls_score = kmeans_classes(self.perf, spec.perf_classes)
        else:
            self.cls, self.cls_score = np.zeros(n, dtype=np.int64), np.ones(1)
        self.slow = np.zeros(n, dtype=bool)
        self.alive = np.ones(n, dtype=bool)
        self.released = 0  # bumped whenever capacity frees up (lets the scheduler skip hopeless retries)
        self.changes = 0  # bumped on every take/release/node state change (cache key of free_totals)
        self._totals_at: tuple | None = None
        self._totals = (0.0, 0.0)
        self._fits_empty: dict[tuple, bool] = {}

    # -- speed --------------------------------------------------------------------------
    def speed(self, nodes: np.ndarray) -> np.ndarray:
        """Current speed factor of ``nodes`` (stragglers included)."""
        return self.perf[nodes] * np.where(self.slow[nodes], self.spec.slow_factor, 1.0)

    def job_speed(
        self, worker_nodes: np.ndarray, ps_nodes: np.ndarray, worker_cpu: float = 0.0, ps_cpu: float = 0.0,
        cores: float | None = None, smt_gain: float = 0.0,
    ) -> float:  # fmt: skip
        """A job's speed factor: workers train asynchronously (dynamic shards), so the job
        goes at their mean speed; every step waits on every PS, so the slowest PS bounds
        it; actors spread over several nodes pay the locality factor; with ``cores``
        (default ``node_cores``) the node where this job's actors compete with the most
        CPUs (``worker_cpu`` each worker, ``ps_cpu`` each PS: held or busy, as the truth
        says) runs at :func:`cores_speed` (cores / CPUs without ``smt_gain``)."""
        f = float(self.speed(worker_nodes).sum()) / len(worker_nodes) * float(self.speed(ps_nodes).min())
        if len(np.unique(np.concatenate([worker_nodes, ps_nodes]))) > 1:
            f *= self.spec.locality_factor
        cores = self.spec.node_cores if cores is None else cores
        if cores and (worker_cpu or ps_cpu):
            n = len(self.cpu)
            load = np.bincount(worker_nodes, minlength=n) * worker_cpu + np.bincount(ps_nodes, minlength=n) * ps_cpu
            top = float(load.max())
            f = f / max(1.0, top / cores) if smt_gain == 0 else f * cores_speed(top, cores, smt_gain)
        return f

    # -- resources ----------------------------------------------------------------------
    def release(self, nodes: np.ndarray, cpu: float, mem: float, undo: bool = False) -> None:
        """Give capacity back; ``undo``: a trial placement taken back (nothing really freed)."""
        if not undo:
            self.released += 1
        self.changes += 1
        np.add.at(self.free_cpu, nodes, cpu)
        np.add.at(self.free_mem, nodes, mem)

    def take(self, nodes: np.ndarray, cpu: float, mem: float) -> None:
        self.changes += 1
        np.subtract.at(self.free_cpu, nodes, cpu)
        np.subtract.at(self.free_mem, nodes, mem)

    def set_alive(self, node: int, alive: bool) -> None:
        """A node fails (its whole capacity is held until repair: nothing new goes there;
        what its actors held comes back as they are released) or is back."""
        sign = 1.0 if alive else -1.0
        self.alive[node] = alive
        self.free_cpu[node] += sign * self.cpu[node]
        self.free_mem[node] += sign * self.mem[node]
        self.changes += 1
        if alive:
            self.released += 1

    def fits_empty(self, workers: int, worker_cpu: float, worker_mem: float, ps: int, ps_cpu: float, ps_mem: float) -> bool:
        """Whether the job fits the cluster with every node up and empty (memoised: the
        same configurations come back job after job)."""
        key = (workers, worker_cpu, worker_mem, ps, ps_cpu, ps_mem)
        if key not in self._fits_empty:
            saved = self.free_cpu, self.free_mem, self.changes
            self.free_cpu, self.free_mem = self.cpu.copy(), self.mem.copy()
            try:
                self._fits_empty[key] = self._place_on(workers, worker_cpu, worker_mem, ps, ps_cpu, ps_mem, np.ones(len(self.cpu), dtype=bool)) is not None
            finally:
                self.free_cpu, self.free_mem, self.changes = saved
        return self._fits_empty[key]

    def free_totals(self) -> tuple[float, float]:
        """Free CPU and memory on live nodes (cached until capacity changes hands)."""
        key = (self.changes, self.released)
        if self._totals_at != key:
            up = self.alive
            self._totals = (float(self.free_cpu[up].sum()), float(self.free_mem[up].sum()))
            self._totals_at = key
        return self._totals

    def fits_total(self, cpu: float, mem: float) -> bool:
        free_cpu, free_mem = self.free_totals()
        return free_cpu >= cpu - 1e-9 and free_mem >= mem

    def fill(self, n: int, cpu: float, mem: float, allowed: np.ndarray, prefer: np.ndarray | None) -> np.ndarray | None:
        """Best fit of ``n`` equal actors on ``allowed`` nodes (taken from ``self.free_*``;
        nothing taken if they do not all fit). Returns the node of each actor.

        Works on the nodes with room for one actor only: on a busy cluster those are few,
        and this is the simulator's hottest function."""
        idx = np.flatnonzero((self.free_cpu >= cpu) & (self.free_mem >= mem) & allowed)
        if len(idx) == 0:
            return None
        room = np.minimum(self.free_cpu[idx] // max(cpu, 1e-9), self.free_mem[idx] // max(mem, 1e-9))
        if room.sum() < n:  # the common failure, decided here
            return None
        pref = prefer[idx].copy() if prefer is not None else None
        out: list[np.ndarray] = []
        left = n
        while left > 0:
            cand = room
            if pref is not None and pref.any():  # nodes this job already uses first (locality)
                room_pref = np.where(pref, room, 0)
                if room_pref.max() >= 1:
                    cand = room_pref
            # Best fit: the node with the least room that takes them all, else the roomiest.
            whole = np.flatnonzero(cand >= left)
            j = int(whole[np.argmin(cand[whole])]) if len(whole) else int(np.argmax(cand))
            k = int(min(left, room[j]))
            room[j] -= k
            out.append(np.full(k, idx[j], dtype=np.int64))
            left -= k
            if pref is not None:
                pref[j] = True
        nodes = np.concatenate(out)
        self.take(nodes, cpu, mem)
        return nodes

    def place(
        self, workers: int, worker_cpu: float, worker_mem: float, ps: int, ps_cpu: float, ps_mem: float, pal: bool = False, avoid_slow: bool = False
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Node of every worker and PS, or ``None`` if the job does not fit (nothing taken)."""
        if not self.fits_total(workers * worker_cpu + ps * ps_cpu, workers * worker_mem + ps * ps_mem):
            return None
        base = self.alive & ~self.slow if avoid_slow else self.alive
        options = [base]
        if pal:  # fastest class only, then the two fastest, ... (PAL's variability x locality)
            options = [base & (self.cls <= c) for c in range(len(self.cls_score))]
        best: tuple[float, np.ndarray, np.ndarray] | None = None
        for allowed in options:
            got = self._place_on(workers, worker_cpu, worker_mem, ps, ps_cpu, ps_mem, allowed)
            if got is None:
                continue
            wn, pn = got
            self.release(wn, worker_cpu, worker_mem, undo=True)
            self.release(pn, ps_cpu, ps_mem, undo=True)
            score = self.job_speed(wn, pn)
            if best is None or score > best[0] + 1e-12:
                best = (score, wn, pn)
            if not pal:
                break
        if best is None:
            return None
        self.take(best[1], worker_cpu, worker_mem)
        self.take(best[2], ps_cpu, ps_mem)
        return best[1], best[2]

    def _place_on(self, workers, worker_cpu, worker_mem, ps, ps_cpu, ps_mem, allowed) -> tuple[np.ndarray, np.ndarray] | None:
        pn = self.fill(ps, ps_cpu, ps_mem, allowed, None)
        if pn is None:
            return None
        prefer = np.zeros(len(self.cpu), dtype=bool)
        prefer[pn] = True
        wn = self.fill(workers, worker_cpu, worker_mem, allowed, prefer)
        if wn is None:
            self.release(pn, ps_cpu, ps_mem, undo=True)
            return None
        return wn, pn
