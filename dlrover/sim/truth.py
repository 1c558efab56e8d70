"""Ground truth of a simulated job's speed: what the job does, which its policy never sees.

Three kinds (``SimSettings.truth``; see docs/SIMULATOR.md for the sources):

* ``model``: the policy's own form, ``T_iter = t0 + t1 B/cw + t2 w/(p cp) + t3 w/p + t4 w``
  (:mod:`dlrover.resource.perf_model`). Kept for comparison: under it the policy's model
  is correctly specified, so a comparison partly confirms itself.
* ``saturating``: a form the policy does not know. One worker-step is a round trip
  through a closed queueing network, solved exactly by mean-value analysis (Reiser and
  Lavenberg, 1980): each worker computes (``t0 + t1 B A(cw, s_w)``, Amdahl's law with a
  serial fraction: threads give diminishing returns), then is served by every PS in
  parallel (each a queue of demand ``(t2 A(cp, s_p) + t3)`` x its share; the busiest holds
  ``1/p + q (1 - 1/p)`` of the load: a hot spot that stays as PS are added, so it bounds
  throughput) and by the dense PS (one queue of demand ``t4`` whose delay grows with the
  workers: the dense exchange). Actors of a job on one node share its physical cores
  (``node_cpu / threads_per_core``); past them a busy CPU gets ``smt_gain`` of a core.
  With ``s = q = 0`` and no over-commit it is the model's form at ``w = 1``; with many
  workers the busiest queue alone sets the rate (the model adds every term).
* ``profile``: measured points (:mod:`dlrover.sim.profile_truth`).

Every truth gives the throughput of a configuration on nodes of speed 1 with cores of
its own; the cluster multiplies in node speed, stragglers, locality and over-commit.
None has the model's ``k`` (ids a sample): a job's ``t2``, ``t3`` come already scaled to
its ids (:func:`~dlrover.resource.perf_model.at_ids`, :func:`~dlrover.sim.profile_truth.make_truth`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import NamedTuple

from dlrover.resource.configs import Config
from dlrover.resource.perf_model import PerfParams

TRUTHS = ("model", "saturating", "profile")
DEFAULT_TRUTH = "profile"
# A trace row's truth coefficients: the model's terms but the host's (t5, t6), since the
# simulated cluster models cores per node itself (``Contention``, ``Cluster.job_speed``).
TRUTH_TERMS = PerfParams._fields[:5]
SAT_COLUMNS = ("serial_worker", "serial_ps", "ps_hot_share")  # optional trace columns (empty: the defaults below)

# Defaults of the saturating truth where a trace row does not give them. None is a
# measurement: they are assumptions, stated as such in docs/SIMULATOR.md.
SERIAL_WORKER = 0.25  # Amdahl serial fraction of a worker's compute (small-batch MLPs, Python per step)
SERIAL_PS = 0.3  # ... of a PS's (sparse gathers and updates, memory-bound)
HOT_SHARE = 0.05  # the busiest PS's share of the load does not fall below this as PS are added
THREADS_PER_CORE = 2.0  # cloud vCPUs are hardware threads: 64 vCPUs = 32 cores
SMT_GAIN = 0.3  # a second busy hardware thread adds ~30% of a core (assumption)


class Contention(NamedTuple):
    """What a job's actors bring to a node's physical cores (see ``Cluster.job_speed``)."""

    worker_cpu: float  # CPUs one worker competes with (held or busy)
    ps_cpu: float  # ... one PS
    threads_per_core: float | None  # None: only ``ClusterSpec.node_cores`` says the cores
    smt_gain: float  # what a busy CPU past the cores gets of a core (0: cores / CPUs)


class Truth(ABC):
    """A job's ground truth (see the module docstring)."""

    kind: str = ""

    @abstractmethod
    def throughput(self, c: Config, batch: int) -> float:
        """Samples/s of ``c`` on nodes of speed 1, each actor on cores of its own."""

    def step_time(self, c: Config, batch: int) -> float:
        """One worker's step time (s): what its actors would report."""
        return c.workers * batch / self.throughput(c, batch)

    @abstractmethod
    def used_cpu(self, c: Config, batch: int) -> float:
        """CPUs the job keeps busy while it trains (utilisation is this over what it holds)."""

    @abstractmethod
    def contention(self, c: Config, batch: int) -> Contention:
        """CPUs each actor competes with for a node's cores."""


class ModelTruth(Truth):
    """The policy's form (``perf_model``), with today's used-CPU rule: each role busy in
    proportion to its compute term, plus 5% for idle threads."""

    kind = "model"

    def __init__(self, params: PerfParams) -> None:
        self.params = params

    def t_iter(self, c: Config, batch: int) -> float:
        p, w, ps = self.params, c.workers, c.ps
        return p.t0 + p.t1 * batch / c.worker_cpu + p.t2 * w / (ps * c.ps_cpu) + p.t3 * w / ps + p.t4 * w

    def throughput(self, c: Config, batch: int) -> float:
        return c.workers * batch / self.t_iter(c, batch)

    def step_time(self, c: Config, batch: int) -> float:
        return self.t_iter(c, batch)

    def used_cpu(self, c: Config, batch: int) -> float:
        t, step = self.params, self.t_iter(c, batch)
        worker_busy = min(1.0, t.t1 * batch / c.worker_cpu / step + 0.05)
        ps_busy = min(1.0, t.t2 * c.workers / (c.ps * c.ps_cpu) / step + 0.05)
        return c.workers * c.worker_cpu * worker_busy + c.ps * c.ps_cpu * ps_busy

    def contention(self, c: Config, batch: int) -> Contention:
        return Contention(c.worker_cpu, c.ps_cpu, None, 0.0)


class SaturatingParams(NamedTuple):
    """Parameters of the saturating truth: the model's five coefficients (what one
    worker-step costs each resource) and how the resources fall short of the model."""

    t: PerfParams
    serial_worker: float = SERIAL_WORKER
    serial_ps: float = SERIAL_PS
    hot_share: float = HOT_SHARE
    threads_per_core: float = THREADS_PER_CORE
    smt_gain: float = SMT_GAIN


class Solved(NamedTuple):
    """The network solved for one configuration (speed 1)."""

    steps_s: float  # worker-steps per second, all workers together
    worker_busy: float  # CPUs one worker keeps busy
    ps_busy: float  # CPUs one PS keeps busy (mean over the PS)


def amdahl(cpus: float, serial: float) -> float:
    """Time of one unit of work on ``cpus`` threads with serial fraction ``serial``."""
    return serial + (1.0 - serial) / cpus


def hot_share(ps: int, q: float) -> float:
    """Share of the PS load on the busiest of ``ps`` PS: 1/p plus a hot spot ``q`` of what
    the others hold (1 for one PS, -> q for many)."""
    return 1.0 / ps + q * (1.0 - 1.0 / ps)


def mva(think_s: float, ps: list[tuple[float, int]], dense_s: float, customers: int) -> float:
    """Round trips/s of ``customers`` (workers) in a closed network: a delay of ``think_s``
    (compute), then the PS queues ``(demand_s, how many alike)`` in parallel (a step's
    requests fan out to every PS and it waits for the slowest: the largest response, an
    approximation of fork-join), then the dense PS queue. Mean-value analysis."""
    q = [0.0] * len(ps)
    q_dense = x = 0.0
    for n in range(1, customers + 1):
        r = [d * (1.0 + qk) for (d, _), qk in zip(ps, q)]
        r_dense = dense_s * (1.0 + q_dense)
        x = n / (think_s + max(r, default=0.0) + r_dense)
        q = [x * rk for rk in r]
        q_dense = x * r_dense
    return x


class SaturatingTruth(Truth):
    """Amdahl threads, a hot PS, a dense-exchange queue, shared physical cores (module docstring)."""

    kind = "saturating"

    def __init__(self, params: SaturatingParams) -> None:
        self.params = params
        self._memo: dict[tuple, Solved] = {}

    def solve(self, c: Config, batch: int) -> Solved:
        key = (c.workers, c.ps, c.worker_cpu, c.ps_cpu, batch)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._solve(c, batch)
        return got

    def _solve(self, c: Config, batch: int) -> Solved:
        sp = self.params
        t, w, p = sp.t, c.workers, c.ps
        think = t.t0 + t.t1 * batch * amdahl(c.worker_cpu, sp.serial_worker)
        per_ps = t.t2 * amdahl(c.ps_cpu, sp.serial_ps) + t.t3  # a worker-step's PS service, all PS together
        hot = hot_share(p, sp.hot_share)
        queues = [(hot * per_ps, 1)] + ([((1.0 - hot) / (p - 1) * per_ps, p - 1)] if p > 1 else [])
        x = mva(think, queues, t.t4, w)
        return Solved(x, t.t1 * batch * x / w, t.t2 * x / p)

    def throughput(self, c: Config, batch: int) -> float:
        return self.solve(c, batch).steps_s * batch

    def used_cpu(self, c: Config, batch: int) -> float:
        s = self.solve(c, batch)
        return c.workers * s.worker_busy + c.ps * s.ps_busy

    def contention(self, c: Config, batch: int) -> Contention:
        s = self.solve(c, batch)
        return Contention(s.worker_busy, s.ps_busy, self.params.threads_per_core, self.params.smt_gain)


def request_for(truth: SaturatingTruth, workers: int, ps: int, batch: int, over_worker: float, over_ps: float,
                max_cpu: float = 32.0, step: float = 0.5) -> tuple[float, float]:  # fmt: skip
    """CPUs per worker and per PS a user asks for who over-requests by ``over_*`` (CPUs
    asked / CPUs kept busy at that request): the fixed point, rounded to ``step`` CPUs
    (``step``..``max_cpu``). Busy CPUs rise with the CPUs given, so the iteration climbs to it."""
    cw = cp = 1.0
    for _ in range(200):
        s = truth.solve(Config(workers, ps, cw, cp), batch)
        ncw, ncp = min(max_cpu, over_worker * s.worker_busy), min(max_cpu, over_ps * s.ps_busy)
        done = abs(ncw - cw) < 1e-3 * cw and abs(ncp - cp) < 1e-3 * cp
        cw, cp = max(ncw, 0.1 * step), max(ncp, 0.1 * step)
        if done:
            break

    def rounded(x: float) -> float:
        return float(min(max_cpu, max(step, step * math.floor(x / step + 0.5))))

    return rounded(cw), rounded(cp)
