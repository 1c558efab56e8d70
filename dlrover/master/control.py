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

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlrover.master.actor_stats import ActorStats
from dlrover.master.cluster import ActorDied
from dlrover.master.restart import RestartRescale, stop_checkpoint_restart
from dlrover.master.scale_events import FirstSteps
from dlrover.runlogs.scale_record import ScaleEvent, ScaleKind
from dlrover.ps.ps_stats import PsStats
from dlrover.master.scaler import MigrationAborted, ScaleOp, ScalePhase, ScalePlan, Scaler, ScaleResult, scale_plan
from dlrover.resource.configs import Config, job_budget
from dlrover.resource.driver import DecisionKind, PolicyDriver, Progress
from dlrover.resource.history import HistoryRecord, HistoryStore, dataset_signature, default_history_dir, job_signature
from dlrover.resource.plan import JobView, Measurement, Policy, ResourcePlan
from dlrover.worker.window import WorkerReport

from dlrover.master.job import Job

if TYPE_CHECKING:
    from dlrover.data.plan import DataPlan
    from dlrover.data.ray_source import StreamPlan

DRAIN_STAGE = "drain"  # the stage of a plan that moves actors off a drained node


@dataclass
class Rescale:
    """A policy's plan being carried out: the scale operation and what it started from."""

    op: ScaleOp
    plan: ResourcePlan
    old: Config
    begun_s: float  # job time


class Controller:
    def __init__(self, master: Job, data: "DataPlan | StreamPlan", policy: Policy, cores: float = math.inf) -> None:
        """``policy``: built once, on the driver (a restarted master gets a fresh copy);
        ``cores``: the cluster's physical cores (:func:`~dlrover.master.topology.cluster_cores`)."""
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
            cores=cores,
            ids_per_sample=data.ids_per_sample(spec.layout()),
        )
        self.model = self.driver.model
        self.retired_ps_stats: list[PsStats] = []
        self.scaler = Scaler(master.launcher, running=lambda: self._running, clock=lambda: self.now(), soon=master.runs.soon)
        self._running: list[str] = []
        self._lock = threading.Lock()
        self._next_tick = 0.0
        self.stats = ActorStats(master, self._rss)
        self._first_steps = FirstSteps()
        self._op: Rescale | None = None
        self.decided: RestartRescale | None = None  # ``policy.rescale: restart``: for the RestartRescaling state
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
            self.m.scale_events.append(ScaleEvent.of(ScaleKind.WARM_START, plan, self.requested, plan.config, self.now()))
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
            self.driver.open(config, now, plan)

    def _close(self) -> None:
        with self._lock:
            meas = self.driver.close()
        if meas is None:
            return
        self.m.events.add("measurement", config=meas.config.to_dict(), throughput=meas.throughput, predicted=meas.predicted, duration_s=meas.duration_s, stage=meas.stage)

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
    def on_report(self, worker: str, report: WorkerReport, now: float, samples: int) -> None:
        with self._lock:
            self.driver.observe(now, samples)
            self.driver.rss(worker, now, report.rss_mb)
            self.stats.worker_rss(report.rss_mb)

    def _rss(self, actor: str, now: float, mb: float) -> None:
        with self._lock:
            self.driver.rss(actor, now, mb)

    def first_step(self, worker: str, now: float) -> None:
        """A new worker's first step: its time since the plan goes into the scale event."""
        with self._lock:
            self._first_steps.stepped(worker, now)

    def _bind_first_steps(self, workers: list[str], ev: ScaleEvent) -> None:
        with self._lock:
            self._first_steps.bind(workers, ev)

    def forget(self, name: str) -> None:
        with self._lock:
            self.driver.forget(name)

    # -- the loop -----------------------------------------------------------------------
    def tick(self) -> dict[Any, str]:
        """One control step; returns ``{run ObjectRef: worker}`` of workers it started."""
        now = self.now()
        self._running = self.m.runs.workers()
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
        return self._apply(decision.plan, decision.view.config)

    def replace_now(self, actors: list[str], reason: str) -> dict[Any, str]:
        """Swap each of these actors for a fresh one of its own size, placed elsewhere (a
        node drain), through the same live rescale as a policy's plan. The workers take
        no new shard from now on (nothing else replaces them if they die meanwhile)."""
        if self.busy():
            return {}
        lz = self.m.launcher
        workers = [a for a in actors if a in lz.workers]
        ps = [k for k in lz.ps if lz.ps_name(k) in actors]
        sp = ScalePlan([lz.resources[w] for w in workers], workers, [lz.resources[lz.ps_name(k)] for k in ps], ps)
        config = self._config()
        started = self._apply(ResourcePlan(config, reason, stage=DRAIN_STAGE, replace=list(actors)), config, sp)
        self.m.books.drain(workers)
        return started

    def _apply(self, plan: ResourcePlan, old: Config, sp: ScalePlan | None = None) -> dict[Any, str]:
        """Start carrying out ``plan`` (``sp``: its actor changes, else the diff of the
        running actors against its configuration): new actors are created now, the switch
        happens on a later tick once they run (training goes on meanwhile)."""
        lz = self.m.launcher
        if sp is None:
            draining = self.m.books.draining()
            workers = {n: lz.resources[n] for n in lz.workers if n not in draining and n in lz.resources}
            ps = {k: lz.resources[lz.ps_name(k)] for k in lz.ps}
            sp = scale_plan(plan, workers, ps, lz.ps_name)
        if sp.empty():
            return {}
        if self.spec.policy.rescale == "restart":  # the job loop's RestartRescaling state carries it out
            self.decided = RestartRescale(plan, old) if self.m.books.settled() else None
            return {}
        self._op = Rescale(self.scaler.begin(sp), plan, old, self.now())
        self.m.events.add("scale_begin", reason=plan.reason, ops=sp.ops())
        return self._progress_op(self.now())

    def _progress_op(self, now: float) -> dict[Any, str]:
        """One step of the rescale under way: launch -> (new workers start) pre-copy -> switch."""
        r = self._op
        if r.op.phase is ScalePhase.LAUNCHING:
            return self._launching(r)
        try:
            if r.op.phase is ScalePhase.PRECOPYING and (not self.scaler.precopied(r.op) or self.m.evaluator.busy() or not self.m.books.settled()):
                return {}  # no switch under a periodic evaluation, nor while a dead worker's batches are uncertain
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
        except ActorDied as e:
            ready, error = False, f"a new actor failed to start: {str(e).strip().splitlines()[0]}"
        else:
            error = None if ready or not self.scaler.late(op) else f"new actors not running after {self.scaler.launch_timeout_s:.0f}s (cluster full?)"
        finished = self.m.books.queue.finished
        if error or (finished and not ready):
            self._op = None
            self.scaler.abort(op)
            self.m.events.add("scale_failed", reason=plan.reason, error=error or "job finished first")
            self._rejected(plan, error or "job finished first")
            if error:
                self.m.scale_events.append(ScaleEvent.of(ScaleKind.FAILED, plan, r.old, r.old, r.begun_s, error=error))
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
            self.scaler.start_migration(op, {k: a.busy for k, a in self.stats.ps().items()})
        except MigrationAborted as e:
            self._aborted(r, str(e))
            return started
        return {**started, **self._progress_op(self.now())} if op.phase is ScalePhase.DONE else started

    def _aborted(self, r: Rescale, error: str) -> None:
        """Nothing switched: the new workers train on the old routing; new PS go back."""
        self._op = None
        self.scaler.abort(r.op, workers=False)
        new = self._config()
        ev = ScaleEvent.of(ScaleKind.FAILED, r.plan, r.old, new, r.begun_s, error=error)
        self.m.events.add("scale_failed", reason=r.plan.reason, error=error)
        self._rejected(r.plan, error)
        self.m.scale_events.append(ev)
        self._bind_first_steps(r.op.new_workers, ev)
        self._open(new, self.now(), None)

    def _rejected(self, plan: ResourcePlan, error: str) -> None:
        """Tell the policy its plan failed (a drain's plan is not the policy's)."""
        if plan.stage != DRAIN_STAGE:
            self.policy.rejected(plan, error)

    def busy(self) -> bool:
        """A rescale is under way or decided (no checkpoint cut in the middle of one)."""
        return self._op is not None or self.decided is not None

    def memory_after_oom(self, memory_mb: int) -> int:
        """Memory for the replacement of an actor killed over its limit: 1.5x, within the budget."""
        return self.driver.memory_after_oom(memory_mb)

    def after_rollback(self) -> None:
        """The job went back to a checkpoint (or a PS did): the running window's throughput
        means nothing, and a spare taken as a replacement is made good."""
        with self._lock:
            self.driver.rolled_back(self._config(), self.now())
        self._spares(self._config())

    def abort_pending(self) -> None:
        """The job ends: a rescale still starting its actors is dropped."""
        if self._op is not None:
            self.scaler.abort(self._op.op)
            self._op = None

    def _switched(self, r: Rescale, res: ScaleResult) -> None:
        op, plan, old, t0 = r.op, r.plan, r.old, r.begun_s
        self.m.books.drain(res.drained)
        self.retired_ps_stats += res.retired_ps_stats
        new = self._config()
        ev = ScaleEvent.of(ScaleKind.of(old, new, plan), plan, old, new, t0, ops=op.plan.ops(), spares_used=op.spares_used, duration_s=round(self.now() - t0, 3), timings=res.timings())
        self._bind_first_steps(res.new_workers, ev)
        slow_since = {fix.actor: self.driver.watch.slow_since(fix.actor, t0) for fix in plan.corrections}
        self.m.recovery.corrected(plan, op.new_workers, t0, slow_since)
        self._record(ev)
        self._open(new, self.now(), plan)
        self._spares(new)

    def restart_rescale(self, decision: RestartRescale) -> dict[Any, str]:
        """The baseline way to rescale, as ``decided``: stop every worker at a shard
        boundary, checkpoint the PS to disk, relaunch the whole configuration, restore."""
        plan, old, t0 = decision.plan, decision.old, self.now()
        self.decided = None
        self._close()
        res = stop_checkpoint_restart(self.m, plan.config)
        self.retired_ps_stats += res.retired_ps_stats
        new = self._config()
        ev = ScaleEvent.of(ScaleKind.of(old, new, plan), plan, old, new, t0, ops=["stop", "checkpoint", "relaunch", "restore"], duration_s=round(self.now() - t0, 3), timings=res.timings())
        self._bind_first_steps(list(res.started.values()), ev)
        self._record(ev)
        self._open(new, self.now(), plan)
        return res.started

    def _record(self, ev: ScaleEvent) -> None:
        """A rescale done: its event goes into the summary and, as a ``scale`` row, the log."""
        self.m.scale_events.append(ev)
        row = ev.to_dict()
        self.m.events.add("scale", **{k: v for k, v in row.items() if k != "kind"}, scale_kind=ev.kind.value)

    def _config(self) -> Config:
        lz = self.m.launcher
        return lz.config(exclude=self.m.books.draining())

    # -- the view -----------------------------------------------------------------------
    def _view(self, now: float, config: Config) -> JobView:
        q = self.m.books.queue
        progress = Progress(q.samples_done, q.samples_expected) if q is not None else Progress(0.0, 1.0)
        reports = self.stats.poll(now) if self.m.launcher.vmap is not None else []
        bound, follower = self.m.spec.policy.max_lag_s, self.m.follower
        stream = follower.stream_view(bound) if follower is not None and bound else None
        with self._lock:
            return self.driver.view(now, config, progress, reports, stream=stream)

    # -- end of job ---------------------------------------------------------------------
    def finish(self, status: str, samples: int, wall_time_s: float) -> dict[str, Any]:
        """Close the last window; the summary's policy fields (``JobSummary``'s); a history
        record of a job that succeeded (``samples`` trained in ``wall_time_s``)."""
        self._close()
        configs = [m.row() for m in self.measurements]
        p = self._initial_plan
        out = {
            "policy": self.policy.name,
            "initial_plan": {"stage": p.stage, "reason": p.reason, "config": p.config.to_dict()},
            "configurations": configs,
            "final_config": self._config().to_dict(),
            "perf_model": {"cores": self.model.cores, "params": self.model.params._asdict(), "identified": list(self.model.identified), "points": self.model.n_points},
            "history_dir": self.history_dir,
        }
        if status == "succeeded" and self.measurements:
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
                samples=int(samples),
                wall_time_s=float(wall_time_s),
                status="completed",
                peak_rss_mb={k: round(v, 1) for k, v in self.stats.peak_rss.items() if v > 0},
            )
            try:
                out["history_record"] = str(self.store.add(record))
            except OSError as e:
                self.m.events.add("history_error", error=f"{self.history_dir}: {e}")
        return out

