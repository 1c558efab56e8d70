"""A simulated job's control loop: what it feeds its ``PolicyDriver`` and what it does with
the decisions, the simulator's side of the loop ``dlrover.master.control`` runs live.

The driver (``dlrover.resource.driver``) owns the windows, the ``JobView``, the budget
check, straggler marks and RSS trends; this mixin of :class:`dlrover.sim.engine.Simulator`
feeds it what a live master would have received, derived from the truth:

* **progress**: the job's cumulative samples at every change of its rate (progress is
  piecewise linear in between), times the running window's noise;
* **step times**: of an abridged set of workers (the ones on slow nodes and enough of
  the others to keep the median right), whenever a node turns slow or fast, the job's
  workers move, and at each tick; so a worker is marked slow from the moment its node
  slowed, as continuous live reports would mark it;
* **RSS**: at each tick, the samples a representative worker and PS would have reported
  over the trend's span (every ``rss_report_s``) since the job last resumed training.

Simulator times are absolute; the driver is fed job time (since submission).
"""

from __future__ import annotations

import numpy as np

from dlrover.resource.driver import DecisionKind, Progress
from dlrover.resource.configs import Budget
from dlrover.resource.plan import ActorMetrics, ResourcePlan
from dlrover.sim.job import SimJob, mem_fraction, peaks


class ControlMixin:
    """Policy decisions and measurement of :class:`~dlrover.sim.engine.Simulator`'s jobs."""

    def _tick(self, i: int, gen: int) -> None:
        j = self.jobs[i]
        if j.status != "running" or gen != j.tick_gen:
            return
        self._settle(j)
        self._push(self.now + self.s.control_interval_s, "tick", i, gen)
        if self.now - j.ckpt_t >= self.s.checkpoint_interval_s and not j.phases:
            j.ckpt_t, j.ckpt_done, j.ckpt_productive = self.now, j.done, j.productive_s
        self._update_used(j)
        assert j.config is not None
        if any(until > self.now for until, _ in j.phases):  # starting, restarting or switching: no decisions
            return
        t = self.now - j.submit_s
        view = j.driver.view(t, j.config, Progress(j.done, j.total), self._reports(j, t, rss=True), self._budget(j))
        decision = j.driver.decide(view)
        if decision.kind is DecisionKind.APPLY:
            assert decision.plan is not None
            self._apply(j, decision.plan)

    def _budget(self, j: SimJob) -> Budget:
        """The job's quota, and no more than it holds plus what is free (nothing extra
        while jobs wait: a running job does not grow into capacity a queued one needs)."""
        c = j.config
        assert c is not None
        free_cpu = free_mem = 0.0
        if not self.queue:
            free_cpu, free_mem = self.cluster.free_totals()
        return Budget(
            min(j.quota.cpu, c.cpu + free_cpu), int(min(j.quota.memory_mb, c.memory_mb + free_mem)), j.quota.max_workers, j.quota.max_ps
        )

    def _apply(self, j: SimJob, plan: ResourcePlan) -> None:
        """Carry out an applied plan: a new configuration (new actors start while the old
        train on, then the switch pauses training), or workers moved off slow nodes. Either
        way the running window closes and a new one opens, as live."""
        old = j.config
        assert old is not None
        if plan.config != old:
            old_rate = j.rate
            if not self._replace_actors(j, plan.config):
                self._refused(j, plan, "no room on the nodes")
                return
            self._close_window(j)
            t_switch = self.now + self.s.rescale_s
            self._open_window(j, t_switch + self.s.rescale_pause_s, plan)
            j.changes += 1
            self._event(j, "scale", plan.reason, old=old.short(), new=plan.config.short(), config=plan.config.to_dict())
            j.phases = [(t_switch, min(old_rate, self._true_rate(j))), (t_switch + self.s.rescale_pause_s, 0.0)]
            self._reschedule(j)
            self._schedule()  # a job that shrank may let queued ones start
            return
        moved = [int(a.split("-", 1)[1]) for a in plan.replace if a.startswith("worker-")]
        if not moved:  # PS replaced by an identical one or rebalanced: no effect on the truth here
            return
        if not self._move_workers(j, moved):
            self._refused(j, plan, "no room on the nodes")
            return
        self._close_window(j)
        self._open_window(j, self.now, plan)
        self._event(j, "replace", plan.reason)
        self._reschedule(j)

    def _refused(self, j: SimJob, plan: ResourcePlan, why: str) -> None:
        """The plan could not be carried out: the policy gets it back (``Policy.rejected``)."""
        self._event(j, "plan_rejected", plan.reason)
        j.driver.policy.rejected(plan, why)

    # ------------------------------------------------------------------ windows
    def _open_window(self, j: SimJob, at: float, plan: ResourcePlan | None = None) -> None:
        """``j.config`` runs from ``at`` (chosen by ``plan``, if one): a new window, with
        its own measurement error."""
        assert j.config is not None
        j.driver.open(j.config, at - j.submit_s, plan)
        self._draw_noise(j)

    def _rolled_back(self, j: SimJob, at: float) -> None:
        assert j.config is not None
        j.driver.rolled_back(j.config, at - j.submit_s)
        self._draw_noise(j)

    def _draw_noise(self, j: SimJob) -> None:
        j.noise = float(np.exp(self.noise_rng.normal(0.0, self.s.measure_noise))) if self.s.measure_noise > 0 else 1.0

    def _close_window(self, j: SimJob) -> None:
        self._settle(j)
        j.driver.close()

    def _observe(self, j: SimJob) -> None:
        """The job's sample count now, as its window measures it (``_settle`` calls this)."""
        j.driver.observe(self.now - j.submit_s, j.done * j.noise)

    # ------------------------------------------------------------------ actors
    def _reports(self, j: SimJob, t: float, rss: bool = False) -> list[ActorMetrics]:
        """The abridged actor reports at job time ``t`` (see the module docstring); with
        ``rss`` the RSS samples of the last trend span of the first worker shown and the PS
        (the representatives: every worker's RSS is the same here) go to the driver too."""
        c = j.config
        assert c is not None and j.worker_nodes is not None and j.ps_nodes is not None
        pw, pp = peaks(j)
        f = mem_fraction(self.s, j.done / j.total)
        step = j.truth.step_time(c, int(j.row["batch_size"]))
        cl = self.cluster
        on_slow = cl.slow[j.worker_nodes]
        if on_slow.any():
            slow = np.flatnonzero(on_slow).tolist()
            shown = [*np.flatnonzero(~on_slow)[: max(2, len(slow) + 1)].tolist(), *slow]
        else:
            shown = list(range(min(2, len(on_slow))))
        out = []
        for k in shown:
            node = int(j.worker_nodes[k])
            speed = float(cl.perf[node]) * (self.spec.slow_factor if cl.slow[node] else 1.0)
            out.append(ActorMetrics(f"worker-{k}", "worker", c.worker_cpu, c.worker_memory_mb, rss_mb=f * pw, step_time_s=step / speed, at_s=t))
        out.append(ActorMetrics("ps-0", "ps", c.ps_cpu, c.ps_memory_mb, rss_mb=f * pp, at_s=t))
        if rss:
            self._feed_rss(j, t, (out[0], out[-1]), pw, pp)
        return out

    def _feed_rss(self, j: SimJob, t: float, actors: tuple[ActorMetrics, ...], pw: float, pp: float) -> None:
        """The RSS samples the actors reported over the trend's span before ``t``, since the
        job last resumed training (after a start, restart or switch: before that they were
        not running), at the current rate. None once RSS has been at its peak for the whole
        span: they would fit a flat line, and without samples the trend is 0 too."""
        every, watch = self.s.rss_report_s, j.driver.watch
        if j.done - j.rate * watch.params.span_s >= self.s.mem_fill * j.total:
            return
        since = j.running_since - j.submit_s
        peak = [(a.name, pw if a.role == "worker" else pp) for a in actors]
        for back in range(int(watch.params.span_s // every), -1, -1):
            at = t - back * every
            if at < since:
                continue
            f = mem_fraction(self.s, max(0.0, j.done - j.rate * back * every) / j.total)
            for name, mb in peak:
                watch.rss(name, at, f * mb)

    def _workers_placed(self, j: SimJob, old: np.ndarray | None) -> None:
        """``j``'s workers were (re)placed: one that landed on another node is a new actor
        to the driver, and the step times of all count from now."""
        new = j.worker_nodes
        assert new is not None
        n_old = 0 if old is None else len(old)
        for k in range(max(n_old, len(new))):
            if old is None or k >= len(old) or k >= len(new) or old[k] != new[k]:
                j.driver.forget(f"worker-{k}")
        self._note_steps(j)

    def _note_steps(self, j: SimJob) -> None:
        if j.config is not None and j.worker_nodes is not None and j.ps_nodes is not None:
            j.driver.watch.note_steps(self._reports(j, self.now - j.submit_s))
