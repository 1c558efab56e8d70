"""The cores of the cluster's nodes, from Ray, for the performance model's host term.

Ray's ``CPU`` resource is a scheduling budget that a node may advertise beyond its cores
(``--num-cpus``; the embedded local cluster advertises twice the job's CPUs). What the
host term of :mod:`dlrover.resource.perf_model` needs is what the operating system runs
threads on: each node's CPU affinity, read on the node itself. The master's own node is
read in place; every other node that offers CPUs gets a zero-CPU task pinned to it.
Also each node's free Ray CPUs, the room PAL placement (``policy.placement: pal``) needs.
"""

from __future__ import annotations

import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0


def node_cores() -> int:
    """Cores this process may run on (its CPU affinity; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cluster_cores() -> float:
    """Sum of the cores of the alive nodes that offer Ray CPUs. A node whose probe does not
    answer in ``PROBE_TIMEOUT_S`` counts its Ray CPUs (no over-commit assumed there)."""
    here = ray.get_runtime_context().get_node_id()
    total = 0.0
    probes: dict[ray.ObjectRef, float] = {}
    probe = ray.remote(num_cpus=0, max_retries=0)(node_cores)
    for node in ray.nodes():
        cpus = float(node.get("Resources", {}).get("CPU", 0.0))
        if not node.get("Alive") or cpus <= 0:
            continue
        if node["NodeID"] == here:
            total += node_cores()
        else:
            probes[probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()] = cpus
    if probes:
        ready, late = ray.wait(list(probes), num_returns=len(probes), timeout=PROBE_TIMEOUT_S)
        for ref in ready:
            try:
                total += float(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - a node lost meanwhile: its Ray CPUs
                log.warning("core probe failed (%s): counting the node's Ray CPUs", e)
                total += probes[ref]
        for ref in late:
            ray.cancel(ref, force=True)
            total += probes[ref]
    return total


def free_cpus() -> dict[str, float]:
    """Each alive node's unreserved Ray CPUs as the GCS sees them now (a node with all of
    them taken is missing from Ray's answer: 0). Ray 2.60 has no public per-node call
    without the dashboard; this DeveloperAPI reads the GCS, as Ray's own TPU utilities do.
    It lags actor creation by a resource report, so the caller counts its own recent
    placements."""
    from ray._private.state import available_resources_per_node

    return {node: float(res.get("CPU", 0.0)) for node, res in available_resources_per_node().items()}
