"""Cluster simulator: replay a job trace under an allocation policy, without a cluster.

``simulate(trace, "dlrover_rm")`` runs the very policy code the live JobMaster runs, in
the same loop (:class:`~dlrover.resource.driver.PolicyDriver`; see :mod:`dlrover.sim.engine`)
and returns a :class:`~dlrover.sim.job.SimResult`;
:func:`dlrover.sim.report.metrics` turns it into JCT, completion rate, utilisation,
makespan and ETTR.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from dlrover.sim.cluster import ClusterSpec
from dlrover.sim.engine import Simulator
from dlrover.sim.job import SimResult, SimSettings
from dlrover.sim.trace import read_trace, synthetic_trace, write_trace

# Knobs for hours-long, cluster-sized jobs: the simulator's default policy files.
CLUSTER_POLICIES = Path(__file__).resolve().parents[2] / "policies" / "cluster"

__all__ = ["ClusterSpec", "SimResult", "SimSettings", "Simulator", "read_trace", "simulate", "synthetic_trace", "write_trace"]


def cluster_policy_config(policy: str, given: str | None) -> str | None:
    """The policy file a simulation uses: ``given``, else ``policies/cluster/<policy>.yaml``
    when there is one (cluster-scale knobs), else none (built-in defaults)."""
    if given is None and (CLUSTER_POLICIES / f"{policy}.yaml").is_file():
        return str(CLUSTER_POLICIES / f"{policy}.yaml")
    return given


def simulate(
    trace: pd.DataFrame,
    policy: str,
    policy_config: str | None = None,
    knobs: dict | None = None,
    cluster: ClusterSpec | None = None,
    settings: SimSettings | None = None,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    label: str | None = None,
) -> SimResult:
    """Simulate ``trace`` with policy ``policy`` (knobs: built-in defaults < ``policy_config``
    file, by default ``policies/cluster/<policy>.yaml`` < ``knobs``), one fresh policy
    object per job as in the live system."""
    from dlrover.resource.policies import policy_factory

    make = policy_factory(policy, cluster_policy_config(policy, policy_config), knobs, overrides_source="simulate")
    label = label or (policy if settings is None or settings.placement == "packed" else f"{policy}+{settings.placement}")
    return Simulator(trace, make, cluster, settings, seed=seed, policy_name=label, progress=progress).run()
