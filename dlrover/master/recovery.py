"""Failure detection and recovery: what the master does when an actor dies, hangs or
outgrows its memory.

Deaths arrive as events: a worker's ``run`` ObjectRef fails (the worker died, or it hit
a dead PS). The master also enforces liveness itself (``dlrover.master.liveness``),
because an actor can be alive to Ray and useless to the job: one whose probe or whose
shard leases go unanswered past the liveness timeout is declared hung, its process is
killed and it is handled as dead. Memory limits are enforced the way a container's
would be: an actor whose RSS goes over its limit is killed.

Handling, by what was lost:

- a worker: its leased shards go back to todo (at-least-once: the part it had pushed is
  trained again), a replacement of the same size starts;
- an embedding PS, under ``recovery.ps: partial`` (the default): only its vshards go
  back to the newest checkpoint (``dlrover.master.partial``); the other PS, the dense PS
  and the workers keep their state, and the dead PS's updates since the checkpoint are
  counted as ``updates_lost``;
- the dense PS, or any PS under ``recovery.ps: rollback``: the job rolls back to the
  newest checkpoint whose data can be had (in memory, else durable): every worker stops,
  the dead PS are replaced, every PS and the dense PS load the checkpoint, the shard
  queue goes back to the checkpoint's cut, and the shards completed since are trained
  again (``samples_replayed``). Nothing the checkpoint does not hold is counted as
  trained, so nothing is lost;
- with ``checkpoint.on_failure: restart`` (the baseline): every failure restarts every
  actor from the last durable checkpoint, as a job without live recovery would.

Each failure is recorded with its kind, actor, node, injection/detection/recovery times
and cause class (``dlrover.metrics.reliability``). Nodes whose actors keep failing or
straggling are avoided for new actors (bad-node detection).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dlrover.faults.policy import Decision, Fail, FailurePolicy, RecoverPs, RestartAll
from dlrover.faults.records import Failure, FailureKind, LostPs
from dlrover.ids import ProcessInfo, Role
from dlrover.master.cluster import ActorDied, CallTimeout, RayError, TaskFailed
from dlrover.master.liveness import SUSPECT_AFTER_S, Prober, liveness_timeout_s
from dlrover.master.partial import recover_partially
from dlrover.master.replace import remove_worker, replacement_size
from dlrover.master.rollback import Rollback, roll_back
from dlrover.master.states import JobFailed
from dlrover.resource.plan import CorrectionKind, ResourcePlan

from dlrover.master.job import Job


MASTER_GAP_S = 2.0  # a gap this long (and half the timeout) between the master's ticks renews every lease
ABORT_TIMEOUT_S = 30.0
COUNT_TIMEOUT_S = 600.0  # reading back the lines a partial recovery lost
BAD_NODE_STRIKES = 2  # failures or stragglers on one node before new actors avoid it


def cause_of(err: Exception | str | None) -> str:
    """One line saying what went wrong: for an exception raised inside an actor's method
    (a RayTaskError, whose first line only names the method) the exception itself."""
    inner = getattr(err, "cause", None) if isinstance(err, TaskFailed) else None
    text = f"{type(inner).__name__}: {inner}" if isinstance(inner, BaseException) else str(err or "")
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""


class Recovery:
    def __init__(self, master: Job, policy: FailurePolicy) -> None:
        """``policy``: what each failure costs (replace, recover a PS, restart, fail)."""
        self.m = master
        self.policy = policy
        self._restart_for: list[Failure] = []  # failures whose decision was RestartAll, for ``restart``
        self.prober = Prober(master.cluster)
        self.processes: dict[str, ProcessInfo] = {}  # actor -> its process, once a probe answered
        self._last_tick = float("inf")
        self.injected: dict[str, float] = {}  # actor -> job time a fault was injected (chaos)
        self.fatal: Failure | None = None  # the failure past checkpoint.max_failures
        self.injected_kind: dict[str, FailureKind] = {}  # actor -> kind, when the fault's source says better (node loss, hang)
        self.oom_killed: dict[str, float] = {}  # actor -> job time the master killed it
        self.strikes: Counter = Counter()  # node -> failures + stragglers
        self.samples_replayed = 0
        self.rollbacks = 0
        self.partial_recoveries = 0
        self._counting: list[tuple[Failure, Any]] = []  # partial recoveries' updates_lost, being counted
        self._awaiting: dict[str, list[Failure]] = {}  # worker -> failures its first step ends
        self._stepped: dict[str, float] = {}  # worker -> job time of its latest run's first step

    def now(self) -> float:
        return self.m.clock() - self.m.t0

    # -- detection ----------------------------------------------------------------------
    def timeout_s(self) -> float:
        """The liveness timeout: the spec's, or sized for the workers' step times."""
        steps = [r.step_time_s for r in self.m.books.worker_reports().values() if r.step_time_s]
        return liveness_timeout_s(self.m.spec.train.liveness_timeout_s, steps, self.m.spec.train.log_every_s)

    def suspects(self) -> list[str]:
        """Workers not heard from for a while: a pause (checkpoint, switch) must not wait
        on them. Only workers: a pause parks workers, and a busy PS (one call at a time)
        may well answer late without anything being wrong."""
        after = max(SUSPECT_AFTER_S, self.timeout_s() / 4)
        workers = self.m.launcher.workers
        return [n for n in self.prober.suspects(self.now(), after, up=self.m.books.running()) if n in workers]

    def tick(self) -> LostPs:
        """Probes, lease expiry and memory limits: kills what they find hung or over its
        memory, and returns the PS found lost (the Recovering state replaces them)."""
        now = self.now()
        lz = self.m.launcher
        timeout = self.timeout_s()
        if now - self._last_tick > max(MASTER_GAP_S, timeout / 2):
            self.m.books.renew_leases(list(lz.workers))  # the master was busy elsewhere: its blind time counts against nobody
        self._last_tick = now
        self._enforce_memory(now)
        targets = {lz.ps_name(k): h.ping.remote for k, h in lz.ps.items()}
        targets.update({n: h.ping.remote for n, h in lz.workers.items()})
        targets.update({n: h.ping.remote for n, h in lz.dense.by_name().items()})
        found = self.prober.poll(now, timeout, targets, up=self.m.books.running())
        for name, info in found.replies.items():  # every probe answers a ProcessInfo
            self.processes[name] = info
            lz.nodes[name] = info.node_id
        hung = {n: since for n, since in found.silent.items()}
        for name, since in self.m.books.expired_leases(timeout, self.m.t0).items():
            if name in lz.workers and name not in hung:
                hung[name] = since
                self.m.events.add("lease_expired", actor=name, after_s=round(timeout, 1))
        for name, since in hung.items():
            if name not in found.dead:
                self.m.events.add("hung", actor=name, silent_s=round(now - since, 1), timeout_s=round(timeout, 1))
            self.kill_hung(name, since)
        return self._lost_ps([*hung, *found.dead])

    def _lost_ps(self, names: list[str]) -> LostPs:
        """The PS of the job among ``names``: a late answer about one already replaced
        (a probe sent before a recovery) names no PS of the job any more."""
        lz = self.m.launcher
        ids = [a for a in map(lz.id_of, names) if a is not None]
        ps = {a.index for a in ids if a.role is Role.PS and a.index in lz.ps}
        return LostPs(tuple(sorted(ps)), any(n in lz.dense_names for n in names))

    def kill_hung(self, name: str, since: float) -> None:
        """Declare ``name`` hung since job time ``since`` and kill its process for real; a
        worker's death then reaches the master through its ``run`` like any other."""
        lz = self.m.launcher
        if name in lz.workers:
            self.injected.setdefault(name, since)
            self.injected_kind.setdefault(name, FailureKind.WORKER_HANG)
        handle = lz.handle(name)
        if handle is not None:
            self._kill(handle)
        info = self.processes.pop(name, None)
        if info is not None:
            self.m.cluster.kill_process(info.node_id, info.pid)
        self.prober.forget(name)

    def _enforce_memory(self, now: float) -> None:
        if not self.m.spec.resources.enforce_memory:
            return
        lz = self.m.launcher
        rss = {n: r.rss_mb for n, r in self.m.books.worker_reports().items() if n in lz.workers}
        if self.m.control is not None:
            rss.update({a.name: a.rss_mb for a in self.m.control.stats.ps().values()})
        for name, mb in rss.items():
            limit = lz.resources.get(name, (0, 0))[1]
            if limit and mb > limit and name not in self.oom_killed:
                self.oom_killed[name] = now
                self.m.events.add("oom_kill", actor=name, rss_mb=round(mb, 1), limit_mb=limit)
                handle = lz.handle(name)
                if handle is not None:
                    self._kill(handle)

    def _kill(self, handle: Any) -> None:
        try:
            self.m.cluster.kill(handle)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def dead_ps_now(self, timeout_s: float = 10.0) -> LostPs:
        """Ask every PS and the dense PS now (a worker's run failed on a remote call)."""
        lz = self.m.launcher
        items = [(lz.ps_name(k), h.stats.remote()) for k, h in lz.ps.items()] + [(n, h.ping.remote()) for n, h in lz.dense.by_name().items()]
        dead = []
        for name, ref in items:
            try:
                self.m.cluster.get(ref, timeout=timeout_s)
            except (ActorDied, CallTimeout):
                dead.append(name)
        return self._lost_ps(dead)

    # -- handling -----------------------------------------------------------------------
    def expect_failure(self, actor: str, at_s: float, kind: FailureKind | None = None) -> None:
        """A fault is being injected into ``actor`` now: its failure happened at ``at_s``
        (and is a ``kind``, when the fault says better than what Ray will report)."""
        self.injected[actor] = at_s
        if kind is not None:
            self.injected_kind[actor] = kind

    def new_failure(self, kind: FailureKind, actor: str, err: Exception | str | None, detected: float) -> Failure:
        """A failure of ``actor`` detected now. Its kind is the master's own (an OOM kill,
        a hang), the injected fault's, a lost node's (Ray says the actor's node is dead
        or was preempted), else ``kind``."""
        kind = self.injected_kind.pop(actor, kind)
        at = self.injected.pop(actor, None)
        if at is None:
            at = self.oom_killed.get(actor, detected)
        node = self.m.launcher.nodes.get(actor)
        if actor in self.oom_killed:
            kind = FailureKind.OOM_KILL
        elif getattr(err, "preempted", False) or (kind != FailureKind.WORKER_HANG and node is not None and node not in self.m.cluster.alive_nodes()):
            kind = FailureKind.NODE_LOSS
        return Failure(kind, actor, round(min(at, detected), 3), round(detected, 3), cause=cause_of(err), node=node)

    def record(self, failure: Failure, resumes: list[str] | None = None, strike: bool = True) -> None:
        """Add a failure. ``resumes``: workers whose first step means training goes on again
        (``recovered_s``); without, it counts as recovered now. ``strike``: count it against
        its node (False: the caller did, before placing a replacement)."""
        failure.handled_s = round(self.now(), 3)
        failure.recovered_s = None if resumes else failure.handled_s
        for w in resumes or []:
            self._awaiting.setdefault(w, []).append(failure)
        self.m.failures.append(failure)
        self.m.events.add("failure", **{("failure_kind" if k == "kind" else k): v for k, v in failure.to_dict().items()})
        for w in resumes or []:  # a run started before this record may have stepped already
            if self._stepped.get(w, float("-inf")) >= failure.detected_s:
                self._recovered(w, self._stepped[w])
        if failure.node and strike:
            self.note_bad(failure.node)
        fail = self.policy.after(len(self.m.failures), f"{failure.kind.value} of {failure.actor}: {failure.cause}")
        if fail is not None:
            self.m.books.stop()
            self.fatal, failure.recovered_s = failure, None  # the job never trains again after it
            raise JobFailed(fail.reason)

    def corrected(self, plan: ResourcePlan, new_workers: list[str], t0: float, slow_since: dict[str, float]) -> None:
        """A straggler replaced, or memory raised before an OOM kill (``plan.corrections``,
        carried out at job time ``t0``): recorded as failures handled before they hurt
        (at: slow since / the plan; detected: the plan)."""
        for fix in plan.corrections:
            memory = fix.kind == CorrectionKind.MEMORY_PRESSURE
            f = self.new_failure(FailureKind.MEMORY_PRESSURE if memory else FailureKind.STRAGGLER, fix.actor, plan.reason, t0)
            f.at_s = round(min(slow_since.get(fix.actor, t0), t0), 3)
            f.replacement = new_workers[0] if new_workers else None
            # a straggler's slowness costs its share of the job; memory raised in time, nothing
            f.capacity_lost = 0.0 if memory else round(1.0 / max(len(self.m.launcher.workers), 1), 4)
            self.record(f)

    def first_step(self, worker: str) -> None:
        """A worker trained its first step of a run: failures waiting on it are recovered."""
        now = round(self.now(), 3)
        self._stepped[worker] = now
        self._recovered(worker, now)

    def _recovered(self, worker: str, now: float) -> None:
        for f in self._awaiting.pop(worker, []):
            if f.recovered_s is None:
                f.recovered_s = now
                self.m.events.add("recovered", actor=f.actor, failure_kind=f.kind.value, after_s=round(now - f.at_s, 3))

    def finish(self) -> None:
        """End of job: a failure whose replacement never trained counts as recovered when
        handled; the counts of updates lost are collected."""
        for f in self.m.failures:
            if f.recovered_s is None and f is not self.fatal:
                f.recovered_s = f.handled_s
        self._awaiting.clear()
        for f, ref in self._counting:
            try:
                f.updates_lost = int(self.m.cluster.get(ref, timeout=COUNT_TIMEOUT_S))
            except RayError:  # the PS counting them died (a job past its failure limit)
                pass
        self._counting.clear()

    def note_bad(self, node: str) -> None:
        """One strike against a node; at ``BAD_NODE_STRIKES`` new actors avoid it."""
        self.strikes[node] += 1
        if self.strikes[node] >= BAD_NODE_STRIKES and node not in self.m.launcher.avoid:
            self.m.launcher.avoid.add(node)
            self.m.events.add("bad_node", node=node, strikes=self.strikes[node])

    def worker_failed(self, name: str, err: Exception) -> Decision:
        """A worker died: requeue its shards and start a replacement, or leave the
        failure to ``restart``, as the policy decides."""
        detected = self.now()
        failure = self.new_failure(FailureKind.WORKER_DEATH, name, err, detected)
        decision = self.policy.worker_lost((name,))
        if isinstance(decision, RestartAll):
            self._restart_for.append(failure)
            return decision
        m, lz = self.m, self.m.launcher
        drained = name in m.books.draining()
        requeued = m.books.retire(name)
        size = replacement_size(m, name, (None, None))
        remove_worker(m, name)
        failure.shards_requeued = len(requeued)
        failure.capacity_lost = round(1.0 / max(len(lz.workers) + 1, 1), 4)  # the others train on
        resumes = None
        if failure.node:  # struck before the replacement is placed: a bad node gets no replacement
            self.note_bad(failure.node)
        past_limit = self.policy.after(len(m.failures) + 1, "") is not None  # the job ends: nothing to replace
        if not m.books.queue.finished and not drained and not past_limit:
            new = lz.add_worker(*size)
            failure.replacement = new
            m.runs.add({lz.start(new): new})
            resumes = [new]
        self.record(failure, resumes, strike=False)
        return decision

    def ps_failed(self, lost: LostPs, how: str) -> Decision:
        """PS lost: replaced as the policy decides (only their vshards back to the
        checkpoint, a rollback of the whole job, or left to ``restart``)."""
        lz = self.m.launcher
        detected = self.now()
        names = [lz.ps_name(k) for k in lost.ps] + (list(lz.dense_names) if lost.dense else [])
        failures = [self.new_failure(FailureKind.PS_DEATH, n, f"{n} unreachable ({how})", detected) for n in names]
        decision = self.policy.ps_lost(lost)
        if isinstance(decision, Fail):  # recorded, never recovered: the job ends with it
            for f in failures:
                self.record(f)
                f.recovered_s = None
            self.fatal = failures[-1]
            self.m.books.stop()
            raise JobFailed(decision.reason)
        if isinstance(decision, RestartAll):
            self._restart_for += failures
            return decision
        if decision.partial:
            part = recover_partially(self.m, lost)
            if part is not None:
                self.partial_recoveries += 1
                for f in failures:
                    part.apply_to(f)
                    self._counting.append((f, part.lost))
                    self.record(f, self.m.runs.workers())
                return decision
        back = self.rollback(lost)
        for f in failures:
            back.apply_to(f)
            self.record(f, self.m.runs.workers())
        return RecoverPs(lost, partial=False)

    def rollback(self, lost: LostPs, replace_all: bool = False) -> Rollback:
        """Roll the whole job back to the newest usable checkpoint (see module doc)."""
        back = roll_back(self.m, lost, replace_all)
        self.samples_replayed += back.samples_replayed
        self.rollbacks += 1
        return back

    def restart(self) -> None:
        """The policy's RestartAll: every actor restarts from the last durable checkpoint."""
        m, failures, self._restart_for = self.m, self._restart_for, []
        for f in failures:
            m.books.retire(f.actor)  # its late calls must not count
        m.checkpointer.latest = None  # only what is on disk survives a whole-job restart
        back = self.rollback(LostPs(), replace_all=True)
        for f in failures:
            back.apply_to(f)
            self.record(f, self.m.runs.workers())

