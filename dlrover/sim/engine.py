"""Discrete-event simulation of a trace on a cluster, driven by the live policy code.

Each job is a ``Policy`` object made by :func:`dlrover.resource.policies.policy_factory`,
the same factory the live JobMaster uses, inside the same loop: a
:class:`~dlrover.resource.driver.PolicyDriver` measures its windows, builds its
``JobView``, checks the budget, marks stragglers and fits RSS trends, exactly as it does
for the live ``Controller``. What differs is the runtime:

* **truth vs model.** A job's throughput is ``truth.throughput(config) x speed`` (a
  :class:`~dlrover.sim.truth.Truth` of the kind ``SimSettings.truth`` names, from the
  trace's ``t0..t4`` or a measured profile; speed from the nodes it runs on). The policy
  never sees the truth: its driver is fed the job's progress (times a per-window noise),
  step times and RSS samples (:mod:`dlrover.sim.control_loop`) and the policy fits its own
  ``PerfModel``.
* **costs.** A first start and a restart after a failure hold the resources for
  ``restart_s`` without progress; a reconfiguration runs at the smaller of the old and
  new rates for ``rescale_s`` (new actors start while the old ones train) and pauses
  ``rescale_pause_s`` at the switch. A lost PS rolls the job back to its last checkpoint
  (every ``checkpoint_interval_s``) (:mod:`dlrover.sim.faults`).
* **memory.** An actor's RSS grows with progress (embedding rows appear as new ids are
  seen) from ``mem_start`` of its peak to the peak at ``mem_fill`` of the job. A role
  whose RSS crosses its limit is OOM-killed and restarted with the driver's
  ``memory_after_oom`` (1.5x), as live; a policy that reads the RSS trend can act first.
  A job fails after more than ``max_failures`` failures.
* **the view is abridged.** Instead of one ``ActorMetrics`` per actor the policy sees one
  representative PS, the workers on slow nodes and enough of the others for the median
  step time (all actors of a role are alike here), so a tick costs about the same for a
  2-actor and a 40-actor job.

Progress is piecewise linear: between events each job's rate is constant, and its
completion and OOM times are scheduled from it (stale events are skipped by version).
Placement is in :mod:`dlrover.sim.placing`, the job record and truth in :mod:`dlrover.sim.job`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from dlrover.resource.driver import PolicyDriver
from dlrover.resource.history import HistoryRecord
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import Policy
from dlrover.sim.cluster import Cluster, ClusterSpec
from dlrover.sim.control_loop import ControlMixin
from dlrover.sim.faults import DAY_S, FaultsMixin
from dlrover.sim.job import SimJob, SimResult, SimSettings, oom_progress, peaks, rss_total
from dlrover.sim.placing import PlacementMixin
from dlrover.sim.profile_truth import ids_per_sample_of, make_truth
from dlrover.sim.trace import validate_trace

class Simulator(ControlMixin, FaultsMixin, PlacementMixin):
    """One policy, one trace, one cluster. ``run()`` returns a :class:`SimResult`."""

    def __init__(
        self,
        trace: pd.DataFrame,
        make_policy: Callable[[], Policy],
        cluster: ClusterSpec | None = None,
        settings: SimSettings | None = None,
        seed: int = 0,
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
        self.jobs = [self._job(i, row) for i, row in enumerate(trace.to_dict("records"))]
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
    def _job(self, i: int, row: dict) -> SimJob:
        truth = make_truth(self.s.truth, row)
        req = Config(
            int(row["req_workers"]), int(row["req_ps"]), float(row["req_worker_cpu"]), float(row["req_ps_cpu"]),
            int(row["req_worker_memory_mb"]), int(row["req_ps_memory_mb"]),
        )  # fmt: skip
        quota = Budget(float(row["budget_cpu"]), int(row["budget_memory_mb"]), self.s.max_workers, self.s.max_ps)
        driver = PolicyDriver(
            self.make_policy(), budget=quota, requested=req, batch_size=int(row["batch_size"]), signature=row["signature"],
            history=self.history.setdefault(row["signature"], []), warmup_s=self.s.warmup_s, ids_per_sample=ids_per_sample_of(row),
        )  # fmt: skip
        return SimJob(i, row, truth, driver, req, quota, float(row["samples"]) * float(row["epochs"]))

    def _push(self, t: float, kind: str, a: int = -1, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, version))

    # ------------------------------------------------------------------ main loop
    def run(self) -> SimResult:
        for j in self.jobs:
            self._push(float(j.row["submit_s"]), "arrive", j.idx)
        n = self.spec.nodes
        if self.spec.failure_rate > 0:
            for node, t in enumerate(self.fault_rng.exponential(DAY_S / self.spec.failure_rate, n)):
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
    def _arrive(self, i: int, _v: int) -> None:
        j = self.jobs[i]
        plan = j.initial_plan = j.driver.initial(0.0)
        j.config = plan.config
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

    def _start(self, j: SimJob) -> None:
        first = j.start_s is None
        if first:
            j.start_s = self.now
        j.status = "running"
        self.running += 1
        j.last_t = self.now
        j.phases = [(self.now + self.s.restart_s, 0.0)]
        self._open_window(j, self.now + self.s.restart_s, j.initial_plan if first else None)
        j.ckpt_t = self.now
        j.tick_gen += 1
        self._push(self.now + self.s.restart_s + self.s.control_interval_s, "tick", j.idx, j.tick_gen)
        self._reschedule(j)

    # ------------------------------------------------------------------ progress
    def _true_rate(self, j: SimJob) -> float:
        c = j.config
        assert c is not None and j.worker_nodes is not None and j.ps_nodes is not None
        b = int(j.row["batch_size"])
        ct = j.truth.contention(c, b)
        cores = self.spec.node_cores or (self.spec.node_cpu / ct.threads_per_core if ct.threads_per_core else None)
        speed = self.cluster.job_speed(j.worker_nodes, j.ps_nodes, ct.worker_cpu, ct.ps_cpu, cores, ct.smt_gain)
        return j.truth.throughput(c, b) * speed

    def _settle(self, j: SimJob) -> None:
        """Advance ``j`` to ``self.now`` at its current rate."""
        dt = self.now - j.last_t
        if dt > 0 and j.status == "running":
            j.done = min(j.total, j.done + j.rate * dt)
            j.cpu_s += j.alloc_cpu * dt
            if j.rate > 0:
                j.productive_s += dt
        elif dt > 0 and j.alloc_cpu:
            j.cpu_s += j.alloc_cpu * dt
        j.last_t = self.now
        if j.status == "running":
            self._observe(j)

    def _reschedule(self, j: SimJob) -> None:
        """Recompute ``j``'s rate and re-plan its completion and OOM events."""
        self._settle(j)
        j.version += 1
        if j.status != "running":
            return
        while j.phases and j.phases[0][0] <= self.now:
            j.phases.pop(0)
        stopped = j.rate <= 0
        if j.phases:
            until, j.rate = j.phases[0]
            self._push(until, "resume", j.idx, j.version)
        else:
            j.rate = self._true_rate(j)
        if stopped and j.rate > 0:
            j.running_since = self.now
        self._update_used(j)
        if j.rate > 0:
            self._push(self.now + (j.total - j.done) / j.rate, "done", j.idx, j.version)
            oom = oom_progress(self.s, j)
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
            self._set_used(j, 0.05 * c.cpu, rss_total(self.s, j))
            return
        self._set_used(j, j.truth.used_cpu(c, int(j.row["batch_size"])), rss_total(self.s, j))

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
        best = max(j.driver.measurements, key=lambda m: m.throughput, default=None)
        peak_worker, peak_ps = peaks(j)
        rec = HistoryRecord(
            signature=j.row["signature"], dataset=j.row["signature"], job_id=j.job_id, finished_at=self.now, final_config=j.config,
            best_config=best.config if best else None, best_throughput=best.throughput if best else 0.0,
            measurements=[{"config": m.config.to_dict(), "throughput": m.throughput, "duration_s": m.duration_s} for m in j.driver.measurements],
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
