"""Failures of simulated jobs: node losses and repairs, slow nodes, OOM kills.

A mixin of :class:`dlrover.sim.engine.Simulator`. Recovery is the live platform's: the
same failure policy (:class:`dlrover.faults.policy.FailurePolicy`, from ``SimSettings``
and each job's ``max_failures``) decides. A lost PS rolls the job back to its last
checkpoint (the driver's window and actor samples start over, as
``Controller.after_rollback``) unless it is recovered partially (then the trained samples
stay); ``restart`` rolls everything back for any failure; lost workers are replaced while
the others train on; an actor over its memory limit comes back with the memory the
driver gives it (``PolicyDriver.memory_after_oom``); a job fails after more than
``max_failures`` failures.
"""

from __future__ import annotations

from dlrover.faults.policy import FailurePolicy, RecoverPs, RestartAll
from dlrover.faults.records import LostPs
from dlrover.resource.configs import Config
from dlrover.sim.job import SimJob, oom_progress

DAY_S = 86400.0


class FaultsMixin:
    """Event handlers for node failures, stragglers and OOM kills."""

    def _oom(self, i: int, version: int) -> None:
        j = self.jobs[i]
        if version != j.version or j.status != "running":
            return
        self._settle(j)
        c = j.config
        oom = oom_progress(self.s, j)
        assert c is not None and oom is not None
        role = oom[1]
        j.oom_kills += 1
        field_ = "ps_memory_mb" if role == "ps" else "worker_memory_mb"
        grown = c.replace(**{field_: j.driver.memory_after_oom(getattr(c, field_))})
        self._failure(j, "oom_kill", role, new_config=grown)

    def _failure(self, j: SimJob, kind: str, role: str, new_config: Config | None = None, lost_fraction: float = 1.0) -> None:
        """A failure of ``j``: count it; the failure policy decides whether the job rolls
        back to its checkpoint; what was lost restarts."""
        self._settle(j)
        policy = FailurePolicy(self.s.on_failure, self.s.ps_recovery, int(j.row["max_failures"]))  # type: ignore[arg-type]
        decision = policy.ps_lost(LostPs((0,))) if role == "ps" else policy.worker_lost((role,))
        rollback = isinstance(decision, RestartAll) or (isinstance(decision, RecoverPs) and not decision.partial)
        j.failures.append({"kind": kind, "role": role, "at_s": self.now})
        self._event(j, kind, f"{role} lost" + (", rollback to the checkpoint" if rollback else ""))
        if policy.after(len(j.failures), f"{kind} of a {role}") is not None:
            self._finish(j, "failed")
            return
        if rollback:
            j.done, j.productive_s = j.ckpt_done, j.ckpt_productive
        config = new_config or j.config
        assert config is not None
        if not self._ever_fits(j, config):
            return
        rate = j.rate
        self._unplace(j)
        j.config = config
        if rollback:
            self._rolled_back(j, self.now + self.s.restart_s)
        if not self._place(j, config):  # no room left for it: back to the queue, from its checkpoint
            j.done, j.productive_s = j.ckpt_done, j.ckpt_productive
            j.status = "queued"
            self.running -= 1
            self.queue.insert(0, j.idx)
            j.version += 1
            self._schedule()
            return
        if rollback or new_config is not None:
            j.phases = [(self.now + self.s.restart_s, 0.0)]
        else:  # lost workers: the others train on while replacements start
            j.phases = [(self.now + self.s.restart_s, rate * (1 - lost_fraction))]
        self._reschedule(j)

    def _node_fail(self, node: int, _v: int) -> None:
        self.node_failures += 1
        self.cluster.set_alive(node, False)
        self._push(self.now + self.spec.repair_s, "node_up", node)
        for i in sorted(self.node_jobs.pop(node, set())):
            j = self.jobs[i]
            if j.status != "running" or j.worker_nodes is None or j.ps_nodes is None:
                continue
            lost_ps = int((j.ps_nodes == node).sum())
            lost_w = int((j.worker_nodes == node).sum())
            if lost_ps == lost_w == 0:
                continue
            self._failure(j, "node_loss", "ps" if lost_ps else "worker", lost_fraction=lost_w / len(j.worker_nodes))

    def _node_up(self, node: int, _v: int) -> None:
        self.cluster.set_alive(node, True)
        self._push(self.now + float(self.fault_rng.exponential(DAY_S / self.spec.failure_rate)), "node_fail", node)
        self._schedule()

    def _slow_start(self, node: int, _v: int) -> None:
        self._set_slow(node, True)
        steps = int(self.fault_rng.geometric(1 - self.spec.p_stay))
        self._push(self.now + steps * self.spec.straggle_step_s, "slow_end", node)

    def _slow_end(self, node: int, _v: int) -> None:
        self._set_slow(node, False)
        steps = int(self.fault_rng.geometric(self.spec.p_slow))
        self._push(self.now + steps * self.spec.straggle_step_s, "slow_start", node)

    def _set_slow(self, node: int, slow: bool) -> None:
        """The node's speed changed: its jobs' rates change, and their workers' step times
        reach the driver now (a worker is slow from this moment, not from the next tick)."""
        self.cluster.slow[node] = slow
        for i in sorted(self.node_jobs.get(node, ())):
            j = self.jobs[i]
            if j.status == "running":
                self._reschedule(j)
                self._note_steps(j)
