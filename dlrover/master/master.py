"""JobMaster actor: owns the shard queue, launches PS and worker actors, and watches them.

The master is a threaded Ray actor: ``run`` is one long call that drives the job, while
workers call ``next_shard`` / ``shard_done`` / ``report`` concurrently (guarded by one
lock and a condition variable that wakes workers waiting for work). Actor deaths arrive
as errors on the workers' ``run`` ObjectRefs through ``ray.wait``: events, not polling.

Every ``policy.interval_s`` the control loop (``dlrover.master.control``) builds a
``JobView``, asks the policy, and has the Scaler carry out what it decides.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np
import ray
import torch

from dlrover.data.plan import DataPlan
from dlrover.data.shards import Shard, ShardQueue
from dlrover.errors import DLRoverError
from dlrover.failures import CheckpointRef, Failure, FailureKind
from dlrover.ids import ProcessInfo
from dlrover.checkpoint.store import CheckpointStore
from dlrover.master.checkpoint import Checkpointer
from dlrover.master.control import Controller
from dlrover.master.events import EventLog
from dlrover.master.launcher import Launcher
from dlrover.master.recovery import Recovery
from dlrover.master.states import TERMINAL, JobLoop, JobStatus, RunGroup
from dlrover.master.telemetry import Telemetry
from dlrover.metrics.reliability import reliability_report
from dlrover.metrics.evaluation import evaluate_scores
from dlrover.spec import JobSpec

NEXT_SHARD_WAIT_S = 1.0
TICK_S = 1.0  # the control loop wakes at least this often while workers train
PERIODIC_EVAL_MAX_RANGES = 4  # periodic evaluation scores a bounded slice of the held-out rows
PUBLISH_EVERY_S = 1.0  # metrics export (Ray's agent takes them every few seconds)
# Events worth a line in the driver log (``ray job logs -f``) and in ``dlrover status``.
NOTABLE_EVENTS = frozenset({
    "initial_config", "launched", "scale", "scale_failed", "plan_rejected", "failure", "recovered", "oom_kill", "chaos",
    "measurement", "eval", "rollback", "master_resumed", "checkpoint_corrupt", "bad_node", "job_error", "job_end",
    "worker_unneeded", "telemetry_error",
})


class JobMaster:
    def __init__(self, job_id: str, spec: dict, clock: Callable[[], float] = time.monotonic, run_dir: str | None = None) -> None:
        self.job_id = job_id
        self.run_dir = run_dir
        self.spec = JobSpec.model_validate(spec)
        self.clock = clock
        self.t0 = clock()
        self.events = EventLog(clock=lambda: self.clock() - self.t0)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self.queue: ShardQueue | None = None
        self.data: DataPlan | None = None
        self.launcher: Launcher | None = None
        self.bad_lines = 0
        self.metrics: dict[str, dict] = {}
        self.samples_done = 0
        self.steps_done = 0
        self._next_eval_step = self.spec.data.eval_every_steps or None
        self._eval_ref: tuple[Any, int] | None = None
        self.train_start: float | None = None
        self.train_end: float | None = None
        self.failures: list[Failure] = []
        self.scale_events: list[dict] = []
        self.status = JobStatus.STARTING
        self._stop_requested = False  # stop(): workers get no more shards, the job ends "stopped"
        self._user_error: DLRoverError | None = None  # bad input a worker hit: raised to the driver
        self._lost_ps: tuple[list[int], bool] = ([], False)  # what ps_unreachable found
        self.runs = RunGroup()
        # Workers that died or were removed: a call of theirs still running in this actor
        # (Ray does not cancel it) must not lease a shard to a name nobody trains under.
        self._retired: set[str] = set()
        self._draining: set[str] = set()  # finish their leased shards, then get "stop"
        self.control: Controller | None = None
        self.recovery = Recovery(self)
        self.checkpointer: Checkpointer | None = None
        self.restarts = 0
        self._stepped: set[str] = set()  # workers that trained a step (actor up and running)
        self._last_auc: float | None = None
        self.telemetry = Telemetry(job_id)
        self._published = float("-inf")

    # -- called by workers ------------------------------------------------------------------
    def next_shard(self, worker: str, generation: int = 0) -> Shard | None | str:
        """A shard to train, ``None`` (nothing right now: ask again) or ``"stop"``.
        ``generation``: the worker's run's; a run from before a rollback gets "stop"."""
        with self._work:
            if self.train_start is None:
                self.train_start = self.clock()
            deadline = self.clock() + NEXT_SHARD_WAIT_S
            while True:
                stale = generation != self.launcher.generation
                if stale or self.queue.finished or self._stop_requested or worker in self._retired or worker in self._draining:
                    return "stop"
                # Deterministic mode: one shard at a time across the job.
                busy = self.spec.train.deterministic and self.queue.doing_count > 0
                shard = None if busy else self.queue.next(worker)
                self.queue.renew(worker)
                if shard is not None:
                    return shard
                left = deadline - self.clock()
                if left <= 0:
                    return None
                self._work.wait(left)

    def shard_done(self, worker: str, shard_id: int, rows: int, bad_lines: int, generation: int = 0) -> None:
        with self._work:
            if worker in self._retired or generation != self.launcher.generation:
                return  # requeued when it was retired, or rolled back since
            self.queue.done(shard_id, worker, rows)
            self.queue.renew(worker)
            self.bad_lines += bad_lines
            if self.queue.finished:
                self.train_end = self.clock()
            self._work.notify_all()

    def report(self, worker: str, metrics: dict) -> None:
        now = self.clock() - self.t0
        if metrics.get("first_step"):
            self.events.add("first_step", actor=worker)
            self.recovery.first_step(worker)
            self._stepped.add(worker)
            if self.control is not None:
                self.control.first_step(worker, now)
            return
        with self._lock:
            if self.queue is not None:
                self.queue.renew(worker)  # progress: its leases live on
            self.samples_done += metrics.get("samples", 0)
            self.steps_done += metrics.get("steps", 0)
            metrics = dict(metrics, at_s=now)
            self.metrics[worker] = metrics
            samples = self.samples_done
        if self.control is not None:
            self.control.on_report(worker, metrics, now, samples)
        self.events.add("metrics", actor=worker, **metrics)

    # -- called by the driver ----------------------------------------------------------------
    def progress(self, since: int = 0) -> dict:
        """The job as it is now: what the driver's progress lines, ``dlrover status`` and
        the exported metrics show. ``since``: also return the notable events logged after
        that index (``events``) and the index to ask from next (``events_next``)."""
        now = self.clock() - self.t0
        fresh_s = max(3 * self.spec.train.log_every_s, 5.0)  # a worker silent for longer is not training
        with self._lock:
            q = self.queue
            loss = [m["loss"] for m in self.metrics.values() if "loss" in m]
            samples_seen = self.samples_done
            throughput = sum(m.get("samples_per_s", 0.0) for m in self.metrics.values() if now - m.get("at_s", now) <= fresh_s)
        lz, ctl = self.launcher, self.control
        events, events_next = self.events.since(since)
        predicted, measured = ctl.window_now() if ctl else (None, None)
        return {
            "job_id": self.job_id,
            "status": (JobStatus.STOPPING if self._stop_requested and self.status not in TERMINAL else self.status).value,
            "policy": self.spec.policy.name,
            "samples_expected": q.samples_expected if q else 0,
            "samples_seen": samples_seen,
            "samples_done": q.samples_done if q else 0,
            "progress": q.samples_done / max(q.samples_expected, 1) if q else 0.0,
            "samples_per_s": throughput,
            "loss": float(np.mean(loss)) if loss else None,
            "auc": self._last_auc,
            "workers": len(lz.workers) if lz else 0,
            "ps": len(lz.ps) if lz else 0,
            "config": lz.config().short() if lz and lz.vmap else None,
            "measurements": len(ctl.measurements) if ctl else 0,
            "window_s": ctl.window_s() if ctl else 0.0,
            "predicted": predicted,
            "measured": measured,
            "ettr": self._ettr_now(),
            "checkpoint_age_s": self.checkpointer.age_s(now) if self.checkpointer else {},
            "actors": self._actor_rows(),
            # Copies of the fields readers use: the originals gain keys on other threads.
            "scale_events": [{"kind": e["kind"]} for e in list(self.scale_events)],
            "failures": [{k: f.to_dict()[k] for k in ("kind", "cause_class", "at_s", "recovered_s")} for f in list(self.failures)],
            "restarts": self.restarts,
            "events": [e for e in events if e["kind"] in NOTABLE_EVENTS],
            "events_next": events_next,
        }

    def _actor_rows(self) -> list[dict]:
        """Resources and latest measurements of each running worker and PS."""
        lz = self.launcher
        if lz is None or lz.vmap is None:
            return []
        with self._lock:
            reports = {n: dict(r) for n, r in self.metrics.items()}
        rows = []
        for name in list(lz.workers):
            cpu, mem = lz.resources.get(name, (1.0, 0))
            r = reports.get(name, {})
            rows.append({
                "name": name, "role": "worker", "cpus": cpu, "memory_limit_mb": mem, "rss_mb": r.get("rss_mb"),
                "cpu_util": r["cpu_percent"] / 100.0 / max(cpu, 1e-9) if "cpu_percent" in r else None,
                "step_time_s": r.get("step_time_s"), "pull_s": r.get("pull_s"), "push_s": r.get("push_s"),
            })
        ps = self.control.ps_metrics() if self.control else {}
        for k in list(lz.ps):
            name = lz.ps_name(k)
            cpu, mem = lz.resources.get(name, (1.0, 0))
            m = ps.get(k)
            rows.append({"name": name, "role": "ps", "cpus": cpu, "memory_limit_mb": mem, "rss_mb": m.rss_mb if m else None, "cpu_util": m.cpu_util if m else None})
        return rows

    def _ettr_now(self) -> float | None:
        """ETTR of the job so far (None before training starts)."""
        if self.train_start is None or self.queue is None:
            return None
        now = self.clock()
        wall = now - self.t0
        train = (self.train_end or now) - self.train_start
        return self._reliability_report(wall, train, self.queue.samples_done).ettr

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def ping(self) -> ProcessInfo:
        return ProcessInfo(os.getpid(), ray.get_runtime_context().get_node_id())

    def stop(self) -> None:
        with self._work:
            self._stop_requested = True
            self._work.notify_all()

    def run(self) -> dict:
        """Drive the job to the end and return the summary (the driver writes it)."""
        spec = self.spec
        self.data = DataPlan.build(spec)
        self.queue = ShardQueue(
            [(p, n) for p, n in self.data.train_rows.items()],
            shard_rows=spec.data.shard_rows,
            epochs=spec.data.epochs,
            shuffle_seed=spec.seed if spec.data.shuffle else None,
            clock=self.clock,
        )
        self.events.add("job_start", job_id=self.job_id, samples_expected=self.queue.samples_expected)
        self.launcher = Launcher(self.job_id, spec, self.data.files, master=ray.get_runtime_context().current_actor)
        self.checkpointer = Checkpointer(self, CheckpointStore(self._checkpoint_root(), keep=spec.checkpoint.keep))
        state = self._load_state()
        self.control = Controller(self, self.data, chaos_fired=state["chaos_fired"] if state else None)
        try:
            return self._train_and_evaluate(state)
        finally:
            self.launcher.shutdown()

    # -- master restarts ----------------------------------------------------------------------
    # The master runs with Ray's max_restarts: when its process dies, the actors it owns
    # die with it, Ray starts it again and retries ``run``. It finds its persisted state
    # (start time, failures, scale events, chaos fired, checkpoint store) and resumes from
    # the newest durable checkpoint instead of starting over.
    def _state_path(self) -> str:

        return os.path.join(self._run_dir(), "master_state.json")

    def _run_dir(self) -> str:

        return self.run_dir or os.path.join(tempfile.gettempdir(), "dlrover-runs", self.job_id)

    def _persist(self, crash_at_s: float | None = None) -> None:

        path = self._state_path()
        state = {
            "job_id": self.job_id,
            "started_wall": time.time() - (self.clock() - self.t0),
            "crash_at_s": crash_at_s if crash_at_s is not None else self.clock() - self.t0,
            "samples_done": self.queue.samples_done if self.queue else 0,
            "train_start_s": None if self.train_start is None else self.train_start - self.t0,
            "samples_replayed": self.recovery.samples_replayed,
            "failures": [f.to_dict() for f in self.failures],
            "scale_events": self.scale_events,
            "chaos_fired": self.control.chaos_fired if self.control else [],
            "chaos_s": self.control.chaos_s() if self.control else 0.0,
            "restarts": self.restarts,
        }
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f, default=float)
        os.replace(path + ".tmp", path)

    def _load_state(self) -> dict | None:

        path = self._state_path()
        if not os.path.exists(path):
            return None
        with open(path) as f:
            state = json.load(f)
        if state.get("job_id") != self.job_id:
            return None
        self.t0 = self.clock() - (time.time() - float(state["started_wall"]))
        self.failures = [Failure.from_dict(f) for f in state["failures"]]
        self.scale_events = list(state["scale_events"])
        self.restarts = int(state["restarts"]) + 1
        if state.get("train_start_s") is not None:
            self.train_start = self.t0 + float(state["train_start_s"])
        self.recovery.samples_replayed = int(state["samples_replayed"])
        return state

    def crash(self) -> None:
        """Chaos ``master``: the master process dies here, as on a crash (state persisted
        first, as it is at every checkpoint)."""

        self._persist(crash_at_s=self.clock() - self.t0)
        os._exit(1)

    def _resume(self, state: dict) -> Any:
        """After a master restart: relaunch the checkpoint's configuration and load it."""
        from dlrover.resource.plan import Config

        detected = self.clock() - self.t0
        ckpt, payloads, source = self.checkpointer.load_durable()
        config = Config(**ckpt.extra["config"])
        self.launcher.launch(config)
        lz = self.launcher
        refs = [ray.put(p) for p in payloads]
        ray.get([h.restore.remote(lz.vmap, refs) for h in lz.ps.values()])
        ray.get(lz.dense_ps.set_state.remote(ckpt.dense))
        with self._work:
            self.queue = ShardQueue.from_state_dict(ckpt.queue, clock=self.clock)
            self.bad_lines, self.steps_done = ckpt.bad_lines, ckpt.steps
        replayed = max(0, int(state["samples_done"]) - ckpt.samples)
        self.recovery.samples_replayed += replayed
        failure = self.recovery.new_failure(FailureKind.MASTER_DEATH, f"{self.job_id}/master", "master process exited", detected)
        failure.at_s = round(float(state["crash_at_s"]), 3)
        failure.checkpoint, failure.samples_replayed, failure.restarts = CheckpointRef(ckpt.seq, round(ckpt.at_s, 3), source), replayed, self.restarts
        self.recovery.record(failure, list(lz.workers))
        self.events.add("master_resumed", restarts=self.restarts, checkpoint_seq=ckpt.seq, samples_replayed=replayed)
        return config

    def _train_and_evaluate(self, state: dict | None = None) -> dict:
        if state is None:
            config = self.control.initial_config()
            self.launcher.launch(config)
        else:
            config = self._resume(state)
            self.control.resumed(config)
        self.control.started(config, chaos_s=float(state.get("chaos_s", 0.0)) if state else 0.0)
        self.events.add("launched", workers=len(self.launcher.workers), ps=len(self.launcher.ps), config=config.short())
        first = self.checkpointer.take({}, self.clock() - self.t0)  # the state to fall back on before any other
        if first is not None:
            self.checkpointer.write_durable(first, first.at_s)
            self._persist()
        self.runs.add({self.launcher.start(name): name for name in list(self.launcher.workers)})
        loop = JobLoop(self, self.runs, tick_s=min(TICK_S, self.spec.policy.interval_s))
        loop.run()
        if self._user_error is not None:
            raise type(self._user_error)(str(self._user_error)) from None
        self.control.abort_pending()
        if self._eval_ref is not None:  # a periodic evaluation still running: keep its result
            ray.wait([self._eval_ref[0]])
            self._next_eval_step = None
            self._tick()
        if self.train_end is None:
            self.train_end = self.clock()
        self.entered(JobStatus.EVALUATING)
        metrics = self._evaluate()
        self.entered(JobStatus.SUCCEEDED if self.queue.finished else JobStatus.STOPPED if self._stop_requested else JobStatus.FAILED)
        self.events.add("job_end", status=self.status.value)
        self.recovery.finish()
        summary = self._summary(metrics)
        ps_stats = ray.get([ps.stats.remote() for ps in self.launcher.ps.values()]) + self.control.retired_ps_stats
        # Each (sample, feature) bag is pushed to exactly one PS: this counts applied updates.
        summary["ps_bags_updated"] = int(sum(s["rows_updated"] for s in ps_stats))
        summary.update(self.control.finish(summary))
        self.checkpointer.flush()
        if self.status == JobStatus.SUCCEEDED and not self.spec.checkpoint.dir:
            # recovery checkpoints in the run directory served their purpose
            shutil.rmtree(self._checkpoint_root(), ignore_errors=True)
        summary.update(self._reliability(summary))
        self._export_final()
        self._publish(force=True)
        return summary

    def _checkpoint_root(self) -> str:
        """Durable checkpoints: ``checkpoint.dir/<job_id>``, else ``<run dir>/checkpoints``."""

        if self.spec.checkpoint.dir:
            return self.spec.checkpoint.dir.rstrip("/") + "/" + self.job_id
        return os.path.join(self._run_dir(), "checkpoints")

    def _reliability_report(self, wall_s: float, train_s: float, trained: int):
        replayed = self.recovery.samples_replayed
        failures = [f.to_dict() for f in self.failures]
        args = {"wall_s": wall_s, "train_s": train_s, "samples_replayed": replayed}
        # Replayed samples cost time at the speed the job trains when it trains (not the
        # job's average, which already includes the outages and the replay itself).
        stalls = reliability_report(failures, throughput=0.0, **args).downtime_s
        speed = (trained + replayed) / max(train_s - stalls, 1e-9)
        return reliability_report(failures, throughput=speed, **args)

    def _reliability(self, summary: dict) -> dict:
        rep = self._reliability_report(summary["wall_time_s"], summary["train_time_s"], summary["samples_trained"])
        return {
            "reliability": rep.to_dict(),
            "ettr": rep.ettr,
            "mttf_s": rep.mttf_s,
            "samples_replayed": int(self.recovery.samples_replayed),
            "oom_kills": sum(f.kind == FailureKind.OOM_KILL for f in self.failures),
            "bad_nodes": sorted(self.launcher.avoid),
            "checkpoints": self.checkpointer.summary(),
        }

    def _export_final(self) -> None:
        """Write the trained model (global embedding tables + dense parameters) to
        ``checkpoint.dir/<job_id>/final.pt`` when a checkpoint directory is set."""
        if not self.spec.checkpoint.dir:
            return

        sizes = self.spec.model.table_sizes()
        tables = [torch.zeros(n, self.spec.model.embedding_dim) for n in sizes]
        for h in self.launcher.ps.values():
            for t, (rows, w) in enumerate(ray.get([h.table_rows.remote(t) for t in range(len(sizes))])):
                tables[t][torch.from_numpy(rows)] = torch.from_numpy(w)
        dense = torch.as_tensor(ray.get(self.launcher.dense_ps.pull.remote())[1])
        out = os.path.join(self.spec.checkpoint.dir, self.job_id)
        os.makedirs(out, exist_ok=True)
        tmp = os.path.join(out, "final.pt.tmp")
        torch.save({"tables": tables, "dense": dense, "job_id": self.job_id}, tmp)
        os.replace(tmp, os.path.join(out, "final.pt"))
        self.events.add("model_saved", path=os.path.join(out, "final.pt"))

    # -- internals --------------------------------------------------------------------------------
    # -- the job loop's context (dlrover.master.states.JobContext) ----------------------
    def entered(self, status: JobStatus) -> None:
        with self._lock:
            self.status = status

    def tick(self) -> None:
        self._tick()
        self._publish()

    def finished(self) -> bool:
        return self.queue.finished

    def stopping(self) -> bool:
        return self._stop_requested

    def unstarted(self, workers: list[str]) -> bool:
        return not any(n in self._stepped for n in workers)

    def drop_unstarted(self) -> None:
        """No work left, and the workers still pending never trained a step (a replacement
        or scale-out still waiting for a CPU the cluster does not have): stop them instead
        of waiting for ever. They hold no shards (every shard is done)."""
        for name in self.runs.workers():
            self.events.add("worker_unneeded", actor=name, why="no work left before it started")
            self.launcher.forget_worker(name)
        self.runs.pending.clear()

    def watch(self) -> None:
        pending = self.runs.pending
        self.recovery.tick(pending)
        if not self.recovery.suspects():  # no pause waits on an actor that may be frozen
            pending.update(self.control.tick(pending))
            self._checkpoint(pending)

    def rescaling(self) -> bool:
        return self.control.busy()

    def running(self) -> list[str]:
        return self.runs.workers()

    def worker_exited(self, worker: str, stats: dict) -> None:
        self.events.add("worker_exit", actor=worker, **{k: v for k, v in stats.items() if np.isscalar(v)})
        with self._lock:
            self.metrics.pop(worker, None)
        if worker in self._draining:  # removed by a scale-in: its work is done
            self.launcher.forget_worker(worker)
            self.control.forget(worker)

    def worker_died(self, worker: str, error: Exception) -> None:
        self.recovery.worker_failed(worker, error, self.runs.pending)

    def ps_unreachable(self, worker: str, error: Exception) -> bool:
        self._lost_ps = self.recovery.dead_ps_now()
        return bool(self._lost_ps[0] or self._lost_ps[1])

    def recover(self, worker: str, error: Exception) -> None:
        dead, dense = self._lost_ps
        cause = str(getattr(error, "cause", error)).strip().splitlines()[0][:120]
        self.recovery.ps_failed(self.runs.pending, dead, dense, f"{worker}: {cause}")

    def bad_input(self, worker: str, error: DLRoverError) -> None:
        """Bad input (a malformed data line): replacing the worker would only hit it again.
        The job stops and the one-line error goes to the user."""
        self.events.add("job_error", actor=worker, error=str(error))
        self.stop()
        self._user_error = error

    def _checkpoint(self, pending: dict) -> None:
        """Take an in-memory checkpoint when one is due (not while a rescale is under way),
        and write one to durable storage when that is due."""
        now = self.clock() - self.t0
        ck = self.checkpointer
        if not ck.due(now) or self.control.busy() or self._eval_ref is not None:
            return
        if any(n not in self._stepped for n in pending.values()):
            return  # a replacement still starting: pausing it would stall the others until it runs
        lz = self.launcher
        running = {n: lz.workers[n] for n in pending.values() if n in lz.workers}
        taken = ck.take(running, now)
        if taken is not None and ck.durable_due(now, len(self.failures)):
            ck.write_durable(taken, now)
        self._persist()

    def drain(self, names: list[str]) -> None:
        """Give these workers no more shards; they finish what they hold and exit."""
        with self._work:
            self._draining.update(names)
            self._work.notify_all()

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

    def _tick(self) -> None:
        """Periodic control work; for now the optional every-N-steps evaluation."""
        if self._eval_ref is not None and ray.wait([self._eval_ref[0]], timeout=0)[0]:
            ref, step = self._eval_ref
            self._eval_ref = None
            try:
                scores = self._score([ray.get(ref)])
                self._last_auc = scores.get("auc")
                self.events.add("eval", step=step, periodic=True, **scores)
            except ray.exceptions.RayError:
                pass  # the evaluating worker died; the next period tries again
        if self._next_eval_step is None or self.steps_done < self._next_eval_step or self._eval_ref is not None:
            return
        worker = next(iter(self.launcher.workers.values()), None)
        ranges = self.data.eval_ranges(self.spec.data.shard_rows)[:PERIODIC_EVAL_MAX_RANGES]
        if worker is not None and ranges:
            self._eval_ref = (worker.evaluate.remote(ranges), self.steps_done)
        while self._next_eval_step <= self.steps_done:
            self._next_eval_step += self.spec.data.eval_every_steps

    def _score(self, results: list[dict]) -> dict:
        labels = np.concatenate([r["labels"] for r in results])
        logits = np.concatenate([r["logits"] for r in results])
        oracle = None
        if all(r["oracle"] is not None for r in results):
            oracle = np.concatenate([r["oracle"] for r in results])
        return evaluate_scores(labels, torch.sigmoid(torch.from_numpy(logits)).numpy(), oracle)

    def _evaluate(self) -> dict:
        ranges = self.data.eval_ranges(self.spec.data.shard_rows)
        if not ranges:
            return {}
        for attempt in range(2):
            if not self.launcher.workers:  # every worker died after the last shard
                self.launcher.add_worker()
            workers = list(self.launcher.workers.items())
            parts = [ranges[i :: len(workers)] for i in range(len(workers))]
            try:
                results = ray.get([w.evaluate.remote(p) for (_, w), p in zip(workers, parts) if p])
                break
            except ray.exceptions.RayActorError:
                if attempt:
                    raise
                for name, w in workers:  # drop the dead ones and score again on the rest
                    try:
                        ray.get(w.ping.remote(), timeout=30)
                    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                        self.launcher.forget_worker(name)
        out = self._score(results)
        self._last_auc = out.get("auc")
        self.events.add("eval", final=True, **out)
        return out

    def _summary(self, metrics: dict) -> dict:
        q = self.queue
        train_s = max((self.train_end or self.clock()) - (self.train_start or self.t0), 1e-9)
        expected = q.samples_expected - self.bad_lines
        trained = q.samples_done
        return {
            "job_id": self.job_id,
            "status": self.status.value,
            "samples_expected": int(expected),
            "samples_trained": int(trained),
            "samples_lost": int(max(expected - trained, 0)),
            "bad_lines_skipped": int(self.bad_lines),
            "auc": metrics.get("auc"),
            "logloss": metrics.get("logloss"),
            "best_auc": metrics.get("best_auc"),
            "eval_rows": metrics.get("rows", 0),
            "throughput_samples_per_s": trained / train_s,
            "train_time_s": train_s,
            "wall_time_s": self.clock() - self.t0,
            "epochs": self.spec.data.epochs,
            "config": {
                "workers": self.spec.resources.workers,
                "ps": self.spec.resources.ps,
                "worker_cpu": self.spec.resources.worker_cpu,
                "ps_cpu": self.spec.resources.ps_cpu,
                "batch_size": self.spec.data.batch_size,
                "vshards": self.spec.train.vshards,
            },
            "scale_events": self.scale_events,
            "failures": [f.to_dict() for f in self.failures],
            "events": self.events.rows(),
        }
