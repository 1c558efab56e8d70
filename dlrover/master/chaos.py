"""Fault injection: the spec's ``chaos:`` events, fired on the chaos clock.

Chaos times count from the first launch (faults land in training whatever start-up took)
and survive a master restart: what fired before stays fired, and the clock goes on from
where it was (``fired`` and ``chaos_s`` are persisted with the master's state). The
master learns the kind of each injected fault here, so a failure it causes is recorded
as what it is (a node loss, not an unexplained death).
"""

from __future__ import annotations

from typing import Any

from dlrover.faults.records import FailureKind
from dlrover.spec import ChaosEvent

from dlrover.master.job import Job



class ChaosInjector:
    def __init__(self, master: Job, events: list[ChaosEvent], fired: list[dict] | None = None) -> None:
        self.m = master
        self.fired: list[dict] = list(fired or [])
        self._due = sorted(events, key=lambda e: e.at_s)[len(self.fired) :]
        self._t0: float | None = None

    def now(self) -> float:
        return self.m.clock() - self.m.t0

    def start(self, chaos_s: float = 0.0) -> None:
        """The actors first run (or run again after a master restart, ``chaos_s`` on)."""
        if self._t0 is None:
            self._t0 = self.now() - chaos_s

    def chaos_s(self) -> float:
        """Seconds on the chaos clock (since the first launch, minus master downtime)."""
        return self.now() - self._t0 if self._t0 is not None else 0.0

    def tick(self) -> None:
        """Fire the events that are due."""
        now = self.chaos_s()
        while self._due and self._due[0].at_s <= now:
            ev = self._due.pop(0)
            role, i = ev.role_index()
            if role == "master":
                self._fired(ev, now, self.m.job_id + "/master")
                self.m.crash()
            elif role == "node":
                self._kill_node(ev, i, now)
            else:
                self._hit(ev, role, i, now)

    def _hit(self, ev: ChaosEvent, role: str, i: int, now: float) -> None:
        lz = self.m.launcher
        if role == "worker":  # the i-th running worker, in the order they joined the job
            draining = self.m.books.draining()
            actors = [(n, h) for n, h in lz.workers.items() if n not in draining]
        else:
            actors = [(lz.ps_name(k), lz.ps[k]) for k in sorted(lz.ps)]
        if i >= len(actors):
            self.m.events.add("chaos_skipped", action=ev.action, target=ev.target, why=f"only {len(actors)} {role}s")
            return
        name, handle = actors[i]
        if ev.action == "latency":  # a link: every worker, now and later, gets this PS's answers late
            ps_id = sorted(lz.ps)[i]
            lz.latency_ms[ps_id] = ev.ms
            for h in lz.workers.values():
                h.set_chaos.remote(latency_ms={ps_id: ev.ms})
        elif ev.action == "kill":
            self.m.recovery.expect_failure(name, self.now())
            self.m.cluster.kill(handle)
        elif ev.action == "slow":
            handle.set_chaos.remote(slowdown=ev.factor)
        elif ev.action == "delay":
            handle.set_chaos.remote(delay_ms=ev.ms)
        else:
            handle.set_chaos.remote(leak_mb_per_s=ev.mb_per_s)
        self._fired(ev, now, name)

    def _kill_node(self, ev: ChaosEvent, i: int, now: float) -> None:
        """``node:i``: every worker and PS of the job on the i-th node dies at once."""
        lz = self.m.launcher
        nodes = sorted(self.m.cluster.alive_nodes())
        if i >= len(nodes):
            self.m.events.add("chaos_skipped", action=ev.action, target=ev.target, why=f"only {len(nodes)} nodes")
            return
        node = nodes[i]
        victims = [n for n, nd in lz.nodes.items() if nd == node and lz.handle(n) is not None]
        for name in victims:
            self.m.recovery.expect_failure(name, self.now(), FailureKind.NODE_LOSS)
            self.m.cluster.kill(lz.handle(name))
        self._fired(ev, now, f"node {node[:12]}", actors=victims)

    def _fired(self, ev: ChaosEvent, now: float, actor: str, **more: Any) -> None:
        fired = {"at_s": round(now, 3), "job_s": round(self.now(), 3), "action": ev.action, "target": ev.target, "actor": actor, **more}
        if ev.action == "slow":
            fired["factor"] = ev.factor
        if ev.action == "leak":
            fired["mb_per_s"] = ev.mb_per_s
        if ev.action in ("delay", "latency"):
            fired["ms"] = ev.ms
        self.fired.append(fired)
        self.m.events.add("chaos", **fired)
