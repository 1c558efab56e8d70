"""``scripted``: a fixed queue of decisions, for tests and benchmarks.

In the manner of Ray Train v2's mock scaling policy: the knobs list steps; each fires
once, in order, as soon as its trigger holds (``view.progress >= at_progress`` or
``view.now_s >= at_s``, or the running configuration measured for ``after_window_s``), and at most one step fires per ``decide`` call, so two steps due
at the same tick come out on two consecutive ticks. A step returns the configuration that
runs now with the step's fields changed (clipped to the budget, which the reason then
says), plus its ``replace`` / ``rebalance_ps`` corrections.
"""

from __future__ import annotations

from dlrover.resource.plan import JobView, Policy, ResourcePlan
from dlrover.resource.policy_config import ScriptedKnobs


class ScriptedPolicy(Policy):
    name = "scripted"

    def __init__(self, knobs: ScriptedKnobs | None = None) -> None:
        self.knobs = knobs or ScriptedKnobs()
        self.next_step = 0  # index of the next step to fire

    def initial(self, view: JobView) -> ResourcePlan:
        config = view.requested or view.config
        return ResourcePlan(config=config, reason=f"scripted: start with the requested {config.short()}", stage="scripted")

    def decide(self, view: JobView) -> ResourcePlan | None:
        from dlrover.resource.configs import clip_to_budget, describe_change

        if self.next_step >= len(self.knobs.steps):
            return None
        step = self.knobs.steps[self.next_step]
        if step.at_progress is not None:
            due, when = view.progress >= step.at_progress, f"progress {view.progress:.0%} >= {step.at_progress:.0%}"
        elif step.at_s is not None:
            due, when = view.now_s >= step.at_s, f"t={view.now_s:.0f}s >= {step.at_s:g}s"
        else:
            measured = view.current.duration_s if view.current is not None else 0.0
            due, when = measured >= step.after_window_s, f"{measured:.0f}s measured >= {step.after_window_s:g}s"
        if not due:
            return None
        index = self.next_step
        self.next_step += 1
        wanted = view.config.replace(**step.changes())
        config = clip_to_budget(wanted, view.budget)
        what = [describe_change(view.config, config)] if config != view.config else []
        if config != wanted:
            what.append(f"(asked {wanted.short()}, clipped to the budget)")
        if step.replace:
            what.append(f"replace {', '.join(step.replace)}")
        if step.rebalance_ps:
            what.append("rebalance PS")
        reason = f"scripted step {index + 1}/{len(self.knobs.steps)} at {when}: {' '.join(what) or 'no change'}"
        return ResourcePlan(config=config, reason=reason, stage="scripted", replace=list(step.replace), rebalance_ps=step.rebalance_ps)
