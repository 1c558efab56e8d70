"""``optimus``: greedy marginal gain per dominant resource share (Optimus, EuroSys'18).

Optimus starts a job small and grows it one actor at a time: at each step it adds the
worker or the PS whose *marginal gain* is the largest, where the gain of adding an actor
is the relative throughput increase the performance model predicts, divided by the
actor's *dominant share* of the budget, ``max(actor cpu / budget cpu, actor memory /
budget memory)``. Dividing by the dominant share (as in DRF) prices each actor by the
resource it uses up fastest, so a memory-heavy PS is worth adding only if it pays for
the memory it takes, not just for its CPU. The greedy stops when the best gain falls
below ``min_gain_per_share`` or nothing more fits the budget (and ``max_workers`` /
``max_ps``); per-actor CPU and memory sizes are kept, only counts change.

``initial``: 1 worker + 1 PS of the requested sizes (``start: minimal``) or the request
itself (``start: request``), clipped to the budget. ``decide``: once the running
configuration has been measured for ``profile_window_s`` and ``cooldown_s`` has passed
since the last change, rerun the greedy from 1 worker + 1 PS with ``view.model``
(calibrated to the measured throughput of the running configuration; this scale does
not change the greedy's relative gains, only the predicted throughput). Rerunning from
scratch rather than from the running configuration makes the target a function of the
model alone, so a job that reached it is left alone, and a refit model can also shrink
a job. The target is proposed if it gains more than ``min_gain`` over the measured
throughput, or frees CPU for a predicted loss under ``min_gain``; at most
``max_changes`` times per job. A budget that shrank below what runs is obeyed at once.
Unlike ``dlrover_rm`` there is no warm start from history and no runtime correction.
"""

from __future__ import annotations

import dataclasses

from dlrover.resource.configs import Budget, Config, clip_to_budget, describe_change
from dlrover.resource.plan import JobView, Policy, ResourcePlan
from dlrover.resource.policy_config import OptimusKnobs


class OptimusPolicy(Policy):
    """See the module docstring. One object per job: it counts changes."""

    name = "optimus"

    def __init__(self, knobs: OptimusKnobs | None = None) -> None:
        self.knobs = knobs or OptimusKnobs()
        self.changes = 0

    def _budget(self, view: JobView) -> Budget:
        """The job's budget with the knobs' caps on workers and PS applied."""
        b, k = view.budget, self.knobs
        return dataclasses.replace(
            b, max_workers=min(b.max_workers, k.max_workers or b.max_workers), max_ps=min(b.max_ps, k.max_ps or b.max_ps)
        )

    def initial(self, view: JobView) -> ResourcePlan:
        req = view.requested or view.config
        wanted = req.replace(workers=1, ps=1) if self.knobs.start == "minimal" else req
        config = clip_to_budget(wanted, self._budget(view))
        reason = f"optimus: start from {'1 worker + 1 PS of the requested sizes' if self.knobs.start == 'minimal' else 'the request'}: {wanted.short()}"
        if config != wanted:
            reason += f", clipped to the budget: {config.short()}"
        return ResourcePlan(config, reason, stage="default" if self.knobs.start == "minimal" else "request")

    def greedy(self, view: JobView, sizes: Config, calib: float = 1.0) -> tuple[Config, float]:
        """Grow 1 worker + 1 PS of ``sizes`` by the best marginal gain per dominant share.

        Returns the configuration the greedy stops at and its predicted throughput.
        """
        k, b = self.knobs, self._budget(view)

        def share(cpu: float, mem: float) -> float:
            return max(cpu / b.cpu if b.cpu > 0 else float("inf"), mem / b.memory_mb if b.memory_mb > 0 else float("inf"))

        shares = (share(sizes.worker_cpu, sizes.worker_memory_mb), share(sizes.ps_cpu, sizes.ps_memory_mb))
        c = sizes.replace(workers=1, ps=1)
        if not c.fits(b):
            c = clip_to_budget(c, b)
        t = float(view.model.predict_many([c])[0]) * calib
        while True:
            moves = [(m, s) for m, s in zip((c.replace(workers=c.workers + 1), c.replace(ps=c.ps + 1)), shares) if m.fits(b)]
            if not moves or t <= 0:
                return c, t
            pred = view.model.predict_many([m for m, _ in moves]) * calib  # both candidates at once
            values = [(p - t) / t / s for p, (_, s) in zip(pred, moves)]
            i = max(range(len(moves)), key=values.__getitem__)  # ties: the worker
            if values[i] < k.min_gain_per_share:
                return c, t
            c, t = moves[i][0], float(pred[i])

    def decide(self, view: JobView) -> ResourcePlan | None:
        k, cur = self.knobs, view.config
        if not cur.fits(view.budget):
            config = clip_to_budget(cur, view.budget)
            b = view.budget
            return ResourcePlan(
                config,
                f"budget is now {b.cpu:g} CPU / {b.memory_mb} MB (max {b.max_workers}w, {b.max_ps}ps): {describe_change(cur, config)}",
                stage="correction",
            )
        win = view.current
        if win is None or win.duration_s < k.profile_window_s or win.throughput <= 0:
            return None
        if view.now_s - view.last_change_s < k.cooldown_s or self.changes >= k.max_changes:
            return None
        t_now = win.throughput
        pred_cur = float(view.model.predict_many([cur])[0])
        calib = t_now / pred_cur if pred_cur > 0 else 1.0
        new, t_new = self.greedy(view, cur, calib)
        if new == cur:
            return None
        gain = t_new / t_now - 1
        d_cpu = new.cpu - cur.cpu
        if not (gain > k.min_gain or (d_cpu < 0 and gain > -k.min_gain)):
            return None
        self.changes += 1
        reason = (
            f"optimus: {describe_change(cur, new)}: predicted {t_new:.0f} samples/s ({gain:+.0%}) "
            f"vs {t_now:.0f} measured, {d_cpu:+g} CPU"
        )
        return ResourcePlan(new, reason, stage="model", predicted_throughput=t_new)

    def rejected(self, plan: ResourcePlan, why: str) -> None:
        """A model plan the runtime could not carry out does not use up ``max_changes``."""
        if plan.stage == "model":
            self.changes = max(0, self.changes - 1)
