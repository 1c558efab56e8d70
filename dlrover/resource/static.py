"""``static``: run the resources the job spec asked for, and never change them."""

from __future__ import annotations

from dlrover.resource.plan import JobView, Policy, ResourcePlan
from dlrover.resource.policy_config import StaticKnobs


class StaticPolicy(Policy):
    """The baseline: initial = the request (``view.requested``, else ``view.config``);
    ``decide`` always keeps things as they are."""

    name = "static"

    def __init__(self, knobs: StaticKnobs | None = None) -> None:
        self.knobs = knobs or StaticKnobs()

    def initial(self, view: JobView) -> ResourcePlan:
        config = view.requested or view.config
        return ResourcePlan(config=config, reason=f"static: the requested {config.short()}")

    def decide(self, view: JobView) -> ResourcePlan | None:
        return None
