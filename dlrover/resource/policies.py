"""Making policy objects: the policy name -> class registry, with the knobs of
:mod:`dlrover.resource.policy_config` validated once per job (or once per simulation)."""

from __future__ import annotations

from collections.abc import Callable

from dlrover.resource.dlrover_rm import DLRoverRMPolicy
from dlrover.resource.optimus import OptimusPolicy
from dlrover.resource.plan import Policy
from dlrover.resource.policy_config import load_knobs
from dlrover.resource.scripted import ScriptedPolicy
from dlrover.resource.static import StaticPolicy

# One class per name in ``policy_config.KNOBS`` (load_knobs rejects any other name first).
POLICY_CLASSES: dict[str, type[Policy]] = {
    "static": StaticPolicy,
    "scripted": ScriptedPolicy,
    "dlrover_rm": DLRoverRMPolicy,
    "optimus": OptimusPolicy,
}


def load_policy(
    name: str, config_path: str | None = None, overrides: dict | None = None, overrides_source: str = "job spec"
) -> Policy:
    """A fresh policy object (one per job: policies keep per-job state)."""
    return policy_factory(name, config_path, overrides, overrides_source)()


def policy_factory(
    name: str, config_path: str | None = None, overrides: dict | None = None, overrides_source: str = "job spec"
) -> Callable[[], Policy]:
    """A maker of fresh policy objects with the knobs validated once (the simulator makes
    one per job, thousands of times; the live master calls it once per job)."""
    knobs = load_knobs(name, config_path, overrides, overrides_source)  # raises SpecError for an unknown name
    cls = POLICY_CLASSES[name]
    return lambda: cls(knobs)  # type: ignore[call-arg]
