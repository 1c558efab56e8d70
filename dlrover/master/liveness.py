"""Liveness: every worker, PS and the dense PS is probed on the clock, and every shard
lease expires unless its owner shows progress.

Two ways an actor can be alive to Ray and useless to the job, and one check for each:

- its process does not answer (frozen with SIGSTOP, stuck in the kernel, on a node that
  is gone but not yet declared dead): a probe (a cheap method call; on an actor with
  one thread it waits behind the call under way) stays unanswered past the liveness timeout;
- its process answers but its training makes no progress (a deadlock in the loop, a
  hung filesystem read): its shard leases are not renewed (by reports and completed
  shards) within the timeout (:meth:`dlrover.data.shards.ShardQueue.expired`).

Either way the actor is declared hung: its process is killed for real (Ray's kill
alone leaves a stopped process holding its resources for a while) and the master's
usual death handling takes over. Time the master itself spent blocked does not count
against anyone: after a gap in its own ticks the leases are renewed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dlrover.master.cluster import ActorDied, Cluster, RayError

PROBE_EVERY_S = 1.0
SUSPECT_AFTER_S = 2.5  # not heard from this long (at least): no checkpoint or rescale pause waits on it
LIVENESS_FLOOR_S = 30.0  # the automatic timeout is never shorter
STEP_MULTIPLE = 20.0  # ... nor shorter than this many of the slowest worker's steps
REPORT_MULTIPLE = 5.0  # ... nor than this many report periods (a lease is renewed by reports)


def liveness_timeout_s(configured: float | None, step_times_s: list[float], log_every_s: float) -> float:
    """The spec's ``train.liveness_timeout_s``, or one sized for the job's step time."""
    if configured is not None:
        return float(configured)
    slowest = max(step_times_s, default=0.0)
    return max(LIVENESS_FLOOR_S, STEP_MULTIPLE * slowest, REPORT_MULTIPLE * log_every_s)


@dataclass
class ProbeResults:
    """What one round of probe checks found."""

    replies: dict[str, Any] = field(default_factory=dict)  # actor -> its probe's answer
    dead: list[str] = field(default_factory=list)  # Ray says the actor died
    silent: dict[str, float] = field(default_factory=dict)  # actor -> job time its unanswered probe was sent


class Prober:
    """Keeps one probe in flight per actor; reports answers, deaths and silences.

    ``targets`` maps an actor's name to a zero-argument callable issuing its probe (an
    ObjectRef). An actor that answered before (or is known to run) and whose probe is
    now older than ``timeout_s`` is reported silent once (its probe is dropped, so a later round probes
    it afresh if it is kept). An actor still starting (no answer yet) is never silent:
    start-up is bounded elsewhere (the launch timeouts), and takes long on a busy host.
    """

    def __init__(self, cluster: Cluster, every_s: float = PROBE_EVERY_S) -> None:
        self.cluster = cluster
        self.every_s = every_s
        self._in_flight: dict[str, tuple[Any, float]] = {}
        self._heard: dict[str, float] = {}  # actor -> job time of its last answer
        self._next = 0.0

    def poll(self, now: float, timeout_s: float, targets: dict[str, Callable[[], Any]], up: set[str] | frozenset = frozenset()) -> ProbeResults:
        """``up``: actors known to run (a worker that trained a step) even if no probe of
        theirs was answered yet."""
        out = ProbeResults()
        for name in [n for n in self._in_flight if n not in targets]:
            self.forget(name)  # gone from the job meanwhile
        for name, (ref, issued) in list(self._in_flight.items()):
            done, _ = self.cluster.wait([ref], timeout=0)
            if not done:
                if (name in self._heard or name in up) and now - issued > timeout_s:  # up, silent since
                    del self._in_flight[name]
                    out.silent[name] = issued
                continue
            del self._in_flight[name]
            self._heard[name] = now
            try:
                out.replies[name] = self.cluster.get(ref)
            except ActorDied:
                out.dead.append(name)
            except RayError:
                pass  # the call failed, the actor lives: ask again next round
        if now >= self._next:
            self._next = now + self.every_s
            for name, issue in targets.items():
                if name not in self._in_flight:
                    self._in_flight[name] = (issue(), now)
        return out

    def suspects(self, now: float, after_s: float = SUSPECT_AFTER_S, up: set[str] | frozenset = frozenset()) -> list[str]:
        """Actors not heard from for ``after_s`` (probes go out every second; ``up``: known
        to run, heard or not): not declared hung yet, but no pause (checkpoint, migration)
        should wait on them."""
        quiet = [n for n, heard in self._heard.items() if now - heard > after_s]
        never = [n for n, (_, issued) in self._in_flight.items() if n in up and n not in self._heard and now - issued > after_s]
        return quiet + never

    def forget(self, name: str) -> None:
        self._in_flight.pop(name, None)
        self._heard.pop(name, None)
