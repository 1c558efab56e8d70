"""Job checkpoints: consistent cuts of the whole training state, in memory and on disk.

A cut parks every worker at a step boundary with all of its updates applied (the same
handshake as a migration's second round), then, in one short pause: each PS's vshards
(weights + optimizer state) are copied into the Ray object store as the result of a call
the master owns (``EmbeddingPS.snapshot``: one copy, none inside the PS), the dense PS
hands over its parameters and optimizer state, and the shard queue is cut
(``ShardQueue.cut``: half-trained shards go back to todo with the part the model already
holds as an offset). Then training resumes. That is the in-memory checkpoint, cheap
enough to take every few seconds.

Every so often (``checkpoint.interval_s``, or Young-Daly from the failures seen) the
latest in-memory checkpoint is also written to durable storage on a background thread
(:class:`dlrover.checkpoint.store.CheckpointStore`, checksummed; the PS payloads' files
by one task on each node holding some, the manifest last by the master), as a full checkpoint
every ``checkpoint.full_every`` and otherwise a delta of the rows pushed since the
previous durable cut (:class:`dlrover.checkpoint.chain.DurableChain`; each PS reports
those rows at every cut, ``EmbeddingPS.cut_changes``). Recovery reads the newest
in-memory checkpoint and falls back to the durable one (full + deltas replayed) when its
objects are gone (their node died) or the master itself restarted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

import functools

import numpy as np

from dlrover.checkpoint.chain import DurableChain, LinkWrite
from dlrover.checkpoint.manifest import FileEntry
from dlrover.checkpoint.store import CheckpointError, CheckpointStore
from dlrover.master.books import Cut, held_samples
from dlrover.master.cluster import CallTimeout, Cluster, RayError, get_alive
from dlrover.metrics.reliability import failure_rate_per_s, young_daly_interval_s

from dlrover.master.job import Job
from dlrover.master.persist import save_master_state


PAUSE_TIMEOUT_S = 30.0
OBJECT_GET_TIMEOUT_S = 30.0


def write_parts(link: LinkWrite, indices: list[int], *payloads: Any) -> list[tuple[str, FileEntry]]:
    """Write the files of ``payloads`` (their indices in the checkpoint: ``indices``) in
    this process, one thread each: hashing and file I/O release the GIL, so several
    files overlap their disk waits as separate processes did. Run as a task, whose
    arguments Ray has fetched (from this node's object store: no copy)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(payloads), thread_name_prefix="checkpoint-part") as pool:
        return list(pool.map(link.write, indices, payloads))


def writer_ready() -> None:
    """Nothing: the process that runs it has loaded this module (torch and the checkpoint
    code), which is what ``Checkpointer.warm_writers`` wants done before training."""


def write_where_payloads_are(cluster: Cluster, link: LinkWrite, payloads: list[Any]) -> list[tuple[str, FileEntry]]:
    """The PS payloads' durable files, written by one task on each node holding some of
    them (it reads them there without a copy): no process gathers them. One task a node,
    not one a payload: each task beyond the first on a node would start a fresh Ray
    worker process (importing torch, about 2 s of CPU) while training goes on; one task
    runs in the process ``Checkpointer.warm_writers`` started. Payloads that are not
    refs (loaded from disk by a recovery) and objects whose node Ray does not know go
    to one task placed by Ray."""
    where = cluster.object_nodes([p for p in payloads if cluster.is_ref(p)])
    by_node: dict[str | None, list[tuple[int, Any]]] = {}
    for i, p in enumerate(payloads):
        nodes = where.get(p) if cluster.is_ref(p) else None
        by_node.setdefault(nodes[0] if nodes else None, []).append((i, p))
    shared = cluster.put(link)
    tasks = [cluster.task(write_parts, shared, [i for i, _ in parts], *[p for _, p in parts], node=node) for node, parts in by_node.items()]
    written = {i: f for parts, files in zip(by_node.values(), cluster.get(tasks)) for (i, _), f in zip(parts, files)}
    return [written[i] for i in range(len(payloads))]


@dataclass
class Checkpoint:
    """One consistent cut. ``ps``: ObjectRefs of the PS payloads (in memory), the
    payloads themselves (loaded from disk), or None once released (on disk only)."""

    seq: int
    at_s: float  # job time of the cut
    queue: dict  # ShardQueue state, nothing leased
    samples: int  # rows the checkpoint holds (done shards + offsets)
    bad_lines: int
    steps: int
    dense: dict
    ps: list[Any] | None
    pause_s: float = 0.0
    durable_path: str | None = None
    extra: dict = field(default_factory=dict)  # job state persisted with it (plan, ...)

    def cut(self) -> Cut:
        """The books as they were at this checkpoint."""
        return Cut(self.queue, self.bad_lines, self.steps)

    def meta(self) -> dict:
        return {
            "seq": self.seq,
            "at_s": self.at_s,
            "queue": self.queue,
            "samples": self.samples,
            "bad_lines": self.bad_lines,
            "steps": self.steps,
            "extra": self.extra,
        }


class Checkpointer:
    """Takes in-memory checkpoints and writes some of them to durable storage."""

    def __init__(self, master: Job, store: CheckpointStore | None) -> None:
        self.m = master
        self.spec = master.spec.checkpoint
        self.store = store
        self.chain = DurableChain(store, self.spec.full_every, self.spec.quantize) if store is not None else None
        self.latest: Checkpoint | None = None
        # The cut taken at launch, before any step: its tables are every PS's seed rows,
        # so it is never lost, even before a durable write (see ``payloads``).
        self.initial: Checkpoint | None = None
        self.taken = 0
        self.written: list[dict] = []  # durable writes: seq, path, bytes, write_s, at_s
        self.pauses: list[float] = []
        self._seq = 0
        self._last_durable_at: float | None = None
        self._writer: threading.Thread | None = None
        self._write_error: str | None = None
        self._lock = threading.Lock()

    # -- when ---------------------------------------------------------------------------
    def durable_interval_s(self, now: float, failures: int) -> float:
        """``interval_s``, or Young-Daly from the observed failure rate and write time."""
        if self.spec.interval_s != "auto":
            return float(self.spec.interval_s)
        write_s = float(np.mean([w["write_s"] for w in self.written[-3:]])) if self.written else 1.0
        rate = failure_rate_per_s(failures, now, self.spec.prior_mttf_s, prior_weight_s=self.spec.prior_mttf_s)
        return young_daly_interval_s(write_s, rate, self.spec.min_interval_s, self.spec.max_interval_s)

    def age_s(self, now: float) -> dict[str, float]:
        """Seconds since the newest checkpoint of each tier that has one."""
        out = {}
        latest, durable = self.latest, self._last_durable_at  # read once: the run thread may reset them
        if latest is not None:
            out["memory"] = now - latest.at_s
        if durable is not None:
            out["durable"] = now - durable
        return out

    def due(self, now: float) -> bool:
        if self.latest is None:
            return True
        every = self.spec.memory_interval_s
        return every > 0 and now - self.latest.at_s >= every

    def durable_due(self, now: float, failures: int) -> bool:
        if self.store is None or (self._writer is not None and self._writer.is_alive()):
            return False
        return self._last_durable_at is None or now - self._last_durable_at >= self.durable_interval_s(now, failures)

    # -- taking one ---------------------------------------------------------------------
    def tick(self, training: list[str]) -> None:
        """Take an in-memory checkpoint when one (or a published version) is due, not while
        a rescale or an evaluation is under way; write it to durable storage, and publish
        it, when that is due. ``training``: the workers whose runs are open."""
        m = self.m
        now = m.clock() - m.t0
        publish = m.publisher is not None and m.publisher.due(now)
        if not (self.due(now) or publish) or m.control.busy() or m.evaluator.busy() or not m.books.settled():
            return
        if set(training) - m.books.running():
            return  # a replacement still starting: pausing it would stall the others until it runs
        running = {n: m.launcher.workers[n] for n in training if n in m.launcher.workers}
        taken = self.take(running, now, timeout_s=m.recovery.timeout_s())
        if taken is not None and publish:  # first: a durable write may release the cut's payloads
            m.publisher.publish(taken, now)
        if taken is not None and self.durable_due(now, len(m.failures)):
            self.write_durable(taken, now)
        save_master_state(m)

    def take(self, workers: dict[str, Any], now: float, extra: dict | None = None, timeout_s: float = PAUSE_TIMEOUT_S) -> Checkpoint | None:
        """Cut now. ``workers``: the training workers' handles. None (and nothing changed)
        when a worker does not park within ``timeout_s`` (at most the liveness timeout: a
        frozen worker must not hold the loop longer than it takes to declare it hung) or a
        PS does not answer.

        The previous checkpoint is released first when it is on disk: the object store
        then holds one copy of the tables, not two (a model near the store's size would
        otherwise be spilled to disk inside the pause), and recovery still has that
        state, from disk, should this cut fail."""
        timeout_s = min(timeout_s, PAUSE_TIMEOUT_S)
        m, lz = self.m, self.m.launcher
        self.release()
        t0 = m.clock()
        names, live = list(workers), []
        try:
            parked = get_alive(m.cluster, [workers[n].pause.remote(timeout_s) for n in names], timeout_s + 1)
            live = [n for n, p in zip(names, parked) if p is not None]
            if any(p is False for p in parked):
                m.events.add("checkpoint_skipped", why="a worker did not pause in time")
                return None
            trained: dict[int, tuple[int, int]] = {}
            for t in get_alive(m.cluster, [workers[n].trained.remote() for n in live], timeout_s + 1):
                trained.update({int(k): tuple(v) for k, v in (t or {}).items()})
            ps = dict(lz.ps)
            changed = [h.cut_changes.remote() for h in ps.values()]  # rows pushed since the last cut
            snaps = [h.snapshot.options(num_returns=2).remote() for h in ps.values()]
            m.cluster.get([nbytes for nbytes, _ in snaps], timeout=timeout_s)  # and so each payload is in the object store
            changed = m.cluster.get(changed, timeout=timeout_s)
            # What each PS had applied at the cut: partial recovery reports a dead one's.
            stats = m.cluster.get([h.stats.remote() for h in ps.values()], timeout=timeout_s)
            bags = {str(k): st.rows_updated for k, st in zip(ps, stats)}
            ids = {str(k): st.ids_updated for k, st in zip(ps, stats)}
            dense = lz.dense.state(timeout_s, get=m.cluster.get)
            cut = m.books.cut(trained)
        except (RayError, CallTimeout) as e:
            m.events.add("checkpoint_skipped", why=str(e).strip().splitlines()[0][:200])
            if self.chain is not None:
                self.chain.broken()  # some PS may have started counting afresh
            if m.publisher is not None:
                m.publisher.broken()
            return None
        finally:
            # Wait only for those that answered the pause: a frozen one would hold the loop.
            resumed = {n: workers[n].resume.remote() for n in names}
            get_alive(m.cluster, [resumed[n] for n in live], timeout_s + 1)
        pause = m.clock() - t0
        refs = [payload for _, payload in snaps]
        self._seq += 1
        ckpt = Checkpoint(self._seq, now, cut.queue, held_samples(cut.queue), cut.bad_lines, cut.steps, dense, refs, pause, extra=dict(extra or {}))
        ckpt.extra["config"] = lz.config(exclude=m.books.draining()).to_dict()
        ckpt.extra["ps_bags"], ckpt.extra["ps_ids"] = bags, ids
        ckpt.extra["vmap"] = {"table_sizes": lz.vmap.table_sizes, "num_vshards": lz.vmap.num_vshards, "owner": lz.vmap.owner.tolist(), "version": lz.vmap.version}
        if self.chain is not None:
            self.chain.add_cut(ckpt.seq, lz.vmap.table_sizes, changed)
        if m.publisher is not None:
            m.publisher.add_cut(lz.vmap.table_sizes, changed)
        with self._lock:
            self.latest = ckpt
        if self.initial is None and cut.steps == 0 and ckpt.samples == 0:
            self.initial = replace(ckpt, ps=None)
        self.taken += 1
        self.pauses.append(pause)
        m.events.add("checkpoint", seq=ckpt.seq, pause_s=round(pause, 4), samples=ckpt.samples)
        return ckpt

    def warm_writers(self) -> None:
        """Start, at launch, the Ray worker process that will write checkpoint files on
        each PS's node. Started by the first durable write instead, it imports torch (about
        2 s of CPU) during the first seconds of training: on the 2-core machine the first
        metrics window ran at 18k samples/s instead of 22k. Best effort: a failure or a
        node that does not answer in time only means the first write starts it (as after a
        master restart, where the PS's nodes are not known yet)."""
        if self.store is None:
            return
        lz = self.m.launcher
        nodes = {lz.nodes[n] for n in map(lz.ps_name, lz.ps) if n in lz.nodes}
        try:
            ready = [self.m.cluster.task(writer_ready, node=n) for n in nodes]
            self.m.cluster.get(ready, timeout=OBJECT_GET_TIMEOUT_S)
        except (RayError, CallTimeout) as e:
            self.m.events.add("checkpoint_writers_not_started", error=f"{type(e).__name__}: {str(e)[:200]}")

    def write_durable(self, ckpt: Checkpoint, now: float) -> None:
        """Write ``ckpt`` to the store on a background thread (training goes on)."""
        if self.store is None or self.chain is None:
            return
        self._last_durable_at = now
        plan, previous = self.chain.plan(ckpt.seq), self._writer

        def write() -> None:
            if previous is not None:
                previous.join()  # a delta builds on the write before it
            try:
                info, kind = self.chain.write(plan, list(ckpt.ps), ckpt.dense, ckpt.meta(), parts=functools.partial(write_where_payloads_are, self.m.cluster))
            except Exception as e:  # noqa: BLE001 - reported, the job goes on
                self._write_error = f"{type(e).__name__}: {e}"
                self.m.events.add("checkpoint_write_failed", seq=ckpt.seq, error=self._write_error[:300])
                return
            ckpt.durable_path = info.path
            if not self.spec.keep_in_memory:
                self.release(ckpt)
            row = {"seq": ckpt.seq, "path": info.path, "link": kind, "bytes": info.nbytes, "write_s": round(info.write_s, 4), "at_s": ckpt.at_s}
            self.written.append(row)
            self.m.events.add("checkpoint_durable", **row)

        self._writer = threading.Thread(target=write, name="checkpoint-writer", daemon=True)
        self._writer.start()

    def release(self, ckpt: Checkpoint | None = None) -> None:
        """Drop the newest checkpoint's PS payloads from the object store if it is on disk
        (``ckpt``: only if that one is still the newest). Its record stays; recovery
        reads the payloads from disk."""
        with self._lock:
            c = self.latest
            if c is not None and c.durable_path is not None and (ckpt is None or c is ckpt):
                c.ps = None

    def flush(self, timeout_s: float = 120.0) -> None:
        """Wait for a durable write under way."""
        if self._writer is not None:
            self._writer.join(timeout_s)

    # -- reading one back ---------------------------------------------------------------
    def payloads(self) -> tuple[Checkpoint, list[Any] | None, str]:
        """The newest checkpoint whose data can be had, its PS payloads, and where they
        came from ("memory", "durable", or "initial": nothing was durable yet and the
        in-memory cut is lost, so the job goes back to its start; payloads None, each PS
        rebuilds its seed rows). CheckpointError when there is none."""
        ckpt = self.latest
        if ckpt is not None and ckpt.ps is None:
            return self._durable_or_initial()  # released: on disk only
        if ckpt is not None and not all(map(self.m.cluster.is_ref, ckpt.ps)):
            return ckpt, list(ckpt.ps), "durable"  # loaded from disk by an earlier recovery
        if ckpt is not None:
            try:
                ready, _ = self.m.cluster.wait(list(ckpt.ps), num_returns=len(ckpt.ps), timeout=OBJECT_GET_TIMEOUT_S)
                if len(ready) == len(ckpt.ps):
                    self.m.cluster.get(list(ckpt.ps), timeout=OBJECT_GET_TIMEOUT_S)  # raises if an object is lost
                    return ckpt, list(ckpt.ps), "memory"
            except (RayError, CallTimeout) as e:
                self.m.events.add("checkpoint_lost", seq=ckpt.seq, error=str(e).strip().splitlines()[0][:200])
        return self._durable_or_initial()

    def _durable_or_initial(self) -> tuple[Checkpoint, list[Any] | None, str]:
        """The durable checkpoint, or the launch cut when none was ever written (a
        directory holding only corrupt checkpoints still raises: that is not a start)."""
        try:
            return self.load_durable()
        except CheckpointError:  # load_durable waited for a write under way first
            if self.initial is None or (self.store is not None and self.store.list()):
                raise
        with self._lock:
            self.latest = self.initial
        return self.initial, None, "initial"

    def load_durable(self) -> tuple[Checkpoint, list[Any], str]:
        if self.store is None or self.chain is None:
            raise CheckpointError("no in-memory checkpoint and no durable checkpoint directory")
        self.flush()
        chain, ps = self.chain.load()
        for msg in chain.skipped:
            self.m.events.add("checkpoint_corrupt", message=msg)
        step, meta, files = chain.step, chain.links[-1].meta, chain.links[-1].files
        ckpt = Checkpoint(
            int(meta["seq"]), float(meta["at_s"]), meta["queue"], int(meta["samples"]), int(meta["bad_lines"]),
            int(meta["steps"]), files["dense"], ps, durable_path=str(step), extra=meta.get("extra", {}),
        )
        self._seq = max(self._seq, ckpt.seq, self.store.latest_step() or 0)  # past a newer, corrupt one
        with self._lock:
            self.latest = ckpt
        return ckpt, ps, "durable"

    def summary(self) -> dict:
        return {
            "in_memory_taken": self.taken,
            "pause_s_mean": float(np.mean(self.pauses)) if self.pauses else None,
            "pause_s_max": float(np.max(self.pauses)) if self.pauses else None,
            "durable": self.written,
            "durable_interval_s": self.durable_interval_s(self.m.clock() - self.m.t0, len(self.m.failures)) if self.store else None,
            "write_error": self._write_error,
        }
