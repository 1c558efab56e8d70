"""Worker actor: fetch shard -> read rows -> pull pooled embeddings -> dense fwd/bwd -> push.

A background thread (``inputs.ShardInput``) asks the master for shards and parses their
rows into batches, so file reading overlaps training. The main loop keeps lookups in
flight: the pull for step i+1 is issued before step i's forward (``train.staleness: 1``;
further ahead behind a slow link, ``train.max_staleness``, see ``lookahead``), at the end
of step i-1: each PS it pulls from gets step i-1's push in the same call (applied first);
the others get it alone, and so does every PS when no pull follows (input not ready, a
pause asked, input ended). A shard is reported
done only after every PS has acknowledged the pushes of its last batch: "done" means
"applied". Every update carries its batch's id, and the worker tells the master how far
each held shard is applied (with each metrics report, and whenever it parks): a
replacement resumes there, and a PS skips a batch it applied before
(``dlrover.ps.applied``), so each batch updates each PS exactly once.

Elastic operations pause the loop at a step boundary (``gate.PauseGate``): ``pause``
(called by the master on another of the actor's threads) returns once every push of this
worker is applied and no lookup is in flight; ``set_routing`` installs the new PS set and
vshard map and lets the loop go on. Batches routed under the old map are routed again
when their turn comes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from statistics import median
from typing import Any

import psutil
import ray
import torch

from dlrover.faults.injected import ChaosState, node_slowdown
from dlrover.data.criteo import FileIndex
from dlrover.data.reader import FileReader
from dlrover.ids import ProcessInfo
from dlrover.metrics.process import owned_rss_mb
from dlrover.model.dlrm import PSClient, PSEmbeddingBagCollection, build_dense_dlrm, dense_parameters, table_configs
from dlrover.faults.preemption import on_sigterm
from dlrover.ps.dense_shards import DenseShards
from dlrover.ps.shm import LocalLinks
from dlrover.ps.vshard import VShardMap
from dlrover.worker.batches import ShardProgress, Step
from dlrover.worker.dense_client import DenseClient
from dlrover.worker.scoring import Evaluator
from dlrover.worker.gate import Aborted, PauseGate
from dlrover.worker.inputs import FileIndexes, PAUSE_POLL_S, ShardInput
from dlrover.worker.lookahead import Lookahead, PullAhead, ring_slots
from dlrover.worker.window import MetricsWindow, RunResult
from dlrover.worker.worker_spec import WorkerSpec

RECENT_STEPS = 32  # the steps whose median time each report carries (PAL's node speeds)


class Worker:
    """Trains on shards handed out by the master until none are left."""

    def __init__(
        self,
        name: str,
        spec: WorkerSpec,
        master: Any,
        ps: list[Any],
        dense_ps: DenseShards,
        vmap: VShardMap,
        files: dict[str, FileIndex],
        threads: int = 1,
    ) -> None:
        self.name = name
        self.spec = spec
        torch.set_num_threads(max(1, threads))
        self.master = master
        on_sigterm(lambda: master.preempted.remote(name))  # a notice: the master moves us off
        self.dense_ps = dense_ps
        self.files = FileIndexes(files, master)
        schema = spec.layout.schema
        self.reader = FileReader(on_bad_line=self.spec.on_bad_line, layout=spec.layout)
        self.client = PSClient(ps, vmap, self.spec.model.embedding_dim, name, get=ray.get, feature_tables=schema.feature_tables())
        self.ebc = PSEmbeddingBagCollection(table_configs(self.spec.model, schema), self.client)
        self.device = torch.device(spec.device)
        self.model = build_dense_dlrm(self.spec.model, self.ebc, self.spec.seed, schema).to(self.device)
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self.chaos = ChaosState(node_slowdown())  # a slow node (tests, benchmarks)
        self._node = ray.get_runtime_context().get_node_id()  # in each report: the master measures nodes (PAL)
        self._recent_steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self._proc = psutil.Process()
        self._gate = PauseGate()
        self._eval: Evaluator | None = None  # built by the first ``evaluate`` of a routing
        # Per-run state, set afresh by each ``run``. Fault recovery: ``run(generation)`` may
        # be called again after ``abort``; shards and reports carry the generation so the
        # master ignores a stale one.
        self._gen = 0
        self.dense: DenseClient | None = None
        self._input: ShardInput | None = None
        self._in_flight: dict[int, ShardProgress] = {}  # shards being trained
        self._finished: list[ShardProgress] = []  # trained, not reported done yet
        self._dense_refs: list[Any] = []  # the last dense push (one per shard), until its reply is loaded
        self._shard_id: int | None = None  # the previous step's shard (deterministic mode)
        self._ahead: Lookahead | None = None  # the batches whose pulls are in flight
        self._stats: dict[str, float] = {}
        self._window = MetricsWindow(self.client.timings, time.monotonic())

    def set_chaos(self, slowdown: float | None = None, leak_mb_per_s: float | None = None, latency_ms: dict[int, float] | None = None) -> None:
        """Fault injection (the spec's ``chaos:``): run slower, leak memory, or get the
        answers of these PS ids ``ms`` late (a slow link; the PS stays free)."""
        self.chaos.set(slowdown, leak_mb_per_s)
        self.client.latency_s.update({k: ms / 1000.0 for k, ms in (latency_ms or {}).items()})

    # -- elastic control (called by the master on another thread of this actor) -----------
    def pause(self, timeout_s: float = 60.0) -> bool:
        """Park the training loop at a step boundary with all of its updates applied.
        True once parked (or when not training at all)."""
        return self._gate.request_pause(timeout_s)

    def set_routing(self, ps: dict[int, Any], vmap: VShardMap, dense_ps: DenseShards | None = None) -> int:
        """Install a new PS set and vshard map (and dense PS, after a recovery), and resume
        if paused. Returns the map version."""
        with self._gate.releasing():
            self.client.set_routing(ps, vmap, self._links(ps))
            if dense_ps is not None:
                self.dense_ps = dense_ps
            self._eval = None  # the evaluation replica is rebuilt with the new map
        return vmap.version

    def _links(self, ps: dict[int, Any]) -> LocalLinks | None:
        """Shared memory with the PS on this node (none with ``DLROVER_NO_SHM`` set, or
        when a PS does not answer: Ray objects work anywhere)."""
        if os.environ.get("DLROVER_NO_SHM"):
            return None
        try:
            nodes = ray.get([h.stats.remote() for h in ps.values()], timeout=30)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return None
        here = ray.get_runtime_context().get_node_id()
        schema = self.spec.layout.schema
        bags = self.spec.batch_size * len(schema.sparse)
        ids = self.spec.batch_size * schema.max_ids_per_sample()
        local = {k for k, st in zip(ps, nodes) if st.node_id == here}
        # Room for an answer of a whole batch, and for its ids and offsets.
        slots = ring_slots(self.spec.max_staleness)
        return LocalLinks(self.name, local, bags * self.spec.model.embedding_dim, wait=ray.wait, ids_capacity=ids + bags + 1, slots=slots)

    def resume(self) -> None:
        """Let a paused loop go on (a checkpoint was taken meanwhile)."""
        self._gate.resume()

    def trained(self) -> dict[int, tuple[int, int]]:
        """While parked: (lines, rows) of each held shard whose updates are applied, for a
        checkpoint's cut (``ShardQueue.cut``)."""
        return {p.shard.shard_id: (p.rows + p.bad_lines, p.rows) for p in [*self._in_flight.values(), *self._finished]}

    def abort(self) -> None:
        """Stop training now, without reporting anything more (the job rolls back to a
        checkpoint). ``run`` returns an aborted ``RunResult``; a later ``run`` starts afresh."""
        self._gate.abort()

    def _park(self) -> None:
        """Training thread: settle every unapplied push, tell the master how far each held
        shard is applied (no replacement goes back past a pause), then wait for resume."""
        refs = [r for p in [*self._in_flight.values(), *self._finished] for r in p.refs]
        self.dense.leave()  # sync rounds go on without us meanwhile (our last push is in one)
        self._settle(refs + self._dense_refs)
        self._send_progress(block=True)
        self._gate.park()

    def _send_progress(self, block: bool) -> None:
        """Report the applied prefix of each held shard whose prefix moved."""
        held = [*self._in_flight.values(), *self._finished]
        moved = {p.shard.shard_id: p.applied for p in held if p.advance(self._ready)}
        if moved:
            ref = self.master.shard_progress.remote(self.name, moved, self._gen)
            if block:
                ray.get(ref)

    def _settle(self, refs: list[Any]) -> None:
        """Wait for these pushes to be applied; in round mode checking for an abort (a round
        a dead, not yet forgotten worker holds must not block a rollback's abort)."""
        refs = list(dict.fromkeys(refs))  # a step's dense refs may be in its shard's books too
        while self.spec.dense_rounds and refs and len(ray.wait(refs, num_returns=len(refs), timeout=PAUSE_POLL_S)[0]) < len(refs):
            self._gate.check()
        ray.get(refs)

    @staticmethod
    def _ready(refs: list[Any]) -> bool:
        """Every push done and applied (a failed one is not: progress stops before it)."""
        if not refs:
            return True
        if len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
            return False
        try:
            ray.get(refs)
        except ray.exceptions.RayError:
            return False
        return True

    # -- training loop -----------------------------------------------------------------------------
    def run(self, generation: int = 0) -> RunResult:
        """Train until the master has no more shards (or ``abort``); the run's totals."""
        self._gen = generation
        if self.client.links is None:
            self.client.set_routing(self.client.ps, self.client.vmap, self._links(self.client.ps))
        self._gate.start_run()
        self.ebc.reset()
        self._in_flight, self._finished = {}, []
        self._input = ShardInput(self.master, self.name, generation, self.files, self.reader, self.spec.batch_size, self.client)
        self.dense = DenseClient(dense_parameters(self.model), self.dense_ps, owner=self.name, rounds=self.spec.dense_rounds)
        try:
            return self._train()
        except Aborted:
            return RunResult(generation, aborted=True)
        finally:
            self._input.stop()  # the input thread must not ask for shards once we are gone
            self._gate.end_run()
            self.dense.close()

    def _train(self) -> RunResult:
        """One step per batch until input ends; after each step's backward the next
        batches' pulls go out, carrying its pushes."""
        self._input.start()
        self.dense.pull()
        self.model.train()
        self._stats = {"steps": 0, "samples": 0, "loss_sum": 0.0, "wait_dense_s": 0.0, "compute_s": 0.0, "wait_data_s": 0.0}
        self._window = MetricsWindow(self.client.timings, time.monotonic())
        self._dense_refs, self._shard_id = [], None
        ahead = self._ahead = Lookahead(self._input.poll, self._prefetch, PullAhead.of(self.spec.staleness, self.spec.max_staleness))
        while True:
            self._gate.check()
            if not ahead:
                step = None if ahead.ended else self._wait_step()
                if step is None:
                    break
                ahead.push(step)
            t_step, cpu_step, waited = time.perf_counter(), time.thread_time(), self.client.timings["wait_pull_s"]
            # A pause issues no more pulls, so that once the batches already pulled are
            # trained no lookup is in flight and the loop can park (at the end of a step
            # that began with the pause asked: ``pausing``).
            pausing = self._gate.pause_requested
            if not pausing:
                ahead.fill()
            cur = ahead.pop()
            self._train_step(cur)
            self._gate.check()  # an abort sends nothing more
            if not self._gate.pause_requested:
                ahead.fill()  # the next pulls carry this step's pushes (one call per PS)
            push_refs = self.ebc.take_push_refs()  # those the next pulls did not carry
            self._book(cur, push_refs)
            self._end_step(t_step, cpu_step)
            ahead.control.observe(self.client.timings["wait_pull_s"] - waited, time.perf_counter() - t_step)
            if self.spec.staleness == 0:
                ray.get(push_refs)
            if pausing and not ahead:
                self._park()
        self._stats["pull_ahead_peak"] = ahead.control.peak
        return self._finish()

    def _wait_step(self) -> Step | None:
        """The next batch, waiting for it (None once input ended). A pause asked meanwhile
        parks the loop here: no lookup is in flight."""
        # About to block on input: the master may be waiting for our done reports
        # before it hands out more (end of epoch), so settle them first.
        self._finished = self._report_applied(self._finished, block=True)
        if self._gate.pause_requested:
            self._park()
        t0 = time.perf_counter()
        self._gate.check()
        step, ended = self._input.poll()
        while step is None and not ended:
            self.dense.leave()  # waiting for input: sync rounds must not wait for us
            if self._gate.pause_requested:  # idle: a safe point as it is
                self._park()
            self._gate.check()
            step, ended = self._input.poll(PAUSE_POLL_S)
        self._stats["wait_data_s"] += time.perf_counter() - t0
        return step

    def _prefetch(self, step: Step) -> None:
        """Issue a batch's embedding pull now, so that it runs beside other work."""
        if step.kjt is not None:
            self.ebc.prefetch(step.kjt, step.routed, step.batch_id)

    def _train_step(self, step: Step) -> None:
        """Forward, backward and dense push of one batch (its embedding pushes are held:
        ``ebc.take_push_refs`` sends what the next pulls did not carry)."""
        if self.spec.deterministic and step.shard.shard_id != self._shard_id:
            # Shards run one at a time across workers in this mode: start each from
            # the dense parameters the previous shard (maybe another worker's) left.
            self._settle_dense()
            self.dense.pull()
        self._shard_id = step.shard.shard_id
        n = len(step.batch)
        if not n:  # an empty last batch only closes its shard's books
            return
        if self._dense_refs:
            t0 = time.perf_counter()
            self._settle(self._dense_refs)
            self.dense.apply(self._dense_refs)
            self._stats["wait_dense_s"] += time.perf_counter() - t0
        for p in self.dense.params:
            p.grad = None
        t0 = time.perf_counter()
        dev = self.device
        loss = self.loss_fn(self.model(step.dense.to(dev), step.kjt).squeeze(-1), step.labels.to(dev))
        loss.backward()
        self._stats["compute_s"] += time.perf_counter() - t0
        self._dense_refs = self.dense.push(step.batch_id)
        if self._stats["steps"] == 0:
            self.master.first_step.remote(self.name)
        loss_sum = float(loss) * n
        self._stats["steps"] += 1
        self._stats["samples"] += n
        self._stats["loss_sum"] += loss_sum
        self._window.add(n, loss_sum)

    def _settle_dense(self) -> None:
        """Wait until the last dense push is applied (its reply is not loaded)."""
        if self._dense_refs:
            self._settle(self._dense_refs)
            self._dense_refs = []

    def _book(self, step: Step, push_refs: list[Any]) -> None:
        """Enter the step in its shard's books; report shards whose updates are applied."""
        prog = self._in_flight.setdefault(step.shard.shard_id, ShardProgress(step.shard))
        dense = self._dense_refs if len(step.batch) else []
        prog.add(len(step.batch), step.bad_lines, push_refs + dense)
        if step.last_of_shard:
            self._finished.append(self._in_flight.pop(step.shard.shard_id))
        self._finished = self._report_applied(self._finished, block=False)

    def _end_step(self, t_step: float, cpu_step: float) -> None:
        """Injected slowdown, then the step's time into the metrics window (sent when due)."""
        self.chaos.after_step(time.perf_counter() - t_step, time.thread_time() - cpu_step)
        took = time.perf_counter() - t_step
        self._window.step_s += took
        self._recent_steps.append(took)
        now = time.monotonic()
        if now - self._window.t0 >= self.spec.log_every_s:
            self._report(now)

    def _finish(self) -> RunResult:
        """Input ended: wait for the last updates and report them; the run's stats."""
        self._settle_dense()
        self.dense.leave()
        self._report_applied(self._finished, block=True)
        self._report(time.monotonic())
        self._input.join(timeout_s=5)
        return RunResult(self._gen, rss_mb=owned_rss_mb(self._proc), timings=dict(self.client.timings), **self._stats)

    def _report_applied(self, finished: list[ShardProgress], block: bool) -> list[ShardProgress]:
        """Tell the master about shards whose updates every PS has acknowledged; the rest."""
        remaining = []
        for prog in finished:
            if block:
                self._settle(prog.refs)
            else:
                ready, _ = ray.wait(prog.refs, num_returns=len(prog.refs), timeout=0)
                if len(ready) < len(prog.refs):
                    remaining.append(prog)
                    continue
            ray.get(self.master.shard_done.remote(self.name, prog.shard.shard_id, prog.rows, prog.bad_lines, self._gen))
        return remaining

    def _report(self, now: float) -> None:
        """Send the metrics window to the master and open the next one."""
        recent = median(self._recent_steps) if self._recent_steps else 0.0  # a window's mean is one stall away from noise
        report = self._window.metrics(now, self.client.timings, self._input.depth(), self._proc, self._node, recent, self._ahead.control.depth)
        self.master.report.remote(self.name, report)
        self._send_progress(block=False)
        self._window = MetricsWindow(self.client.timings, now)

    # -- evaluation and liveness (served on other threads than ``run``) ---------------------
    def evaluate(self, ranges: list[tuple[str, int, int]]) -> dict:
        """Scores rows [start, stop) of each file with the latest parameters, on a replica of
        the model (``Evaluator``), so it can be called while ``run`` trains."""
        evaluator = self._eval
        if evaluator is None:
            spec = self.spec
            evaluator = self._eval = Evaluator(self.client, self.name, spec.model, spec.seed, spec.on_bad_line, spec.batch_size, self.files, spec.layout, self.device)
        return evaluator.evaluate(ranges, self.dense_ps)

    def ping(self) -> ProcessInfo:
        """The liveness probe."""
        return ProcessInfo(os.getpid(), ray.get_runtime_context().get_node_id())
