"""Discrete-event simulation of a trace on a cluster, driven by the live policy code.

Each job is a ``Policy`` object made by :func:`dlrover.resource.policy_config.policy_factory`,
the same factory the live JobMaster uses, called with the same ``JobView`` /
``ResourcePlan`` contract (``dlrover.resource.plan``). What differs is the runtime:

* **truth vs model.** A job's throughput is ``throughput(truth, config) x speed`` (the
  trace's ``t0..t4`` or a measured profile; speed from the nodes it runs on). The policy
  never sees the truth: it gets measured windows (truth x noise) and fits its own
  ``PerfModel``, exactly as the live ``Controller`` feeds it.
* **costs.** A first start and a restart after a failure hold the resources for
  ``restart_s`` without progress; a reconfiguration runs at the smaller of the old and
  new rates for ``rescale_s`` (new actors start while the old ones train) and pauses
  ``rescale_pause_s`` at the switch. A lost PS rolls the job back to its last checkpoint
  (every ``checkpoint_interval_s``).
* **memory.** An actor's RSS grows with progress (embedding rows appear as new ids are
  seen) from ``mem_start`` of its peak to the peak at ``mem_fill`` of the job. A role
  whose RSS crosses its limit is OOM-killed and restarted with 1.5x memory, as the live
  master does (``Controller.memory_after_oom``); a policy that reads the RSS trend can
  act first. A job fails after more than ``max_failures`` failures.
* **the view is abridged.** Instead of one ``ActorMetrics`` per actor the policy sees one
  representative worker and PS (all actors of a role are alike here) plus each worker on
  a straggling node, so a tick costs the same for a 2-actor and a 40-actor job.

Progress is piecewise linear: between events each job's rate is constant, and its
completion and OOM times are scheduled from it (stale events are skipped by version).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlrover.resource.history import HistoryRecord
from dlrover.resource.perf_model import PerfModel, PerfParams
from dlrover.resource.plan import ActorMetrics, Budget, Config, JobView, Measurement, Policy, ResourcePlan
from dlrover.sim.cluster import Cluster, ClusterSpec
from dlrover.sim.trace import TRUTH, validate_trace

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
    warmup_s: float = 60.0  # a new configuration's measurement window starts this late
    measure_noise: float = 0.03  # multiplicative noise of a measured window (log-normal sigma)
    mem_start: float = 0.6  # RSS at the start, as a fraction of the peak
    mem_fill: float = 0.5  # fraction of the job by which RSS reaches its peak
    placement: str = "packed"  # packed | pal
    backfill: int = 64  # queued jobs looked at for each scheduling pass
    horizon_s: float | None = None  # stop here (unfinished jobs count as not completed)
    max_workers: int = 64
    max_ps: int = 64


@dataclass
class SimJob:
    idx: int
    row: dict
    truth: PerfParams
    policy: Policy
    model: PerfModel
    requested: Config
    quota: Budget
    total: float  # samples to train
    config: Config | None = None
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
    measurements: list[Measurement] = field(default_factory=list)
    w_config: Config | None = None
    w_start: float = math.inf
    w_samples: float = 0.0
    w_time: float = 0.0
    w_noise: float = 1.0
    w_predicted: float | None = None
    last_change_s: float = 0.0
    alloc_cpu: float = 0.0
    alloc_mem: float = 0.0
    used_cpu: float = 0.0
    used_mem: float = 0.0
    cpu_s: float = 0.0  # CPU-seconds held (cost)

    @property
    def job_id(self) -> str:
        return self.row["job_id"]


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


class Simulator:
    """One policy, one trace, one cluster. ``run()`` returns a :class:`SimResult`."""

    def __init__(
        self,
        trace: pd.DataFrame,
        make_policy: Callable[[], Policy],
        cluster: ClusterSpec | None = None,
        settings: SimSettings | None = None,
        seed: int = 0,
        profiles: dict[str, PerfParams] | None = None,
        policy_name: str | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.spec = cluster or ClusterSpec()
        self.s = settings or SimSettings()
        # Independent streams: the cluster's faults do not depend on what the policy does.
        self.cluster = Cluster(self.spec, np.random.default_rng([seed, 1]))
        self.fault_rng = np.random.default_rng([seed, 2])
        self.noise_rng = np.random.default_rng([seed, 3])
        self.make_policy = make_policy
        self.policy_name = policy_name or getattr(make_policy(), "name", "policy")
        self.progress = progress
        self.history: dict[str, list[HistoryRecord]] = {}
        trace = validate_trace(trace, source="trace", csv=False)  # defaults filled, sorted by submission
        self.jobs = [self._job(i, row, profiles or {}) for i, row in enumerate(trace.to_dict("records"))]
        self.queue: list[int] = []
        self.heap: list[tuple] = []
        self.seq = 0
        self.now = 0.0
        self.events: list[dict] = []
        self.node_failures = 0
        self.node_jobs: dict[int, set[int]] = {}
        # cluster-wide integrals for utilisation
        self.tot = {"alloc_cpu": 0.0, "used_cpu": 0.0, "alloc_mem": 0.0, "used_mem": 0.0}
        self.integral = dict.fromkeys(self.tot, 0.0)
        self.t_int = 0.0
        self.timeline: list[tuple] = []
        self.finished = 0
        self.running = 0

    # ------------------------------------------------------------------ set-up
    def _job(self, i: int, row: dict, profiles: dict[str, PerfParams]) -> SimJob:
        if isinstance(row.get("profile"), str) and row["profile"]:
            if row["profile"] not in profiles:
                from dlrover.sim.profile import load_profile

                profiles[row["profile"]] = load_profile(row["profile"]).truth()
            truth = profiles[row["profile"]]
        else:
            truth = PerfParams(*(float(row[c]) for c in TRUTH))
        req = Config(
            int(row["req_workers"]), int(row["req_ps"]), float(row["req_worker_cpu"]), float(row["req_ps_cpu"]),
            int(row["req_worker_memory_mb"]), int(row["req_ps_memory_mb"]),
        )  # fmt: skip
        quota = Budget(float(row["budget_cpu"]), int(row["budget_memory_mb"]), self.s.max_workers, self.s.max_ps)
        policy = self.make_policy()
        model = PerfModel(int(row["batch_size"]), prior=policy.model_prior())  # as the live Controller makes it
        return SimJob(i, row, truth, policy, model, req, quota, float(row["samples"]) * float(row["epochs"]))

    def _push(self, t: float, kind: str, a: int = -1, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, version))

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        for j in self.jobs:
            self._push(float(j.row["submit_s"]), "arrive", j.idx)
        n = self.spec.nodes
        if self.spec.failure_rate > 0:
            day = 86400.0
            for node, t in enumerate(self.fault_rng.exponential(day / self.spec.failure_rate, n)):
                self._push(float(t), "node_fail", node)
        if self.spec.p_slow > 0:
            steps = self.fault_rng.geometric(self.spec.p_slow, n)
            for node in range(n):
                self._push(float(steps[node] * self.spec.straggle_step_s), "slow_start", node)
        span = float(max(j.row["submit_s"] for j in self.jobs)) if self.jobs else 0.0
        self.sample_s = max(60.0, span / 300.0)
        self._push(0.0, "sample")
        handlers = {
            "arrive": self._arrive, "tick": self._tick, "done": self._done, "oom": self._oom, "resume": self._resume,
            "node_fail": self._node_fail, "node_up": self._node_up, "slow_start": self._slow_start, "slow_end": self._slow_end,
            "sample": self._sample,
        }  # fmt: skip
        total = len(self.jobs)
        while self.heap and self.finished < total:
            t, _, kind, a, version = heapq.heappop(self.heap)
            if self.s.horizon_s is not None and t > self.s.horizon_s:
                break
            self._integrate(t)
            self.now = t
            handlers[kind](a, version)
        end = self.now if self.s.horizon_s is None or self.finished >= total else float(self.s.horizon_s)
        self._integrate(end)
        self.now = end
        for j in self.jobs:
            if j.status in ("running", "queued", "pending"):
                self._settle(j)
                j.status = "unfinished"
        return self._result()

    def _integrate(self, t: float) -> None:
        dt = t - self.t_int
        if dt > 0:
            for k, v in self.tot.items():
                self.integral[k] += v * dt
            self.t_int = t

    # ------------------------------------------------------------------ arrivals, queue
    def _view(self, j: SimJob, config: Config, budget: Budget) -> JobView:
        t = self.now - float(j.row["submit_s"])
        current = None
        if j.w_config is not None and j.w_time >= 1.0 and j.w_samples > 0:
            current = Measurement(j.w_config, j.w_samples / j.w_time * j.w_noise, j.w_time, t, j.w_predicted)
        remaining = (j.total - j.done) / current.throughput if current is not None else None
        return JobView(
            now_s=t, config=config, budget=budget, batch_size=int(j.row["batch_size"]), signature=j.row["signature"],
            model=j.model, measurements=list(j.measurements), current=current,
            actors=self._actors(j, t) if j.status == "running" else {}, progress=j.done / j.total, remaining_s=remaining,
            last_change_s=j.last_change_s - float(j.row["submit_s"]), history=self.history.get(j.row["signature"], []),
            requested=j.requested,
        )  # fmt: skip

    def _arrive(self, i: int, _v: int) -> None:
        j = self.jobs[i]
        plan = j.policy.initial(self._view(j, j.requested, j.quota))
        j.config = plan.config if plan.config.fits(j.quota) else j.requested
        if plan.stage == "warm_start":
            self._event(j, "warm_start", plan.reason)
        if not self._ever_fits(j, j.config):
            return
        j.status = "queued"
        self.queue.append(i)
        self._schedule()

    def _ever_fits(self, j: SimJob, c: Config) -> bool:
        """Whether ``c`` fits the empty cluster; if not, ``j`` fails as unschedulable (it
        would wait for ever)."""
        if self.cluster.fits_empty(c.workers, c.worker_cpu, c.worker_memory_mb, c.ps, c.ps_cpu, c.ps_memory_mb):
            return True
        self._event(j, "unschedulable", f"{c.short()} does not fit the empty cluster")
        if j.status == "running":
            self._finish(j, "failed")
        else:
            j.status, j.end_s = "failed", self.now
            self.finished += 1
        return False

    def _schedule(self) -> None:
        """FIFO with backfill over the first ``backfill`` queued jobs. A job that did not fit
        is tried again only once resources were released since (the hot path at scale)."""
        started = []
        released = self.cluster.released
        failed: set[Config] = set()  # within a pass capacity only shrinks: an identical request fails again
        for i in self.queue[: self.s.backfill]:
            j = self.jobs[i]
            if j.tried_at == released or j.config in failed:
                j.tried_at = released
                continue
            if self._place(j, j.config):
                started.append(i)
                self._start(j)
            else:
                j.tried_at = released
                failed.add(j.config)
        if started:
            gone = set(started)
            self.queue = [i for i in self.queue if i not in gone]

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
        j.worker_nodes, j.ps_nodes = worker_nodes, ps_nodes
        for node in set(worker_nodes.tolist()) | set(ps_nodes.tolist()):
            self.node_jobs.setdefault(node, set()).add(j.idx)
        self._set_alloc(j, c.cpu, c.memory_mb)

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

    def _start(self, j: SimJob) -> None:
        first = j.start_s is None
        if first:
            j.start_s = self.now
        j.status = "running"
        self.running += 1
        j.last_t = self.now
        j.phases = [(self.now + self.s.restart_s, 0.0)]
        self._open_window(j, self.now + self.s.restart_s)
        j.last_change_s = self.now
        j.ckpt_t = self.now
        j.tick_gen += 1
        self._push(self.now + self.s.restart_s + self.s.control_interval_s, "tick", j.idx, j.tick_gen)
        self._reschedule(j)

    # ------------------------------------------------------------------ progress
    def _true_rate(self, j: SimJob) -> float:
        c = j.config
        assert c is not None and j.worker_nodes is not None and j.ps_nodes is not None
        b = int(j.row["batch_size"])
        return c.workers * b / t_iter(j.truth, c, b) * self.cluster.job_speed(j.worker_nodes, j.ps_nodes, c.worker_cpu, c.ps_cpu)

    def _settle(self, j: SimJob) -> None:
        """Advance ``j`` to ``self.now`` at its current rate."""
        dt = self.now - j.last_t
        if dt > 0 and j.status == "running":
            j.done = min(j.total, j.done + j.rate * dt)
            j.cpu_s += j.alloc_cpu * dt
            if j.rate > 0:
                j.productive_s += dt
                if self.now > j.w_start:
                    t_in = min(dt, self.now - j.w_start)
                    j.w_samples += j.rate * t_in
                    j.w_time += t_in
        elif dt > 0 and j.alloc_cpu:
            j.cpu_s += j.alloc_cpu * dt
        j.last_t = self.now

    def _reschedule(self, j: SimJob) -> None:
        """Recompute ``j``'s rate and re-plan its completion and OOM events."""
        self._settle(j)
        j.version += 1
        if j.status != "running":
            return
        while j.phases and j.phases[0][0] <= self.now:
            j.phases.pop(0)
        if j.phases:
            until, j.rate = j.phases[0]
            self._push(until, "resume", j.idx, j.version)
        else:
            j.rate = self._true_rate(j)
        self._update_used(j)
        if j.rate > 0:
            self._push(self.now + (j.total - j.done) / j.rate, "done", j.idx, j.version)
            oom = self._oom_progress(j)
            if oom is not None:
                self._push(self.now + max(0.0, oom[0] * j.total - j.done) / j.rate, "oom", j.idx, j.version)

    def _resume(self, i: int, version: int) -> None:
        j = self.jobs[i]
        if version == j.version and j.status == "running":
            self._reschedule(j)

    def _update_used(self, j: SimJob) -> None:
        c = j.config
        assert c is not None
        if j.rate <= 0:
            self._set_used(j, 0.05 * c.cpu, self._rss_total(j))
            return
        b = int(j.row["batch_size"])
        step = t_iter(j.truth, c, b)
        t = j.truth
        worker_busy = min(1.0, t.t1 * b / c.worker_cpu / step + 0.05)
        ps_busy = min(1.0, t.t2 * c.workers / (c.ps * c.ps_cpu) / step + 0.05)
        self._set_used(j, c.workers * c.worker_cpu * worker_busy + c.ps * c.ps_cpu * ps_busy, self._rss_total(j))

    # ------------------------------------------------------------------ memory
    def _mem_fraction(self, x: float) -> float:
        s = self.s
        return s.mem_start + (1 - s.mem_start) * min(1.0, x / s.mem_fill)

    def _peaks(self, j: SimJob) -> tuple[float, float]:
        c = j.config
        assert c is not None
        return float(j.row["worker_memory_need_mb"]), float(j.row["ps_memory_need_mb"]) / c.ps + PS_BASE_MB

    def _rss_total(self, j: SimJob) -> float:
        c = j.config
        assert c is not None
        pw, pp = self._peaks(j)
        f = self._mem_fraction(j.done / j.total)
        return f * (c.workers * pw + c.ps * pp)

    def _oom_progress(self, j: SimJob) -> tuple[float, str] | None:
        """Progress at which the first role's RSS crosses its limit, and the role (None: never)."""
        c = j.config
        assert c is not None
        s = self.s
        out = None
        for role, peak, limit in zip(("worker", "ps"), self._peaks(j), (c.worker_memory_mb, c.ps_memory_mb)):
            r = limit / peak
            if r >= 1.0:
                continue
            x = 0.0 if r <= s.mem_start else s.mem_fill * (r - s.mem_start) / (1 - s.mem_start)
            if out is None or x < out[0]:
                out = (x, role)
        return out

    def _oom(self, i: int, version: int) -> None:
        j = self.jobs[i]
        if version != j.version or j.status != "running":
            return
        self._settle(j)
        c = j.config
        oom = self._oom_progress(j)
        assert c is not None and oom is not None
        role = oom[1]
        j.oom_kills += 1
        field_ = "ps_memory_mb" if role == "ps" else "worker_memory_mb"
        grown = c.replace(**{field_: int(min(getattr(c, field_) * 1.5, j.quota.memory_mb))})
        self._failure(j, "oom_kill", role, rollback=role == "ps", new_config=grown)

    # ------------------------------------------------------------------ failures
    def _failure(self, j: SimJob, kind: str, role: str, rollback: bool, new_config: Config | None = None, lost_fraction: float = 1.0) -> None:
        """A failure of ``j``: count it, roll back if a PS was lost, restart what was lost."""
        self._settle(j)
        j.failures.append({"kind": kind, "role": role, "at_s": self.now})
        self._event(j, kind, f"{role} lost" + (", rollback to the checkpoint" if rollback else ""))
        if len(j.failures) > int(j.row["max_failures"]):
            self._finish(j, "failed")
            return
        if rollback:
            j.done, j.productive_s = j.ckpt_done, j.ckpt_productive
            j.w_samples = j.w_time = 0.0
            j.w_start = max(j.w_start, self.now + self.s.restart_s)
        config = new_config or j.config
        assert config is not None
        if not self._ever_fits(j, config):
            return
        rate = j.rate
        self._unplace(j)
        j.config = config
        if not self._place(j, config):  # no room left for it: back to the queue, from its checkpoint
            j.done, j.productive_s = j.ckpt_done, j.ckpt_productive
            j.status = "queued"
            self.running -= 1
            self.queue.insert(0, j.idx)
            j.version += 1
            self._schedule()
            return
        if rollback or new_config is not None:
            j.phases = [(self.now + self.s.restart_s, 0.0)]
        else:  # lost workers: the others train on while replacements start
            j.phases = [(self.now + self.s.restart_s, rate * (1 - lost_fraction))]
        self._reschedule(j)

    def _node_fail(self, node: int, _v: int) -> None:
        self.node_failures += 1
        self.cluster.set_alive(node, False)
        self._push(self.now + self.spec.repair_s, "node_up", node)
        for i in sorted(self.node_jobs.pop(node, set())):
            j = self.jobs[i]
            if j.status != "running" or j.worker_nodes is None or j.ps_nodes is None:
                continue
            lost_ps = int((j.ps_nodes == node).sum())
            lost_w = int((j.worker_nodes == node).sum())
            if lost_ps == lost_w == 0:
                continue
            self._failure(j, "node_loss", "ps" if lost_ps else "worker", rollback=lost_ps > 0, lost_fraction=lost_w / len(j.worker_nodes))

    def _node_up(self, node: int, _v: int) -> None:
        self.cluster.set_alive(node, True)
        day = 86400.0
        self._push(self.now + float(self.fault_rng.exponential(day / self.spec.failure_rate)), "node_fail", node)
        self._schedule()

    def _slow_start(self, node: int, _v: int) -> None:
        self._set_slow(node, True)
        steps = int(self.fault_rng.geometric(1 - self.spec.p_stay))
        self._push(self.now + steps * self.spec.straggle_step_s, "slow_end", node)

    def _slow_end(self, node: int, _v: int) -> None:
        self._set_slow(node, False)
        steps = int(self.fault_rng.geometric(self.spec.p_slow))
        self._push(self.now + steps * self.spec.straggle_step_s, "slow_start", node)

    def _set_slow(self, node: int, slow: bool) -> None:
        self.cluster.slow[node] = slow
        self.cluster.slow_since[node] = self.now
        for i in sorted(self.node_jobs.get(node, ())):
            if self.jobs[i].status == "running":
                self._reschedule(self.jobs[i])

    # ------------------------------------------------------------------ policy
    def _actors(self, j: SimJob, t: float) -> dict[str, ActorMetrics]:
        """The abridged per-actor view (see the module docstring)."""
        c = j.config
        assert c is not None and j.worker_nodes is not None and j.ps_nodes is not None
        f = self._mem_fraction(j.done / j.total)
        pw, pp = self._peaks(j)
        s = self.s
        slope = (1 - s.mem_start) / s.mem_fill * (j.rate / j.total) if j.done / j.total < s.mem_fill else 0.0
        b = int(j.row["batch_size"])
        step = t_iter(j.truth, c, b)
        cl = self.cluster
        out: dict[str, ActorMetrics] = {}
        on_slow = cl.slow[j.worker_nodes]
        shown = [*np.flatnonzero(~on_slow)[:2].tolist(), *np.flatnonzero(on_slow).tolist()]
        for k in shown:
            node = int(j.worker_nodes[k])
            since = None
            speed = float(cl.perf[node])
            if cl.slow[node]:
                since = max(float(cl.slow_since[node]), j.last_change_s) - float(j.row["submit_s"])
                speed *= self.spec.slow_factor
            out[f"worker-{k}"] = ActorMetrics(
                f"worker-{k}", "worker", c.worker_cpu, c.worker_memory_mb, rss_mb=f * pw, step_time_s=step / speed,
                slow_since_s=since, rss_trend_mb_per_s=slope * pw, at_s=t,
            )  # fmt: skip
        out["ps-0"] = ActorMetrics("ps-0", "ps", c.ps_cpu, c.ps_memory_mb, rss_mb=f * pp, rss_trend_mb_per_s=slope * pp, at_s=t)
        return out

    def _budget(self, j: SimJob) -> Budget:
        """The job's quota, and no more than it holds plus what is free (nothing extra
        while jobs wait: a running job does not grow into capacity a queued one needs)."""
        c = j.config
        assert c is not None
        free_cpu = free_mem = 0.0
        if not self.queue:
            free_cpu, free_mem = self.cluster.free_totals()
        return Budget(
            min(j.quota.cpu, c.cpu + free_cpu), int(min(j.quota.memory_mb, c.memory_mb + free_mem)), j.quota.max_workers, j.quota.max_ps
        )

    def _tick(self, i: int, gen: int) -> None:
        j = self.jobs[i]
        if j.status != "running" or gen != j.tick_gen:
            return
        self._settle(j)
        self._push(self.now + self.s.control_interval_s, "tick", i, gen)
        if self.now - j.ckpt_t >= self.s.checkpoint_interval_s and not j.phases:
            j.ckpt_t, j.ckpt_done, j.ckpt_productive = self.now, j.done, j.productive_s
        self._update_used(j)
        assert j.config is not None
        if any(until > self.now for until, _ in j.phases):  # starting, restarting or switching: no decisions
            return
        budget = self._budget(j)
        plan = j.policy.decide(self._view(j, j.config, budget))
        if plan is None or not plan.changes(j.config):
            return
        if not plan.config.fits(budget):
            j.policy.rejected(plan, "over budget")
            return
        self._apply(j, plan)

    def _apply(self, j: SimJob, plan: ResourcePlan) -> None:
        old = j.config
        assert old is not None
        old_rate = j.rate
        if plan.config != old:
            if not self._replace_actors(j, plan.config):
                self._event(j, "plan_rejected", plan.reason)
                j.policy.rejected(plan, "no room on the nodes")
                return
            self._close_window(j)
            new_rate = self._true_rate(j)
            t_switch = self.now + self.s.rescale_s
            self._open_window(j, t_switch + self.s.rescale_pause_s, plan.predicted_throughput)
            j.last_change_s = self.now
            j.changes += 1
            self._event(j, "scale", plan.reason, old=old.short(), new=plan.config.short(), config=plan.config.to_dict())
            # New actors start while the old train on, then the switch pauses training.
            j.phases = [(t_switch, min(old_rate, new_rate)), (t_switch + self.s.rescale_pause_s, 0.0)]
            self._reschedule(j)
            self._schedule()  # a job that shrank may let queued ones start
            return
        moved = [a for a in plan.replace if a.startswith("worker-")]
        if moved and j.worker_nodes is not None:
            c = old
            idx = [int(a.split("-", 1)[1]) for a in moved if int(a.split("-", 1)[1]) < len(j.worker_nodes)]
            nodes = j.worker_nodes[idx]
            self.cluster.release(nodes, c.worker_cpu, c.worker_memory_mb, undo=True)
            allowed = self.cluster.alive & ~self.cluster.slow
            got = self.cluster.fill(len(idx), c.worker_cpu, c.worker_memory_mb, allowed, None)
            if got is None:
                self.cluster.take(nodes, c.worker_cpu, c.worker_memory_mb)
                return
            self.cluster.released += 1
            self._settle(j)
            before = set(j.worker_nodes.tolist())
            j.worker_nodes = j.worker_nodes.copy()
            j.worker_nodes[idx] = got
            now_on = set(j.worker_nodes.tolist()) | set(j.ps_nodes.tolist())
            for node in before - now_on:
                self.node_jobs.get(node, set()).discard(j.idx)
            for node in got.tolist():
                self.node_jobs.setdefault(node, set()).add(j.idx)
            self._event(j, "replace", plan.reason)
            self._reschedule(j)

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

    # ------------------------------------------------------------------ windows
    def _open_window(self, j: SimJob, start: float, predicted: float | None = None) -> None:
        j.w_config, j.w_start, j.w_samples, j.w_time = j.config, start + self.s.warmup_s, 0.0, 0.0
        j.w_noise = float(np.exp(self.noise_rng.normal(0.0, self.s.measure_noise))) if self.s.measure_noise > 0 else 1.0
        j.w_predicted = predicted

    def _close_window(self, j: SimJob) -> None:
        self._settle(j)
        if j.w_config is not None and j.w_time >= 1.0 and j.w_samples > 0:
            thr = j.w_samples / j.w_time * j.w_noise
            m = Measurement(j.w_config, thr, j.w_time, self.now - float(j.row["submit_s"]), j.w_predicted)
            j.measurements.append(m)
            j.model.observe(m.config, thr, weight=m.duration_s)
        j.w_config = None

    # ------------------------------------------------------------------ completion
    def _done(self, i: int, version: int) -> None:
        j = self.jobs[i]
        if version != j.version or j.status != "running":
            return
        self._settle(j)
        j.done = j.total
        self._close_window(j)
        self._remember(j)
        self._finish(j, "completed")

    def _finish(self, j: SimJob, status: str) -> None:
        self._settle(j)
        if j.worker_nodes is not None:
            self._unplace(j)
        if j.status == "running":
            self.running -= 1
        j.status, j.end_s = status, self.now
        j.version += 1
        self.finished += 1
        if self.progress is not None:
            self.progress(self.finished / len(self.jobs))
        self._schedule()

    def _remember(self, j: SimJob) -> None:
        """A finished job leaves a history record for the next similar one (warm start)."""
        assert j.config is not None
        best = max(j.measurements, key=lambda m: m.throughput, default=None)
        peak_worker, peak_ps = self._peaks(j)
        rec = HistoryRecord(
            signature=j.row["signature"], dataset=j.row["signature"], job_id=j.job_id, finished_at=self.now, final_config=j.config,
            best_config=best.config if best else None, best_throughput=best.throughput if best else 0.0,
            measurements=[{"config": m.config.to_dict(), "throughput": m.throughput, "duration_s": m.duration_s} for m in j.measurements],
            samples=int(j.total), wall_time_s=float(self.now - (j.start_s or self.now)),
            peak_rss_mb={"worker": peak_worker, "ps_total": peak_ps * j.config.ps},
        )  # fmt: skip
        self.history.setdefault(j.row["signature"], []).insert(0, rec)

    def _event(self, j: SimJob, kind: str, reason: str, **more) -> None:
        self.events.append({"t_s": self.now, "job_id": j.job_id, "kind": kind, "reason": reason, **more})

    def _sample(self, _a: int, _v: int) -> None:
        cap_cpu = float(self.cluster.cpu[self.cluster.alive].sum()) or 1.0
        cap_mem = float(self.cluster.mem[self.cluster.alive].sum()) or 1.0
        running = self.running
        self.timeline.append((
            self.now, self.tot["alloc_cpu"] / cap_cpu, self.tot["used_cpu"] / cap_cpu, self.tot["alloc_mem"] / cap_mem,
            self.tot["used_mem"] / cap_mem, len(self.queue), running,
        ))  # fmt: skip
        if self.finished < len(self.jobs):
            self._push(self.now + self.sample_s, "sample")

    # ------------------------------------------------------------------ results
    def _result(self) -> SimResult:
        rows = []
        for j in self.jobs:
            submit = float(j.row["submit_s"])
            jct = (j.end_s - submit) if j.end_s is not None and j.status == "completed" else math.nan
            rows.append({
                "job_id": j.job_id, "signature": j.row["signature"], "status": j.status, "submit_s": submit,
                "start_s": j.start_s, "end_s": j.end_s, "jct_s": jct,
                "queue_s": (j.start_s - submit) if j.start_s is not None else math.nan,
                "ettr": j.productive_s / jct if jct and jct > 0 else math.nan,
                "failures": len(j.failures), "oom_kills": j.oom_kills, "changes": j.changes, "cpu_hours": j.cpu_s / 3600.0,
                "requested": j.requested.short(), "final": j.config.short() if j.config else "",
                "final_cpu": j.config.cpu if j.config else math.nan, "requested_cpu": j.requested.cpu,
            })  # fmt: skip
        jobs = pd.DataFrame(rows)
        tl = pd.DataFrame(self.timeline, columns=["t_s", "cpu_alloc", "cpu_used", "mem_alloc", "mem_used", "queued", "running"])
        totals = {
            "cpu_util": self.integral["used_cpu"] / self.integral["alloc_cpu"] if self.integral["alloc_cpu"] > 0 else math.nan,
            "mem_util": self.integral["used_mem"] / self.integral["alloc_mem"] if self.integral["alloc_mem"] > 0 else math.nan,
            "cpu_alloc_frac": self.integral["alloc_cpu"] / max(1e-9, self.spec.nodes * self.spec.node_cpu * self.now),
        }
        ev = pd.DataFrame(self.events, columns=["t_s", "job_id", "kind", "reason"] if not self.events else None)
        return SimResult(self.policy_name, jobs, tl, ev, self.node_failures, self.now, self.spec, totals)
