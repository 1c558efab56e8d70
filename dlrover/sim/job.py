"""A simulated job: its record, the simulated platform's settings, and the job's truth.

The truth (throughput from :mod:`dlrover.sim.truth`, memory from its peak need) is what
the job *does*; its policy never sees it, only what the job's
:class:`~dlrover.resource.driver.PolicyDriver` was fed: windows measured from the job's
progress (times the window's noise), actors' step times and RSS samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlrover.resource.driver import PolicyDriver
from dlrover.resource.perf_model import PerfParams
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import ResourcePlan
from dlrover.sim.cluster import ClusterSpec
from dlrover.sim.truth import Truth

PS_BASE_MB = 512.0  # per-PS process overhead over its share of the embeddings (a PS of this repo idles at ~400 MB)


def t_iter(p: PerfParams, c: Config, batch: int) -> float:
    """``T_iter`` of ``dlrover.resource.perf_model.step_time`` for one config, in plain
    floats (the simulator evaluates it millions of times; a test keeps the two equal)."""
    w, ps = c.workers, c.ps
    return p.t0 + p.t1 * batch / c.worker_cpu + p.t2 * w / (ps * c.ps_cpu) + p.t3 * w / ps + p.t4 * w


@dataclass(frozen=True)
class SimSettings:
    """Runtime costs and control of the simulated platform (not of a policy)."""

    control_interval_s: float = 300.0  # how often a job's policy is asked (DLRover: 300 s between plans)
    restart_s: float = 120.0  # first start / restart after a failure: actors start, state loads
    rescale_s: float = 30.0  # reconfiguration: new actors start while the old ones train on
    rescale_pause_s: float = 5.0  # reconfiguration: the switch (PS migration, routing)
    checkpoint_interval_s: float = 1800.0  # durable checkpoints (rollback target after a lost PS)
    # What a failure costs: the live master's failure policy (dlrover.faults.policy), as
    # checkpoint.on_failure and recovery.ps set it. The figures assume "rollback": partial
    # recovery keeps every trained sample, and the simulator does not model updates lost.
    on_failure: str = "recover"  # recover | restart
    ps_recovery: str = "rollback"  # partial | rollback
    warmup_s: float = 60.0  # a new configuration's measurement window starts this late
    measure_noise: float = 0.03  # multiplicative noise of a measured window (log-normal sigma)
    rss_report_s: float = 10.0  # actors report RSS this often (a tick feeds the driver the last minute's)
    mem_start: float = 0.6  # RSS at the start, as a fraction of the peak
    mem_fill: float = 0.5  # fraction of the job by which RSS reaches its peak
    placement: str = "packed"  # packed | pal
    truth: str = "model"  # model | saturating | profile (dlrover.sim.truth); `dlrover simulate` defaults to DEFAULT_TRUTH
    backfill: int = 64  # queued jobs looked at for each scheduling pass
    horizon_s: float | None = None  # stop here (unfinished jobs count as not completed)
    max_workers: int = 64
    max_ps: int = 64


@dataclass
class SimJob:
    idx: int
    row: dict
    truth: Truth
    driver: PolicyDriver  # the policy, its model, measurements and actor marks
    requested: Config
    quota: Budget
    total: float  # samples to train
    config: Config | None = None
    initial_plan: ResourcePlan | None = None  # what chose the first configuration (its stage, prediction)
    status: str = "pending"  # pending | queued | running | completed | failed | unfinished
    worker_nodes: np.ndarray | None = None
    ps_nodes: np.ndarray | None = None
    start_s: float | None = None
    end_s: float | None = None
    done: float = 0.0
    rate: float = 0.0
    last_t: float = 0.0
    version: int = 0
    phases: list[tuple[float, float]] = field(default_factory=list)  # (until, rate) before the true rate applies
    tried_at: int = -1  # cluster release count when it last failed to be placed
    tick_gen: int = 0
    productive_s: float = 0.0
    ckpt_t: float = 0.0
    ckpt_done: float = 0.0
    ckpt_productive: float = 0.0
    failures: list[dict] = field(default_factory=list)
    oom_kills: int = 0
    changes: int = 0
    noise: float = 1.0  # the running window's measurement error (x what the driver is fed)
    running_since: float = 0.0  # when the job last resumed training after a stop (its actors report from then)
    alloc_cpu: float = 0.0
    alloc_mem: float = 0.0
    used_cpu: float = 0.0
    used_mem: float = 0.0
    cpu_s: float = 0.0  # CPU-seconds held (cost)

    @property
    def job_id(self) -> str:
        return self.row["job_id"]

    @property
    def submit_s(self) -> float:
        return float(self.row["submit_s"])


@dataclass
class SimResult:
    policy: str
    jobs: pd.DataFrame  # one row per job
    timeline: pd.DataFrame  # cluster utilisation over time
    events: pd.DataFrame  # scale/failure events
    node_failures: int
    sim_time_s: float
    cluster: ClusterSpec
    totals: dict


def mem_fraction(s: SimSettings, x: float) -> float:
    """RSS as a fraction of its peak at progress ``x``: from ``mem_start`` up to 1 at ``mem_fill``
    (embedding rows appear as new ids are seen)."""
    return s.mem_start + (1 - s.mem_start) * min(1.0, x / s.mem_fill)


def peaks(j: SimJob) -> tuple[float, float]:
    """Peak RSS (MB) of one worker and of one PS of ``j``'s configuration."""
    c = j.config
    assert c is not None
    return float(j.row["worker_memory_need_mb"]), float(j.row["ps_memory_need_mb"]) / c.ps + PS_BASE_MB


def rss_total(s: SimSettings, j: SimJob) -> float:
    """RSS (MB) of all of ``j``'s actors now."""
    c = j.config
    assert c is not None
    pw, pp = peaks(j)
    return mem_fraction(s, j.done / j.total) * (c.workers * pw + c.ps * pp)


def oom_progress(s: SimSettings, j: SimJob) -> tuple[float, str] | None:
    """Progress at which the first role's RSS crosses its limit, and the role (None: never)."""
    c = j.config
    assert c is not None
    out = None
    for role, peak, limit in zip(("worker", "ps"), peaks(j), (c.worker_memory_mb, c.ps_memory_mb)):
        r = limit / peak
        if r >= 1.0:
            continue
        x = 0.0 if r <= s.mem_start else s.mem_fill * (r - s.mem_start) / (1 - s.mem_start)
        if out is None or x < out[0]:
            out = (x, role)
    return out
