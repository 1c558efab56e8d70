"""The job loop both runtimes share (the live master's ``Controller`` and the simulator):
see :mod:`dlrover.resource.driver.loop`."""

from dlrover.resource.driver.actors import ActorWatch, TrendParams
from dlrover.resource.driver.loop import OOM_GROWTH, OVER_BUDGET, Decision, DecisionKind, PolicyDriver, Progress
from dlrover.resource.driver.window import MIN_WINDOW_S, Window

__all__ = [
    "MIN_WINDOW_S", "OOM_GROWTH", "OVER_BUDGET", "ActorWatch", "Decision", "DecisionKind", "PolicyDriver", "Progress",
    "TrendParams", "Window",
]  # fmt: skip
