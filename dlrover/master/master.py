"""JobMaster actor: owns the shard queue, launches PS and worker actors, and watches them.

The master is a threaded Ray actor: ``run`` is one long call that drives the job, while
workers call ``next_shard`` / ``shard_done`` / ``report`` concurrently; those calls go to
the job's books (``dlrover.master.books``), which guard themselves. ``run`` steps the
job's states (``dlrover.master.states``) with the events of the workers' runs; the
master is the ``JobContext`` those states act through. Every ``policy.interval_s`` the
control loop (``dlrover.master.control``) builds a ``JobView``, asks the policy, and has
the Scaler carry out what it decides.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Callable

import numpy as np

from dlrover.data.criteo import FileIndex
from dlrover.data.follow import FollowPlan
from dlrover.data.plan import DataPlan
from dlrover.data.ray_source import StreamPlan
from dlrover.data.shards import Shard
from dlrover.master.books import ShardBooks
from dlrover.errors import DLRoverError
from dlrover.faults.policy import Decision, FailurePolicy
from dlrover.faults.records import Failure, LostPs
from dlrover.ids import ProcessInfo
from dlrover.checkpoint.store import CheckpointStore
from dlrover.master.chaos import ChaosInjector
from dlrover.master.checkpoint import Checkpointer
from dlrover.master.cluster import Cluster, RayCluster
from dlrover.master.control import Controller
from dlrover.master.drain import NodeDrains
from dlrover.master.evaluator import Evaluator
from dlrover.master.events import NOTABLE_EVENTS, EventLog
from dlrover.master.feed import StreamFeed
from dlrover.master.follower import Follower
from dlrover.master.publisher import Publisher
from dlrover.master.launcher import Launcher
from dlrover.master.persist import MasterState, load_master_state, save_master_state
from dlrover.master.recovery import Recovery
from dlrover.master.replace import remove_worker
from dlrover.master.restart import RestartRescale
from dlrover.master.rollback import resume_after_restart
from dlrover.runlogs.records import JobSummary
from dlrover.runlogs.scale_record import ScaleEvent
from dlrover.master.summary import actor_rows, end_summary, ettr_now, export_final, reliability_fields
from dlrover.master.runs import RunGroup
from dlrover.master.states import TERMINAL, Failed, JobLoop, JobStatus, State
from dlrover.metrics.telemetry import Telemetry
from dlrover.master.topology import cluster_cores
from dlrover.resource.plan import Policy
from dlrover.spec import JobSpec
from dlrover.worker.window import RunResult, WorkerReport

TICK_S = 1.0  # the control loop wakes at least this often while workers train
PUBLISH_EVERY_S = 1.0  # metrics export (Ray's agent takes them every few seconds)


class JobMaster:
    def __init__(
        self, job_id: str, spec: JobSpec, data: DataPlan | StreamPlan, policy: Policy, clock: Callable[[], float] = time.monotonic, run_dir: str | None = None,
        cluster: Cluster | None = None, failure_policy: FailurePolicy | None = None,
    ) -> None:  # fmt: skip
        """``spec``, ``data`` (the files' index, or a ray_data job's Dataset), ``policy``: made once, on the driver;
        ``cluster``: where the actors run (default: this process's Ray; tests: a fake);
        ``failure_policy``: how failures are answered (default: the spec's settings)."""
        self.cluster: Cluster = cluster if cluster is not None else RayCluster()
        self.job_id = job_id
        self.run_dir = run_dir
        self.spec = spec
        self.clock = clock
        self.t0 = clock()
        self.events = EventLog(clock=lambda: self.clock() - self.t0)
        self.books = ShardBooks(data.shard_queue(spec, clock), clock, deterministic=spec.train.deterministic)
        self.data = data
        self.policy = policy
        self.launcher: Launcher | None = None
        self.evaluator = Evaluator(self.cluster, data, spec.data.shard_rows, spec.data.eval_every_steps, self.events)
        self.failures: list[Failure] = []
        self.scale_events: list[ScaleEvent] = []
        self.status = JobStatus.STARTING
        self._user_error: DLRoverError | None = None  # bad input a worker hit: raised to the driver
        self._resumed: MasterState | None = None  # what a restarted master takes over
        self._metrics: dict | None = None  # the final evaluation's, once done
        self.runs = RunGroup(self.cluster)
        self.control: Controller | None = None
        self.chaos: ChaosInjector | None = None
        self.drains: NodeDrains | None = None
        r, c = spec.recovery, spec.checkpoint
        replays = not isinstance(data, StreamPlan)  # a stream's trained blocks are released
        self.recovery = Recovery(self, failure_policy or FailurePolicy(c.on_failure, r.ps, c.max_failures, replays))
        self.checkpointer: Checkpointer | None = None
        self.restarts = 0
        self.telemetry = Telemetry(job_id)
        self.follower: Follower | None = None  # a data.follow job's
        self.publisher = Publisher(self, spec.publish) if spec.publish else None
        self._published = float("-inf")

    # -- called by workers ------------------------------------------------------------------
    def next_shard(self, worker: str, generation: int = 0) -> Shard | None | str:
        """A shard to train, ``None`` (nothing right now: ask again) or ``"stop"``.
        ``generation``: the worker's run's; a run from before a rollback gets "stop"."""
        return self.books.next_shard(worker, generation)

    def shard_done(self, worker: str, shard_id: int, rows: int, bad_lines: int, generation: int = 0) -> None:
        self.books.shard_done(worker, shard_id, rows, bad_lines, generation)

    def shard_progress(self, worker: str, applied: dict[int, tuple[int, int]], generation: int = 0) -> None:
        """How far ``worker`` has applied each shard it holds (see ``ShardBooks.progress``)."""
        self.books.progress(worker, applied, generation)

    def file_index(self, path: str) -> FileIndex:
        """A data file's index, for a worker that was started before the file arrived (``data.follow``)."""
        return self.data.index(path) if isinstance(self.data, FollowPlan) else self.data.files[path]

    def preempted(self, actor: str) -> None:
        """``actor`` got SIGTERM (a preemption notice): moved off before its grace ends (``master.drain``)."""
        self.events.add("preemption_notice", actor=actor)
        if self.drains is not None:
            self.drains.preempted(actor)

    def first_step(self, worker: str) -> None:
        """``worker`` trained its first step (sent once per run, before its first report)."""
        now = self.clock() - self.t0
        self.events.add("first_step", actor=worker)
        self.books.stepped(worker)
        self.recovery.first_step(worker)
        if self.control is not None:
            self.control.first_step(worker, now)

    def report(self, worker: str, report: WorkerReport) -> None:
        now = self.clock() - self.t0
        report = replace(report, at_s=now)
        samples = self.books.report(worker, report)
        if self.control is not None:
            self.control.on_report(worker, report, now, samples)
        self.events.add("metrics", actor=worker, **report.to_json())

    # -- called by the driver ----------------------------------------------------------------
    def progress(self, since: int = 0) -> dict:
        """The job as it is now: what the driver's progress lines, ``dlrover status`` and
        the exported metrics show. ``since``: also return the notable events logged after
        that index (``events``) and the index to ask from next (``events_next``)."""
        now = self.clock() - self.t0
        fresh_s = max(3 * self.spec.train.log_every_s, 5.0)  # a worker silent for longer is not training
        b = self.books
        q, samples_seen, reports = b.queue, b.samples_seen, b.worker_reports()
        loss = [r.loss for r in reports.values() if r.samples > 0]  # a window without samples has no loss
        throughput = sum(r.samples_per_s for r in reports.values() if now - (r.at_s if r.at_s is not None else now) <= fresh_s)
        lz, ctl = self.launcher, self.control
        events, events_next = self.events.since(since)
        predicted, measured = ctl.window_now() if ctl else (None, None)
        return {
            "job_id": self.job_id,
            "status": (JobStatus.STOPPING if b.stop_requested and self.status not in TERMINAL else self.status).value,
            "policy": self.spec.policy.name,
            "samples_expected": q.samples_expected,
            "samples_seen": samples_seen,
            "samples_done": q.samples_done,
            "progress": q.samples_done / max(q.samples_expected, 1),
            "samples_per_s": throughput,
            "loss": float(np.mean(loss)) if loss else None,
            "auc": self.evaluator.last_auc,
            "workers": len(lz.workers) if lz else 0,
            "ps": len(lz.ps) if lz else 0,
            "config": lz.config().short() if lz and lz.vmap else None,
            "measurements": len(ctl.measurements) if ctl else 0,
            "window_s": ctl.window_s() if ctl else 0.0,
            "predicted": predicted,
            "measured": measured,
            "ettr": ettr_now(self),
            "checkpoint_age_s": self.checkpointer.age_s(now) if self.checkpointer else {},
            "actors": actor_rows(self, reports),
            # Copies: the records change on other threads (a first step, a recovery).
            "scale_events": [replace(e, first_step_s=dict(e.first_step_s)) for e in list(self.scale_events)],
            "failures": [replace(f) for f in list(self.failures)],
            "restarts": self.restarts,
            **(dict(zip(("lag_rows", "lag_s"), self.follower.lag(self.clock()))) if self.follower else {}),
            "events": [e for e in events if e.kind in NOTABLE_EVENTS],
            "events_next": events_next,
        }

    def node_id(self) -> str:
        return self.cluster.node_id()

    def ping(self) -> ProcessInfo:
        return ProcessInfo(os.getpid(), self.cluster.node_id())

    def stop(self) -> None:
        """Workers get no more shards; the job ends "stopped"."""
        self.books.stop()

    def run(self) -> JobSummary:
        """Drive the job to the end and return the summary (the driver writes it)."""
        spec = self.spec
        self.events.add("job_start", job_id=self.job_id, samples_expected=self.books.queue.samples_expected)
        master = self.cluster.current_actor()
        self.launcher = Launcher(self.cluster, self.job_id, spec, self.data.files, master, lambda: self.books.generation, self.books.worker_reports)
        self.checkpointer = Checkpointer(self, CheckpointStore(self._checkpoint_root(), keep=spec.checkpoint.keep))
        state = load_master_state(self)
        self.control = Controller(self, self.data, self.policy, cluster_cores(self.cluster))
        self.drains = NodeDrains(self)
        self.chaos = ChaosInjector(self, spec.chaos, state.chaos_fired if state else None)
        if isinstance(self.data, StreamPlan):
            StreamFeed(self, self.data).start()  # blocks stream in while the actors start
        elif isinstance(self.data, FollowPlan):
            self.follower = Follower(self, self.data, spec.data.follow, spec.data.paths)
            self.follower.start()  # files are taken while the actors start
        try:
            return self._train_and_evaluate(state)
        finally:
            self.launcher.shutdown()

    # -- master restarts (dlrover.master.persist) ---------------------------------------
    def run_directory(self) -> str:
        """Where the run's files go: the driver's run directory, else one under the temp dir."""
        return self.run_dir or os.path.join(tempfile.gettempdir(), "dlrover-runs", self.job_id)

    def crash(self) -> None:
        """Chaos ``master``: the master process dies here, as on a crash (state persisted
        first, as it is at every checkpoint)."""
        save_master_state(self, crash_at_s=self.clock() - self.t0)
        os._exit(1)

    def _train_and_evaluate(self, state: MasterState | None = None) -> JobSummary:
        self._resumed = state
        end = JobLoop(self, self.runs, tick_s=min(TICK_S, self.spec.policy.interval_s)).run()
        if self._user_error is not None:
            raise type(self._user_error)(str(self._user_error)) from None
        failed = end.reason if isinstance(end, Failed) else None
        if self._metrics is None:  # ended FAILED without an evaluation
            self._wind_down()
        self.events.add("job_end", status=self.status.value, **({"reason": failed} if failed else {}))
        self.recovery.finish()
        if self.publisher is not None:
            self.publisher.finish(final=self.status == JobStatus.SUCCEEDED)
        summary = end_summary(self, self._metrics or {}, failed)
        self.checkpointer.flush()
        if self.status == JobStatus.SUCCEEDED and not self.spec.checkpoint.dir:
            # recovery checkpoints in the run directory served their purpose
            shutil.rmtree(self._checkpoint_root(), ignore_errors=True)
        summary = replace(summary, **reliability_fields(self, summary))
        self.checkpointer.release()  # trained: the export below needs the memory more
        if self.status == JobStatus.SUCCEEDED or (self.spec.checkpoint.dir and self._metrics is not None):  # (a failed job's model: only where asked)
            export_final(self)
        self._publish(force=True)
        return replace(summary, events=self.events.rows())  # with the export's ``model_saved``

    # -- the job loop's context (dlrover.master.states.JobContext) ----------------------
    def entered(self, state: State) -> None:
        self.status = state.status
        self.events.add("state", state=state.name, status=state.status.value, **({"reason": state.reason} if isinstance(state, Failed) else {}))

    def launch(self) -> None:
        state = self._resumed
        if state is None:
            config = self.control.initial_config()
            if (short := self.launcher.check_fits(config)) is not None:
                self.events.add("waiting_for_nodes", why=f"{short}; an autoscaler may add nodes")
            self.launcher.launch(config)
        else:
            config = resume_after_restart(self, state)
            self.control.resumed(config)
        self.control.started(config)
        self.checkpointer.warm_writers()  # before the chaos clock: faults land in training
        if self.publisher is not None:
            self.publisher.warm()
        self.chaos.start(state.chaos_s if state else 0.0)
        r = self.spec.resources
        dense = f"{r.dense_ps} dense PS x {r.dense_ps_cpu:g}cpu"
        self.events.add("launched", workers=len(self.launcher.workers), ps=len(self.launcher.ps), config=f"{config.short()} + {dense}")
        first = self.checkpointer.take({}, self.clock() - self.t0)  # the state to fall back on before any other
        if first is not None:
            self.checkpointer.write_durable(first, first.at_s)
            save_master_state(self)
        self.runs.add({self.launcher.start(name): name for name in list(self.launcher.workers)})

    def evaluate(self) -> None:
        self._wind_down()
        self._metrics = self.evaluator.final(self.launcher)

    def _wind_down(self) -> None:  # training is over: no rescale half done, no evaluation running
        self.control.abort_pending()
        self.evaluator.settle()
        if self.books.train_end is None:
            self.books.train_end = self.clock()

    def _checkpoint_root(self) -> str:
        """Durable checkpoints: ``checkpoint.dir/<job_id>``, else ``<run dir>/checkpoints``."""
        if self.spec.checkpoint.dir:
            return self.spec.checkpoint.dir.rstrip("/") + "/" + self.job_id
        return os.path.join(self.run_directory(), "checkpoints")

    # -- internals --------------------------------------------------------------------------------
    def tick(self) -> None:
        self.evaluator.tick(self.books.steps_done, self.launcher)
        self._forget_done()
        self._publish()

    def _forget_done(self) -> None:
        """Shards done: every PS drops their applied batches (its memory stays bounded)."""
        if done := self.books.take_done():
            for h in [*self.launcher.ps.values(), *self.launcher.dense.handles]:
                h.forget.remote(done)

    def finished(self) -> bool:
        return self.books.queue.finished

    def stopping(self) -> bool:
        return self.books.stop_requested

    def unstarted(self, workers: list[str]) -> bool:
        return not (self.books.running() & set(workers))

    def drop_unstarted(self) -> None:
        """No work left, and the workers still pending never trained a step (a replacement
        or scale-out still waiting for a CPU the cluster does not have): stop them instead
        of waiting for ever. They hold no shards (every shard is done)."""
        for name in self.runs.workers():
            self.events.add("worker_unneeded", actor=name, why="no work left before it started")
            remove_worker(self, name)
        self.runs.drop()

    def watch(self) -> LostPs:
        lost = self.recovery.tick()
        if lost:
            return lost
        self.chaos.tick()
        if not self.recovery.suspects():  # no pause waits on an actor that may be frozen
            self.runs.add(self.control.tick())
            self.checkpointer.tick(self.runs.workers())
        self.runs.add(self.drains.tick())  # a drain's deadline does not wait for a suspect
        return lost

    def rescaling(self) -> bool:
        return self.control.busy()

    def restart_decided(self) -> RestartRescale | None:
        return self.control.decided

    def restart_rescale(self, decision: RestartRescale) -> None:
        self.runs.add(self.control.restart_rescale(decision))

    def running(self) -> list[str]:
        return self.runs.workers()

    def worker_exited(self, worker: str, result: RunResult) -> None:
        self.events.add("worker_exit", actor=worker, **result.to_json())
        self.books.forget_report(worker)
        if worker in self.books.draining():  # removed by a scale-in: its work is done
            remove_worker(self, worker)

    def worker_died(self, worker: str, error: Exception) -> Decision:
        return self.recovery.worker_failed(worker, error)

    def ps_unreachable(self, worker: str, error: Exception) -> LostPs:
        return self.recovery.dead_ps_now()

    def recover(self, lost: LostPs, how: str) -> Decision:
        return self.recovery.ps_failed(lost, how)

    def restart(self) -> None:
        self.recovery.restart()

    def bad_input(self, worker: str, error: DLRoverError) -> None:
        """Bad input (a malformed data line): replacing the worker would only hit it again.
        The job stops and the one-line error goes to the user."""
        self.events.add("job_error", actor=worker, error=str(error))
        self.stop()
        self._user_error = error

    def _publish(self, force: bool = False) -> None:
        """Export the job's metrics (at most every ``PUBLISH_EVERY_S``). A metrics problem
        is logged once and never stops training."""
        now = self.clock()
        if self.telemetry is None or (not force and now - self._published < PUBLISH_EVERY_S):
            return
        self._published = now
        try:
            self.telemetry.publish(self.progress(since=len(self.events)))
        except Exception as e:  # noqa: BLE001 - observability must not take the job down
            self.events.add("telemetry_error", error=f"{type(e).__name__}: {e}"[:300])
            self.telemetry = None
