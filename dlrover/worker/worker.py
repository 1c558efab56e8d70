"""Worker actor: fetch shard -> read rows -> pull pooled embeddings -> dense fwd/bwd -> push.

A background thread asks the master for shards and parses their rows into batches, so
file reading overlaps training. The main loop keeps one lookup in flight: the pull for
step i+1 is issued before step i's forward (``train.staleness: 1``), so the PS work of
the next batch overlaps this batch's MLP compute. A shard is reported done only after
every PS has acknowledged the pushes of its last batch: "done" means "applied".

Elastic operations pause the loop at a step boundary: ``pause`` (called by the master on
another of the actor's threads) returns once every push of this worker is applied and no
lookup is in flight; ``set_routing`` installs the new PS set and vshard map and lets the
loop go on. Batches routed under the old map are routed again when their turn comes.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import ray
import torch

from dlrover.chaos import ChaosState
from dlrover.data.criteo import Batch, FileIndex
from dlrover.data.reader import FileReader
from dlrover.data.shards import Shard
from dlrover.ids import ProcessInfo
from dlrover.model.dlrm import (
    PSClient,
    PSEmbeddingBagCollection,
    build_dense_dlrm,
    dense_parameters,
    make_kjt,
    table_configs,
)
from dlrover.ps.vshard import VShardMap
from dlrover.spec import JobSpec, ModelSpec
from dlrover.worker.dense_client import DenseClient


@dataclass(frozen=True)
class WorkerSpec:
    """The part of the job spec a worker uses (it gets nothing else)."""

    model: ModelSpec
    seed: int
    batch_size: int
    on_bad_line: str
    staleness: int
    deterministic: bool
    log_every_s: float

    @classmethod
    def of(cls, spec: JobSpec) -> "WorkerSpec":
        d, t = spec.data, spec.train
        return cls(spec.model, spec.seed, d.batch_size, d.on_bad_line, t.staleness, t.deterministic, t.log_every_s)


@dataclass
class Step:
    """One batch on its way through the worker."""

    shard: Shard | None
    batch: Batch
    last_of_shard: bool
    bad_lines: int = 0
    kjt: Any = None
    routed: Any = None  # the batch split by owning PS, computed on the input thread
    dense: torch.Tensor | None = None
    labels: torch.Tensor | None = None


@dataclass
class ShardProgress:
    shard: Shard
    rows: int = 0
    bad_lines: int = 0
    refs: list[Any] = field(default_factory=list)


_END = object()
PAUSE_POLL_S = 0.05  # how often a worker idle on input checks for a pause request


class _Aborted(Exception):
    """The master called ``abort``: leave ``run`` at once (a rollback follows)."""


def batches_of(reader: FileReader, index: FileIndex, start: int, stop: int, batch_size: int):
    """Read rows [start, stop) of a file as batches of ``batch_size`` (last one shorter)."""
    for a in range(start, stop, batch_size):
        batch, bad = reader.read(index, a, min(stop, a + batch_size))
        yield batch, bad, a + batch_size >= stop


def to_step(step: Step) -> Step:
    b = step.batch
    step.kjt = make_kjt(b.sparse)
    step.dense = torch.from_numpy(b.dense)
    step.labels = torch.from_numpy(b.labels)
    return step


class Worker:
    """Trains on shards handed out by the master until none are left."""

    def __init__(
        self,
        name: str,
        spec: WorkerSpec,
        master: Any,
        ps: list[Any],
        dense_ps: Any,
        vmap: VShardMap,
        files: dict[str, FileIndex],
        threads: int = 1,
    ) -> None:
        self.name = name
        self.spec = spec
        torch.set_num_threads(max(1, threads))
        self.master = master
        self.dense_ps = dense_ps
        self.files = files
        self.reader = FileReader(on_bad_line=self.spec.on_bad_line)
        self.client = PSClient(ps, vmap, self.spec.model.embedding_dim, name, get=ray.get)
        self.ebc = PSEmbeddingBagCollection(table_configs(self.spec.model), self.client)
        self.model = build_dense_dlrm(self.spec.model, self.ebc, self.spec.seed)
        self.dense: DenseClient | None = None  # opened by each run
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._eval: tuple | None = None
        # Pause/resume handshake between the master's calls and the training loop.
        self._ctl = threading.Condition()
        self._running = False
        self._pause_requested = False
        self._paused = False
        self._queue: queue.Queue | None = None
        self.chaos = ChaosState()
        # Fault recovery: ``run(generation)`` may be called again after ``abort``; shards
        # and reports carry the generation so the master ignores a stale one.
        self._gen = 0
        self._abort = False
        self._in_flight: dict[int, ShardProgress] = {}
        self._finished: list[ShardProgress] = []

    def set_chaos(self, slowdown: float = 1.0, leak_mb_per_s: float = 0.0) -> None:
        """Fault injection (the spec's ``chaos:``): run slower, or leak memory."""
        self.chaos.set(slowdown, leak_mb_per_s)

    # -- elastic control (called by the master on another thread of this actor) -----------
    def pause(self, timeout_s: float = 60.0) -> bool:
        """Park the training loop at a step boundary with all of its updates applied.
        True once parked (or when not training at all)."""
        with self._ctl:
            self._pause_requested = True  # a run not started yet parks before its first pull
            self._ctl.notify_all()
            if not self._running:
                return True
            return self._ctl.wait_for(lambda: self._paused or not self._running, timeout=timeout_s)

    def set_routing(self, ps: dict[int, Any], vmap: VShardMap, dense_ps: Any = None) -> int:
        """Install a new PS set and vshard map (and dense PS, after a recovery), and resume
        if paused. Returns the map version."""
        with self._ctl:
            self.client.set_routing(ps, vmap)
            if dense_ps is not None:
                self.dense_ps = dense_ps
            self._eval = None  # the evaluation replica is rebuilt with the new map
            self._pause_requested = False
            self._ctl.notify_all()
        return vmap.version

    def resume(self) -> None:
        """Let a paused loop go on (a checkpoint was taken meanwhile)."""
        with self._ctl:
            self._pause_requested = False
            self._ctl.notify_all()

    def trained(self) -> dict[int, tuple[int, int]]:
        """While parked: (lines, rows) of each held shard whose updates are applied, for a
        checkpoint's cut (``ShardQueue.cut``)."""
        return {p.shard.shard_id: (p.rows + p.bad_lines, p.rows) for p in [*self._in_flight.values(), *self._finished]}

    def abort(self) -> None:
        """Stop training now, without reporting anything more (the job rolls back to a
        checkpoint). ``run`` returns ``{"aborted": True}``; a later ``run`` starts afresh."""
        with self._ctl:
            self._abort = True
            self._pause_requested = False
            self._ctl.notify_all()

    def _park(self, drain: list[Any]) -> None:
        """Training thread: settle ``drain`` (every unapplied push), then wait for resume."""
        ray.get(drain)
        with self._ctl:
            self._paused = True
            self._ctl.notify_all()
            self._ctl.wait_for(lambda: not self._pause_requested or self._abort)
            self._paused = False
        if self._abort:
            raise _Aborted()

    # -- input pipeline ----------------------------------------------------------------------
    def _produce(self, out: queue.Queue, gen: int) -> None:
        """Background thread: shards from the master -> parsed batches on ``out``."""

        def put(item: Any) -> bool:
            while not self._stop.is_set():
                try:
                    out.put(item, timeout=PAUSE_POLL_S)
                    return True
                except queue.Full:
                    pass
            return False  # run ended (aborted): nobody reads this queue any more

        try:
            while not self._stop.is_set():
                shard = ray.get(self.master.next_shard.remote(self.name, gen))
                if shard == "stop":
                    break
                if shard is None:
                    continue
                index = self.files[shard.path]
                carried_bad = 0
                for batch, bad, last in batches_of(self.reader, index, shard.start, shard.stop, self.spec.batch_size):
                    if len(batch) == 0 and not last:  # every line skipped: nothing to train
                        carried_bad += bad
                        continue
                    step = Step(shard, batch, last, bad + carried_bad)
                    carried_bad = 0
                    if len(batch):
                        to_step(step)
                        # Routing and the object-store put of the ids are CPU work that
                        # can run here, off the training thread.
                        step.routed = self.client.route(step.kjt, put=ray.put)
                    if not put(step):  # an empty last step only closes the shard's books
                        return
        except BaseException as e:  # surfaced by the main loop
            put(e)
        put(_END)

    # -- training loop -----------------------------------------------------------------------------
    def run(self, generation: int = 0) -> dict:
        """Train until the master has no more shards (or ``abort``); the stats of this run."""
        with self._ctl:
            self._running = True
            self._abort = False
            self._gen = generation
        self._stop.clear()
        self.ebc.reset()
        self._in_flight, self._finished = {}, []
        self.dense = DenseClient(dense_parameters(self.model), self.dense_ps, owner=self.name)
        try:
            return self._run()
        except _Aborted:
            return {"aborted": True, "generation": generation}
        finally:
            self._stop.set()  # the input thread must not ask for shards once we are gone
            with self._ctl:
                self._running = False
                self._ctl.notify_all()
            self.dense.close()

    def _run(self) -> dict:
        q: queue.Queue = queue.Queue(maxsize=4)
        self._queue = q
        producer = threading.Thread(target=self._produce, args=(q, self._gen), daemon=True, name="shard-reader")
        producer.start()
        self.dense.pull()
        self.model.train()
        stats = {"steps": 0, "samples": 0, "loss_sum": 0.0, "wait_dense_s": 0.0, "compute_s": 0.0, "wait_data_s": 0.0}
        in_flight = self._in_flight
        last_report = time.monotonic()
        window = self._new_window(time.monotonic())

        def take(item: Any) -> Step | None:
            if isinstance(item, BaseException):
                raise item
            return None if item is _END else item

        def unapplied() -> list[Any]:
            refs = [r for p in [*in_flight.values(), *self._finished] for r in p.refs]
            return refs + ([dense_ref] if dense_ref is not None else [])

        def wait_step() -> Step | None:
            # About to block on input: the master may be waiting for our done reports
            # before it hands out more (end of epoch), so settle them first.
            self._finished = self._report_applied(self._finished, block=True)
            if self._pause_requested:  # no lookup in flight here: a safe point
                self._park(unapplied())
            t0 = time.perf_counter()
            while True:
                if self._abort:
                    raise _Aborted()
                try:
                    item = q.get(timeout=PAUSE_POLL_S)
                    break
                except queue.Empty:
                    if self._pause_requested:  # idle: a safe point as it is
                        self._park(unapplied())
            stats["wait_data_s"] += time.perf_counter() - t0
            return take(item)

        def peek_step() -> tuple[Step | None, bool]:
            """The next batch if one is ready (never blocks), and whether input ended."""
            try:
                item = q.get_nowait()
            except queue.Empty:
                return None, False
            step = take(item)
            return step, step is None

        dense_ref = None
        cur: Step | None = None
        ended = False
        shard_id = None
        while True:
            if self._abort:
                raise _Aborted()
            if cur is None:
                if ended:
                    break
                cur = wait_step()
                if cur is None:
                    break
                if cur.kjt is not None:
                    self.ebc.prefetch(cur.kjt, cur.routed)
            t_step = time.perf_counter()
            # Read once per step: a pause skips the lookahead pull, so that at the end of
            # this step no lookup is in flight and the loop can park.
            pausing = self._pause_requested
            nxt = None
            if self.spec.staleness == 1 and not ended and not pausing:
                nxt, ended = peek_step()
                if nxt is not None and nxt.kjt is not None:
                    self.ebc.prefetch(nxt.kjt, nxt.routed)
            n = len(cur.batch)
            push_refs: list[Any] = []
            if self.spec.deterministic and cur.shard.shard_id != shard_id:
                # Shards run one at a time across workers in this mode: start each from
                # the dense parameters the previous shard (maybe another worker's) left.
                if dense_ref is not None:
                    ray.get(dense_ref)
                    dense_ref = None
                self.dense.pull()
            shard_id = cur.shard.shard_id
            if n:
                if dense_ref is not None:
                    t0 = time.perf_counter()
                    self.dense.apply(dense_ref)
                    stats["wait_dense_s"] += time.perf_counter() - t0
                for p in self.dense.params:
                    p.grad = None
                t0 = time.perf_counter()
                logits = self.model(cur.dense, cur.kjt).squeeze(-1)
                loss = self.loss_fn(logits, cur.labels)
                loss.backward()
                stats["compute_s"] += time.perf_counter() - t0
                dense_ref = self.dense.push()
                push_refs = self.ebc.take_push_refs()
                if stats["steps"] == 0:
                    self.master.report.remote(self.name, {"first_step": True})
                loss_sum = float(loss) * n
                stats["steps"] += 1
                stats["samples"] += n
                stats["loss_sum"] += loss_sum
                window["samples"] += n
                window["loss_sum"] += loss_sum
                window["steps"] += 1

            prog = in_flight.setdefault(cur.shard.shard_id, ShardProgress(cur.shard))
            prog.rows += n
            prog.bad_lines += cur.bad_lines
            prog.refs.extend(push_refs)
            if cur.last_of_shard:
                if dense_ref is not None:
                    prog.refs.append(dense_ref)
                self._finished.append(in_flight.pop(cur.shard.shard_id))
            self._finished = self._report_applied(self._finished, block=False)

            self.chaos.after_step(time.perf_counter() - t_step)
            window["step_s"] += time.perf_counter() - t_step
            now = time.monotonic()
            if now - last_report >= self.spec.log_every_s:
                self._report(window, now)
                window = self._new_window(now)
                last_report = now

            if self.spec.staleness == 0:
                ray.get(push_refs)
            cur = nxt
            if pausing:
                self._park(unapplied())
        if dense_ref is not None:
            ray.get(dense_ref)
        self._report_applied(self._finished, block=True)
        self._report(window, time.monotonic())
        producer.join(timeout=5)
        stats["rss_mb"] = self._proc.memory_info().rss / 2**20
        stats.update(self.client.timings)
        return stats

    def _report_applied(self, finished: list[ShardProgress], block: bool) -> list[ShardProgress]:
        """Tell the master about shards whose updates every PS has acknowledged."""
        remaining = []
        for prog in finished:
            if block:
                ray.get(prog.refs)
            else:
                ready, _ = ray.wait(prog.refs, num_returns=len(prog.refs), timeout=0)
                if len(ready) < len(prog.refs):
                    remaining.append(prog)
                    continue
            ray.get(self.master.shard_done.remote(self.name, prog.shard.shard_id, prog.rows, prog.bad_lines, self._gen))
        return remaining

    def _new_window(self, now: float) -> dict:
        return {"samples": 0, "loss_sum": 0.0, "t0": now, "steps": 0, "step_s": 0.0, **{f"at_{k}": v for k, v in self.client.timings.items()}}

    def _report(self, window: dict, now: float) -> None:
        dt = max(now - window["t0"], 1e-9)
        steps = max(window["steps"], 1)

        def spent(timing: str) -> float:  # seconds of a PS-client timing in this window
            return self.client.timings[timing] - window[f"at_{timing}"]

        self.master.report.remote(
            self.name,
            {
                "samples": window["samples"],
                "steps": window["steps"],
                "samples_per_s": window["samples"] / dt,
                "loss": window["loss_sum"] / max(window["samples"], 1),
                "step_time_s": window["step_s"] / steps,
                "wait_ps_s": spent("wait_pull_s") / steps,
                "pull_s": (spent("issue_pull_s") + spent("wait_pull_s")) / steps,
                "push_s": spent("push_s") / steps,
                "queue_depth": self._queue.qsize() if self._queue is not None else 0,
                "rss_mb": self._proc.memory_info().rss / 2**20,
                "cpu_percent": self._proc.cpu_percent(),
            },
        )

    # -- evaluation ------------------------------------------------------------------------------------
    def evaluate(self, ranges: list[tuple[str, int, int]]) -> dict:
        """Scores rows [start, stop) of each file with the latest parameters.

        Runs on its own model replica, reader and PS client, so it can be called while
        ``run`` trains (periodic evaluation) without touching the training state.
        """
        if self._eval is None:
            client = PSClient(self.client.ps, self.client.vmap, self.client.dim, f"{self.name}/eval", get=ray.get)
            model = build_dense_dlrm(self.spec.model, PSEmbeddingBagCollection(table_configs(self.spec.model), client), self.spec.seed)
            self._eval = (model.eval(), dense_parameters(model), FileReader(on_bad_line=self.spec.on_bad_line))
        model, params, reader = self._eval
        torch.nn.utils.vector_to_parameters(torch.as_tensor(ray.get(self.dense_ps.pull.remote())[1]), params)
        labels, logits, batches = [], [], []
        with torch.no_grad():
            for path, start, stop in ranges:
                for batch, _bad, _last in batches_of(reader, self.files[path], start, stop, self.spec.batch_size):
                    if len(batch) == 0:
                        continue
                    step = to_step(Step(None, batch, False))
                    logits.append(model(step.dense, step.kjt).squeeze(-1).numpy())
                    labels.append(batch.labels)
                    batches.append((path, batch))
        return {
            "labels": np.concatenate(labels) if labels else np.zeros(0, np.float32),
            "logits": np.concatenate(logits) if logits else np.zeros(0, np.float32),
            "oracle": _oracle_scores(batches),
        }

    def ping(self) -> ProcessInfo:
        """The liveness probe (served on another thread than ``run``)."""
        return ProcessInfo(os.getpid(), ray.get_runtime_context().get_node_id())


def _oracle_scores(batches: list[tuple[str, Batch]]) -> np.ndarray | None:
    """The synthetic generator's true probabilities for these rows, if the data is synthetic."""
    from dlrover.data.synth import Oracle

    cache: dict[str, Any] = {}
    out = []
    for path, batch in batches:
        d = os.path.dirname(path)
        if d not in cache:
            cache[d] = Oracle.from_dir(d)
        if cache[d] is None:
            return None
        out.append(cache[d].probability(batch))
    return np.concatenate(out) if out else None


def worker_threads(cpu: float, override: int | None) -> int:
    return override or max(1, math.ceil(cpu))
