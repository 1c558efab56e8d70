"""Node drains: a node about to go away (a spot reclaim, a Kubernetes eviction, an
operator's ``dlrover drain``) has the job's actors moved off it before its deadline.

Ray keeps the list of nodes being drained (``ray drain-node``, the autoscaler, or
``dlrover drain``, which asks Ray the same way); the master reads it every tick. For each
new one it carries out (Ray itself places nothing new there) a replacement through the same
live rescale a policy's plan takes: new workers and PS start elsewhere, the drained PS's
vshards are copied over while training goes on and switched in one short pause, the
drained workers get no more shards. Nothing rolls back and no update is lost. A drained
worker still holding shards near the deadline is parked (its progress reported) and
stopped; its shards resume elsewhere exactly where it stopped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from dlrover.master.cluster import RayError
from dlrover.master.job import Job
from dlrover.master.replace import remove_worker

EVICT_MARGIN_S = 15.0  # drained workers still there this long before the deadline are stopped
NOTICE_GRACE_S = 30.0  # a SIGTERMed actor's time before its kill (Kubernetes' default grace period)
PARK_TIMEOUT_S = 5.0
RETRY_S = 10.0  # a replacement that failed (cluster full?) is tried again after this


@dataclass
class DrainOrder:
    node: str
    asked_s: float  # job time Ray's drain was seen
    deadline_s: float | None  # job time the node goes away


class NodeDrains:
    def __init__(self, job: Job, draining: Callable[[], dict[str, float | None]] | None = None, wall: Callable[[], float] | None = None) -> None:
        """``draining``: the nodes being drained with their deadlines in Unix seconds;
        ``wall``: the Unix clock (the deadlines' clock). Default: the job's cluster's."""
        import time

        self.m = job
        self._draining = draining or job.cluster.draining_nodes
        self._wall = wall or time.time
        self.orders: dict[str, DrainOrder] = {}
        self.noticed: dict[str, float] = {}  # actor that got SIGTERM -> job time of its deadline
        self._lock = threading.Lock()  # preempted() comes on a worker's call thread
        self._next_try_s = 0.0

    def preempted(self, actor: str) -> None:
        """``actor`` got SIGTERM: move it off within ``NOTICE_GRACE_S``."""
        with self._lock:
            self.noticed.setdefault(actor, self.m.clock() - self.m.t0 + NOTICE_GRACE_S)

    def tick(self) -> dict[Any, str]:
        """Take note of new drains, start moving actors off drained nodes, stop drained
        workers near the deadline; returns the runs of workers it started."""
        self._take_new()
        now, draining = self.m.clock() - self.m.t0, self.m.books.draining()
        with self._lock:
            noticed = dict(self.noticed)
        lz = self.m.launcher
        moving = {a: d for a, d in noticed.items() if lz.handle(a) is not None}  # SIGTERMed, still here
        why = {a: f"{a} got SIGTERM" for a in moving}
        for order in self.orders.values():
            for a in self._on(order.node):
                moving[a], why[a] = order.deadline_s, f"node {order.node[:12]} is being drained"
        to_move = [a for a in moving if a not in draining]  # drained workers are on their way out
        started: dict[Any, str] = {}
        if to_move and not self.m.control.busy() and now >= self._next_try_s:
            self._next_try_s = now + RETRY_S
            started.update(self.m.control.replace_now(to_move, ", ".join(sorted({why[a] for a in to_move}))))
        late = [a for a, d in moving.items() if a in draining and d is not None and now > d - EVICT_MARGIN_S]
        if late:
            self._evict(late)
        return started

    def _take_new(self) -> None:
        try:
            nodes = self._draining()
        except Exception as e:  # noqa: BLE001 - a GCS hiccup: ask again next tick
            self.m.events.add("drain_poll_error", error=f"{type(e).__name__}: {e}"[:200])
            return
        now = self.m.clock() - self.m.t0
        for node, deadline in nodes.items():
            if node in self.orders:
                continue
            left = None if deadline is None else deadline - self._wall()
            # Ray places nothing new on a draining node: the replacements go elsewhere.
            self.orders[node] = DrainOrder(node, now, None if left is None else now + left)
            self.m.events.add("node_drain", node=node, deadline_in_s=None if left is None else round(left, 1), actors=self._on(node))

    def _on(self, node: str) -> list[str]:
        """The job's workers and PS on ``node``."""
        lz = self.m.launcher
        return [n for n, nd in list(lz.nodes.items()) if nd == node and lz.handle(n) is not None and n not in lz.dense_names]

    def _evict(self, workers: list[str]) -> None:
        """Park these drained workers (each reports how far it applied its shards), then
        stop them: their shards go back from there."""
        lz = self.m.launcher
        refs = {w: lz.workers[w].pause.remote(PARK_TIMEOUT_S) for w in workers}
        ready, _ = self.m.cluster.wait(list(refs.values()), num_returns=len(refs), timeout=PARK_TIMEOUT_S + 1)
        for w in workers:
            self.m.runs.drop({w})  # its end is not a failure
            try:
                parked = refs[w] in ready and self.m.cluster.get(refs[w]) is True
            except RayError:
                parked = False
            requeued = self.m.books.retire(w, parked=parked)
            remove_worker(self.m, w)
            self.m.events.add("drain_evicted", actor=w, shards_requeued=len(requeued))
