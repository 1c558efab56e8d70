"""The master's control loop: metrics in, policy decision, Scaler out.

Every ``policy.interval_s`` the Controller asks the job's
:class:`~dlrover.resource.driver.PolicyDriver` for a decision on what the job reported and
has the :class:`Scaler` carry out a changed plan. The driver, shared with the simulator,
owns the measurement windows (after ``policy.warmup_s``; closed into a
:class:`Measurement` that refits the performance model when the configuration changes),
the ``JobView``, the budget check, straggler marks and RSS trends; this module feeds it
the actors' reports and reports what it measured as events and in the summary.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from dlrover.master.scaler import MigrationAborted, ScaleOp, ScalePhase, Scaler, ScaleResult, scale_plan
from dlrover.resource.configs import Budget, Config, describe_change
from dlrover.resource.driver import DecisionKind, PolicyDriver, Progress
from dlrover.resource.history import HistoryRecord, HistoryStore, dataset_signature, job_signature
from dlrover.failures import FailureKind
from dlrover.resource.plan import ActorMetrics, CorrectionKind, JobView, Measurement, Policy, ResourcePlan

from dlrover.master.job import Job

if TYPE_CHECKING:
    from dlrover.data.plan import DataPlan

PS_STATS_TIMEOUT_S = 5.0


def default_history_dir() -> str:
    return os.environ.get("DLROVER_HISTORY_DIR") or os.path.expanduser("~/.dlrover/history")


def job_budget(spec: Any, requested: Config) -> Budget:
    """The job's budget: ``resources.budget_*``, else the request. Memory without its own
    budget grows with the CPU budget (same MB per CPU as the request)."""
    r = spec.resources
    cpu = r.budget_cpu or requested.cpu
    memory = r.budget_memory_mb or int(requested.memory_mb * cpu / requested.cpu)
    return Budget(cpu=cpu, memory_mb=memory, max_ps=spec.train.vshards)


@dataclass
class Rescale:
    """A policy's plan being carried out: the scale operation and what it started from."""

    op: ScaleOp
    plan: ResourcePlan
    old: Config
    begun_s: float  # job time


class Controller:
    def __init__(self, master: Job, data: "DataPlan", policy: Policy) -> None:
        """``policy``: built once, on the driver (a restarted master gets a fresh copy)."""
        self.m = master
        spec = master.spec
        self.spec = spec
        self.policy = policy
        self.requested = Config.from_resources(spec.resources)
        self.budget = job_budget(spec, self.requested)
        self.signature = job_signature(spec.model.model_dump(), spec.data.batch_size)
        self.dataset = dataset_signature(sorted(data.files), sum(i.rows for i in data.files.values()))
        self.history_dir = spec.policy.history_dir or default_history_dir()
        self.store = HistoryStore(self.history_dir)
        self.driver = PolicyDriver(
            self.policy,
            budget=self.budget,
            requested=self.requested,
            batch_size=spec.data.batch_size,
            signature=self.signature,
            history=self.store.similar(self.signature, self.dataset),
            warmup_s=spec.policy.warmup_s,
        )
        self.model = self.driver.model
        self.retired_ps_stats: list[dict] = []
        self.scaler = Scaler(master.launcher, running=lambda: self._running, clock=lambda: self.now())
        self._running: list[str] = []
        self._lock = threading.Lock()
        self._next_tick = 0.0
        self.peak_rss = {"worker": 0.0, "ps_total": 0.0}  # for the history record (memory right-sizing)
        self._ps_prev: dict[int, tuple[float, float]] = {}
        self._ps_metrics: dict[int, ActorMetrics] = {}
        self._await_first_step: dict[str, dict | None] = {}  # new worker -> its scale event (None: not written yet)
        self._early_first_step: dict[str, float] = {}
        self._op: Rescale | None = None
        self._pending: dict[Any, str] = {}
        self._initial_plan: ResourcePlan | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def now(self) -> float:
        return self.m.clock() - self.m.t0

    def initial_config(self) -> Config:
        """Stage 1 (warm start) or the request, as the policy says; clipped to the budget."""
        with self._lock:
            plan = self.driver.initial(self.now())
        self.m.events.add("initial_config", stage=plan.stage, reason=plan.reason, config=plan.config.to_dict())
        if plan.config != self.requested:
            self.m.scale_events.append(self._event("warm_start", plan, self.requested, plan.config, self.now()))
        self._initial_plan = plan
        return plan.config

    def resumed(self, config: Config) -> None:
        """After a master restart: the checkpoint's configuration, no warm-start decision."""
        self._initial_plan = ResourcePlan(config, "resumed from a checkpoint after a master restart", stage="resume")

    def started(self, config: Config) -> None:
        self._open(config, self.now(), self._initial_plan)
        self._spares(config)

    def _spares(self, config: Config) -> None:
        """Top up the pre-started spares (``policy.standby``) for the running sizes."""
        if self.spec.policy.standby:
            self.m.launcher.add_spares(config, self.spec.policy.standby)

    @property
    def measurements(self) -> list[Measurement]:
        """The configurations measured so far (closed windows), oldest first."""
        return self.driver.measurements

    def _open(self, config: Config, now: float, plan: ResourcePlan | None) -> None:
        with self._lock:
            self.driver.open(config, now, plan.predicted_throughput if plan is not None else None)

    def _close(self) -> None:
        with self._lock:
            meas = self.driver.close()
        if meas is None:
            return
        self.m.events.add("measurement", config=meas.config.to_dict(), throughput=meas.throughput, predicted=meas.predicted, duration_s=meas.duration_s)

    def window_now(self) -> tuple[float | None, float | None]:
        """The running configuration's predicted throughput and, once its window is long
        enough to mean something, the measured one."""
        with self._lock:
            w, m = self.driver.window, self.driver.current()
        if w is None:
            return None, None
        return w.predicted, m.throughput if m is not None else None

    def window_s(self) -> float:
        """How long the running configuration has been measured so far."""
        with self._lock:
            return self.driver.window_s()

    # -- reports ------------------------------------------------------------------------
    def on_report(self, worker: str, metrics: dict, now: float, samples: int) -> None:
        with self._lock:
            self.driver.observe(now, samples)
            if "rss_mb" in metrics:
                self.driver.rss(worker, now, float(metrics["rss_mb"]))
                self.peak_rss["worker"] = max(self.peak_rss["worker"], float(metrics["rss_mb"]))

    def first_step(self, worker: str, now: float) -> None:
        """A new worker's first step: its time since the plan goes into the scale event
        (kept aside if the step comes before the event is written)."""
        with self._lock:
            ev = self._await_first_step.get(worker)
            if ev is None:  # no event for it yet (or a worker of the first launch)
                self._early_first_step[worker] = now
                return
            del self._await_first_step[worker]
            ev.setdefault("first_step_s", {})[worker] = round(now - ev["at_s"], 3)

    def _bind_first_steps(self, workers: list[str], ev: dict) -> None:
        with self._lock:
            for w in workers:
                if w in self._early_first_step:
                    ev.setdefault("first_step_s", {})[w] = round(self._early_first_step.pop(w) - ev["at_s"], 3)
                    self._await_first_step.pop(w, None)
                else:
                    self._await_first_step[w] = ev

    def forget(self, name: str) -> None:
        with self._lock:
            self.driver.forget(name)

    # -- the loop -----------------------------------------------------------------------
    def tick(self, pending: dict[Any, str]) -> dict[Any, str]:
        """One control step; returns ``{run ObjectRef: worker}`` of workers it started.
        ``pending``: the ``run`` refs of the workers training now."""
        now = self.now()
        self._running = list(pending.values())
        self._pending = pending
        if self._op is not None:
            return self._progress_op(now)
        if now < self._next_tick or self.m.evaluator.busy():
            return {}
        self._next_tick = now + self.spec.policy.interval_s
        decision = self.driver.decide(self._view(now, self._config()))
        if decision.kind is DecisionKind.REJECTED:
            plan = decision.plan
            self.m.events.add("plan_rejected", reason=plan.reason, config=plan.config.to_dict(), why=decision.why)
        if decision.kind is not DecisionKind.APPLY:
            return {}
        return self._apply(decision.plan, decision.view)

    def _apply(self, plan: ResourcePlan, view: JobView) -> dict[Any, str]:
        """Start carrying out ``plan``: new actors are created now, the switch happens on a
        later tick once they run (training goes on meanwhile)."""
        lz = self.m.launcher
        draining = self.m.draining()
        workers = {n: lz.resources[n] for n in lz.workers if n not in draining and n in lz.resources}
        ps = {k: lz.resources[lz.ps_name(k)] for k in lz.ps}
        sp = scale_plan(plan, workers, ps, lz.ps_name)
        if sp.empty():
            return {}
        if self.spec.policy.rescale == "restart":
            return self._restart(plan, view.config)
        self._op = Rescale(self.scaler.begin(sp), plan, view.config, self.now())
        self.m.events.add("scale_begin", reason=plan.reason, ops=sp.ops())
        return self._progress_op(self.now())

    def _progress_op(self, now: float) -> dict[Any, str]:
        """One step of the rescale under way: launch -> (new workers start) pre-copy -> switch."""
        r = self._op
        if r.op.phase is ScalePhase.LAUNCHING:
            return self._launching(r)
        try:
            if r.op.phase is ScalePhase.PRECOPYING and (not self.scaler.precopied(r.op) or self.m.evaluator.busy()):
                return {}  # no switch under a periodic evaluation
            res = self.scaler.finish(r.op)
        except MigrationAborted as e:
            self._aborted(r, str(e))
            return {}
        self._op = None
        self._switched(r, res)
        return {}

    def _launching(self, r: Rescale) -> dict[Any, str]:
        op, plan = r.op, r.plan
        try:
            ready = self.scaler.ready(op)
        except ray.exceptions.RayActorError as e:
            ready, error = False, f"a new actor failed to start: {str(e).strip().splitlines()[0]}"
        else:
            error = None if ready or not self.scaler.late(op) else f"new actors not running after {self.scaler.launch_timeout_s:.0f}s (cluster full?)"
        finished = self.m.queue.finished
        if error or (finished and not ready):
            self._op = None
            self.scaler.abort(op)
            self.m.events.add("scale_failed", reason=plan.reason, error=error or "job finished first")
            self.policy.rejected(plan, error or "job finished first")
            if error:
                self.m.scale_events.append(dict(self._event("failed", plan, r.old, r.old, r.begun_s), error=error))
            return {}
        if not ready or self.m.evaluator.busy():  # no switch under a periodic evaluation
            return {}
        if finished:  # nothing left to train: give the new actors back
            self._op = None
            self.scaler.abort(op)
            return {}
        self._close()
        started = self.scaler.start_new_workers(op)
        self._running += list(started.values())
        try:
            self.scaler.start_migration(op, {k: a.busy for k, a in self._ps_metrics.items()})
        except MigrationAborted as e:
            self._aborted(r, str(e))
            return started
        return {**started, **self._progress_op(self.now())} if op.phase is ScalePhase.DONE else started

    def _aborted(self, r: Rescale, error: str) -> None:
        """Nothing switched: the new workers train on the old routing; new PS go back."""
        self._op = None
        self.scaler.abort(r.op, workers=False)
        new = self._config()
        ev = dict(self._event("failed", r.plan, r.old, new, r.begun_s), error=error)
        self.m.events.add("scale_failed", reason=r.plan.reason, error=error)
        self.policy.rejected(r.plan, error)
        self.m.scale_events.append(ev)
        self._bind_first_steps(r.op.new_workers, ev)
        self._open(new, self.now(), None)

    def busy(self) -> bool:
        """A rescale is under way (no checkpoint cut in the middle of one)."""
        return self._op is not None

    def ps_metrics(self) -> dict[int, ActorMetrics]:
        return dict(self._ps_metrics)

    def memory_after_oom(self, memory_mb: int) -> int:
        """Memory for the replacement of an actor killed over its limit: 1.5x, within the budget."""
        return self.driver.memory_after_oom(memory_mb)

    def after_rollback(self) -> None:
        """The job went back to a checkpoint: the running window's throughput means nothing."""
        with self._lock:
            self.driver.rolled_back(self._config(), self.now())

    def abort_pending(self) -> None:
        """The job ends: a rescale still starting its actors is dropped."""
        if self._op is not None:
            self.scaler.abort(self._op.op)
            self._op = None

    def _switched(self, r: Rescale, res: ScaleResult) -> None:
        op, plan, old, t0 = r.op, r.plan, r.old, r.begun_s
        self.m.drain(res.drained)
        self.retired_ps_stats += res.retired_ps_stats
        new = self._config()
        ev = self._event(_kind(old, new, plan), plan, old, new, t0)
        ev.update(
            ops=op.plan.ops(),
            spares_used=op.spares_used,
            duration_s=round(self.now() - t0, 3),
            launch_s=round(res.launch_s, 3),
            pause_s=round(res.pause_s, 3),
            vshards_moved=res.vshards_moved,
            bytes_moved=res.bytes_moved,
            ps_switch_s=res.ps_switch_s,
            bytes_in_pause=res.bytes_in_pause,
            copy_s=round(res.copy_s, 3),
            migration_bytes_per_s=(res.bytes_moved / res.copy_s) if res.copy_s > 0 and res.bytes_moved else None,
        )
        self._bind_first_steps(res.new_workers, ev)
        self._proactive_failures(plan, op, t0)
        self.m.scale_events.append(ev)
        self.m.events.add("scale", **{k: v for k, v in ev.items() if k != "kind"}, scale_kind=ev["kind"])
        self._open(new, self.now(), plan)
        self._spares(new)

    def _proactive_failures(self, plan: ResourcePlan, op: Any, t0: float) -> None:
        """A straggler replaced, or memory raised before an OOM kill: recorded as failures
        handled before they hurt (at: slow since / plan; detected: the plan)."""
        rec = self.m.recovery
        for fix in plan.corrections:
            memory = fix.kind == CorrectionKind.MEMORY_PRESSURE
            f = rec.new_failure(FailureKind.MEMORY_PRESSURE if memory else FailureKind.STRAGGLER, fix.actor, plan.reason, t0)
            f.at_s = round(min(self.driver.watch.slow_since(fix.actor, t0), t0), 3)
            f.replacement = op.new_workers[0] if op.new_workers else None
            # a straggler's slowness costs its share of the job; memory raised in time, nothing
            f.capacity_lost = 0.0 if memory else round(1.0 / max(len(self.m.launcher.workers), 1), 4)
            rec.record(f)

    def _restart(self, plan: ResourcePlan, old: Config) -> dict[Any, str]:
        """The baseline way to rescale: stop every worker at a shard boundary, checkpoint
        the PS to disk, relaunch the whole configuration, restore, go on."""
        from dlrover.master.restart import stop_checkpoint_restart

        t0 = self.now()
        self._close()
        res = stop_checkpoint_restart(self.m, plan.config, self._pending)
        self.retired_ps_stats += res.pop("retired_ps_stats")
        started = res.pop("started")
        new = self._config()
        ev = self._event(_kind(old, new, plan), plan, old, new, t0)
        ev.update(ops=["stop", "checkpoint", "relaunch", "restore"], duration_s=round(self.now() - t0, 3), **res)
        self._bind_first_steps(list(started.values()), ev)
        self.m.scale_events.append(ev)
        self.m.events.add("scale", **{k: v for k, v in ev.items() if k != "kind"}, scale_kind=ev["kind"])
        self._open(new, self.now(), plan)
        return started

    def _event(self, kind: str, plan: ResourcePlan, old: Config, new: Config, at: float) -> dict:
        return {
            "kind": kind,
            "at_s": round(at, 3),
            "stage": plan.stage,
            "reason": plan.reason,
            "from": old.to_dict(),
            "to": new.to_dict(),
            "summary": describe_change(old, new),
            "predicted_throughput": plan.predicted_throughput,
        }

    def _config(self) -> Config:
        lz = self.m.launcher
        return lz.config(exclude=self.m.draining())

    # -- the view -----------------------------------------------------------------------
    def _view(self, now: float, config: Config) -> JobView:
        q = self.m.queue
        progress = Progress(q.samples_done, q.samples_expected) if q is not None else Progress(0.0, 1.0)
        reports = self._actor_metrics(now) if self.m.launcher.vmap is not None else []
        with self._lock:
            return self.driver.view(now, config, progress, reports)

    def _actor_metrics(self, now: float) -> list[ActorMetrics]:
        """Every worker's latest report and every PS's stats, as the driver takes them."""
        lz = self.m.launcher
        reports = {n: r for n, r in self.m.worker_reports().items() if n in lz.workers}
        out = []
        for name, r in reports.items():
            cpu, mem = lz.resources.get(name, (1.0, 0))
            out.append(
                ActorMetrics(
                    name=name,
                    role="worker",
                    cpu=cpu,
                    memory_limit_mb=mem,
                    rss_mb=float(r.get("rss_mb", 0.0)),
                    cpu_util=float(r.get("cpu_percent", 0.0)) / 100.0 / max(cpu, 1e-9),
                    step_time_s=float(r.get("step_time_s", 0.0)),
                    samples_per_s=float(r.get("samples_per_s", 0.0)),
                    wait_ps_s=float(r.get("wait_ps_s", 0.0)),
                    queue_depth=int(r.get("queue_depth", 0)),
                    at_s=float(r.get("at_s", now)),
                )
            )
        return out + list(self._poll_ps(now).values())

    def _poll_ps(self, now: float) -> dict[int, ActorMetrics]:
        lz = self.m.launcher
        ids = list(lz.ps)
        try:
            stats = ray.get([lz.ps[k].stats.remote() for k in ids], timeout=PS_STATS_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return self._ps_metrics
        out = {}
        for k, st in zip(ids, stats):
            name = lz.ps_name(k)
            prev = self._ps_prev.get(k)
            busy = 0.0
            if prev is not None and st["uptime_s"] > prev[0]:
                busy = (st["busy_s"] - prev[1]) / (st["uptime_s"] - prev[0])
            self._ps_prev[k] = (st["uptime_s"], st["busy_s"])
            with self._lock:
                self.driver.rss(name, now, float(st.get("rss_mb", 0.0)))
            cpu, mem = lz.resources.get(name, (1.0, 0))
            out[k] = ActorMetrics(
                name=name,
                role="ps",
                cpu=cpu,
                memory_limit_mb=mem,
                rss_mb=float(st.get("rss_mb", 0.0)),
                cpu_util=float(st.get("cpu_percent", 0.0)) / 100.0 / max(cpu, 1e-9),
                busy=max(0.0, busy),
                queue_depth=int(st.get("pending", 0)),
                at_s=now,
            )
        self._ps_metrics = out
        if len(out) == len(ids):
            self.peak_rss["ps_total"] = max(self.peak_rss["ps_total"], sum(m.rss_mb for m in out.values()))
        for m in out.values():
            self.m.events.add("ps_metrics", actor=m.name, busy=m.busy, rss_mb=m.rss_mb, cpu_util=m.cpu_util, pending=m.queue_depth)
        return out

    # -- end of job ---------------------------------------------------------------------
    def finish(self, summary: dict) -> dict:
        """Close the last window; the summary's policy fields; a history record."""
        self._close()
        configs = [
            {
                "config": m.config.to_dict(),
                "summary": m.config.short(),
                "predicted_throughput": m.predicted,
                "measured_throughput": m.throughput,
                "error": (m.predicted - m.throughput) / m.throughput if m.predicted else None,
                "duration_s": m.duration_s,
                "at_s": m.at_s,
            }
            for m in self.measurements
        ]
        p = self._initial_plan
        out = {
            "policy": self.policy.name,
            "initial_plan": {"stage": p.stage, "reason": p.reason, "config": p.config.to_dict()},
            "configurations": configs,
            "final_config": self._config().to_dict(),
            "perf_model": {"params": self.model.params._asdict(), "identified": list(self.model.identified), "points": self.model.n_points},
            "history_dir": self.history_dir,
        }
        if summary.get("status") == "succeeded" and self.measurements:
            best = max(self.measurements, key=lambda m: m.throughput)
            record = HistoryRecord(
                signature=self.signature,
                dataset=self.dataset,
                job_id=self.m.job_id,
                finished_at=time.time(),
                final_config=self._config(),
                best_config=best.config,
                best_throughput=best.throughput,
                measurements=[{"config": m.config.to_dict(), "throughput": m.throughput, "duration_s": m.duration_s} for m in self.measurements],
                perf_model=self.model.to_dict(),
                samples=int(summary.get("samples_trained", 0)),
                wall_time_s=float(summary.get("wall_time_s", 0.0)),
                status="completed",
                peak_rss_mb={k: round(v, 1) for k, v in self.peak_rss.items() if v > 0},
            )
            try:
                out["history_record"] = str(self.store.add(record))
            except OSError as e:
                self.m.events.add("history_error", error=f"{self.history_dir}: {e}")
        return out


def _kind(old: Config, new: Config, plan: ResourcePlan) -> str:
    """One word for the event: what changed most visibly."""
    if plan.replace and old == new:
        return "replace"
    if plan.rebalance_ps and old == new:
        return "rebalance"
    if (old.workers, old.ps) == (new.workers, new.ps):
        return "resize"
    if new.workers + new.ps > old.workers + old.ps:
        return "scale_out"
    if new.workers + new.ps < old.workers + old.ps:
        return "scale_in"
    return "rescale"
