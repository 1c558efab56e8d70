"""A JobMaster on a :class:`~fake_cluster.FakeCluster`: the real master, books, states,
recovery, checkpoints, summary and export, with the real embedding and dense PS objects
in this process and workers that train no model. A fake worker's ``run`` takes shards
from the master and marks them done at once (a test holds it open to keep it
"training"); its evaluation scores every row 0.5.

Nothing here starts Ray: the tests that use it run under ``pytest -m "not ray"``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fake_cluster import OPEN, FakeCluster, FakeHandle
from dlrover.ids import ProcessInfo
from dlrover.ps.dense_ps import DenseParamServer
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.ps_stats import PsStats
from dlrover.worker.window import RunResult, WorkerReport
from dlrover.worker.worker import Worker


def report(samples: int, rss_mb: float = 100.0) -> WorkerReport:
    return WorkerReport(
        samples=samples, steps=1, samples_per_s=1000.0, loss=0.5, step_time_s=0.01, wait_ps_s=0.0, pull_s=0.0, push_s=0.0,
        queue_depth=1, rss_mb=rss_mb, cpu_percent=50.0, node_id="node-0", step_median_s=0.01, pull_ahead=0,
    )  # fmt: skip


class FakeWorker:
    """What the master calls on a worker (``dlrover.worker.worker.Worker``)."""

    def __init__(self, cluster: FakeCluster, name: str, spec: Any, master: FakeHandle, *rest: Any) -> None:
        self.cluster, self.name, self.master = cluster, name, master
        self.pid = 10_000 + len(cluster.actors)
        self.shards_done: list[int] = []
        self.leased: list[int] = []  # shards taken and never finished (a stalled worker's)
        self.aborted = self.stalled = False
        self.generation = self.samples = 0

    def run(self, generation: int = 0) -> Any:
        """Train what the master gives at once; with nothing to take now the run stays
        open and trains more at the cluster's next wait (:meth:`poke`)."""
        self.generation, self.aborted, self.samples, self.stalled = generation, False, 0, False
        self.master.sync("first_step", self.name)
        out = self.train()
        return OPEN if out is None else out

    def train(self) -> dict | None:
        """Shards until the master says stop (the run's stats), or None: nothing to
        take now (or stalled: a worker named in the cluster's ``stall`` leases that many
        shards, then trains no more)."""
        books, stall = self.master.obj.books, self.cluster.stall.get(self.name)
        while not self.aborted:
            if self.idle(books):
                return None
            shard = self.master.sync("next_shard", self.name, self.generation)
            if shard is None:
                return None
            if shard == "stop":
                break
            if stall is not None:
                self.leased.append(shard.shard_id)
                if len(self.leased) >= stall:
                    self.stalled = True
                    return None
                continue
            self.took(shard)
            rows = shard.stop - shard.start
            self.samples += rows
            self.master.sync("report", self.name, report(self.samples, self.reported_rss_mb()))
            self.master.sync("shard_done", self.name, shard.shard_id, rows, 0, self.generation)
            self.shards_done.append(shard.shard_id)
        return RunResult(self.generation, aborted=True) if self.aborted else RunResult(self.generation, steps=len(self.shards_done), samples=self.samples)

    def idle(self, books: Any) -> bool:
        """Nothing to take now: asking would block the master's thread in the long poll."""
        q = books.queue
        stop = q.finished or books.stop_requested or self.generation != books.generation or self.name in books.draining()
        return q.todo_count == 0 and not stop

    def took(self, shard: Any) -> None:
        """A shard taken, about to be trained (a subclass's hook)."""

    def reported_rss_mb(self) -> float:
        return 100.0

    def open_run(self) -> Any:
        runs = [r for r in self.handle.open if not r.ready and r.method == "run"]
        return runs[-1] if runs else None

    def poke(self) -> None:
        """Time passed: an open, unstalled run trains what it can take now."""
        ref = self.open_run()
        if ref is not None and not self.stalled and not self.handle.dead:
            out = self.train()
            if out is not None:
                ref.resolve(out)

    def abort(self) -> None:
        self.aborted = True
        ref = self.open_run()
        if ref is not None:
            ref.resolve(RunResult(self.generation, aborted=True))

    def ping(self) -> ProcessInfo:
        return ProcessInfo(self.pid, "node-0")

    def pause(self, timeout_s: float) -> bool:
        return True

    def resume(self) -> None: ...

    def trained(self) -> dict:
        return {}

    def set_routing(self, *args: Any) -> None: ...

    def set_chaos(self, **kwargs: Any) -> None: ...

    def evaluate(self, ranges: list[tuple[str, int, int]]) -> dict:
        n = sum(b - a for _, a, b in ranges)
        labels = (np.arange(n) % 2).astype(np.float32)
        return {"labels": labels, "logits": np.where(labels > 0, 1.0, -1.0).astype(np.float32), "oracle": None}


class InProcessEmbeddingPS(EmbeddingPS):
    """The real embedding PS, on the fake cluster's node with a memory of its own. Measured
    here, both would be the test process's: a Ray node id when an earlier test of the
    process started Ray (a node the fake does not have: the PS's loss would read as a
    node loss), and an RSS that grows over a session past any PS's limit."""

    rss_mb = 64.0
    node = "node-0"

    def ping(self) -> ProcessInfo:
        return ProcessInfo(os.getpid(), self.node)

    def stats(self) -> PsStats:
        return replace(super().stats(), rss_mb=self.rss_mb, node_id=self.node)


class FakeDensePS(DenseParamServer):
    """The real dense PS, answering its probes without a Ray runtime."""

    def ping(self) -> ProcessInfo:
        return ProcessInfo(os.getpid(), "node-0")

    def node_id(self) -> str:
        return "node-0"


class FakeJobCluster(FakeCluster):
    """A fake cluster whose workers are :class:`FakeWorker`; ``stall``: worker name ->
    shards it leases before it stalls."""

    def __init__(self) -> None:
        super().__init__()
        self.stall: dict[str, int] = {}

    def actor(self, cls: type, *args: Any, **options: Any) -> FakeHandle:
        handle = super().actor(cls, *args, **options)
        if isinstance(handle.obj, FakeWorker):
            handle.obj.handle = handle
        return handle

    def waiting(self) -> None:
        for h in self.alive(Worker):
            h.obj.poke()


def fake_cluster() -> FakeJobCluster:
    cluster = FakeJobCluster()
    cluster.make = {Worker: lambda *args: FakeWorker(cluster, *args), DenseParamServer: FakeDensePS, EmbeddingPS: InProcessEmbeddingPS}
    return cluster


def fake_master(spec: Any, run_dir: Path, cluster: FakeJobCluster | None = None) -> tuple[Any, FakeJobCluster]:
    """A JobMaster of ``spec`` on a fake cluster (its own handle is the cluster's master)."""
    from dlrover.data.plan import DataPlan
    from dlrover.driver.runner import resolve_policy
    from dlrover.master.master import JobMaster

    cluster = cluster or fake_cluster()
    spec, policy = resolve_policy(spec)
    clock = FakeClock()
    master = JobMaster("fake-job", spec, DataPlan.build(spec), policy, clock=clock, run_dir=str(run_dir), cluster=cluster)
    cluster.master = FakeHandle(cluster, master, {"name": "fake-job/master"})
    cluster.clock = clock
    return master, cluster


def event_rows(master: Any) -> list[dict]:
    """The master's event log as its ``events.jsonl`` rows."""
    return [e.to_json() for e in master.events.rows()]


class FakeClock:
    """Job time that moves only when a test (or the master's own wait) moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 0.001  # every reading is a little later: durations stay positive
        return self.now
