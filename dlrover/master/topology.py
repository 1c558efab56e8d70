"""The cores of the cluster's nodes, from Ray, for the performance model's host terms.

Ray's ``CPU`` resource is a scheduling budget that a node may advertise beyond its cores
(``--num-cpus``; the embedded local cluster advertises twice the job's CPUs). What the
host terms of :mod:`dlrover.resource.perf_model` need is what the operating system runs
threads on: each node's CPU affinity, read on the node itself. The master's own node is
read in place; every other node that offers CPUs gets a zero-CPU task pinned to it.
Also what PAL placement (``policy.placement: pal``) needs: each node's free Ray CPUs, and
each node's speed before any worker has run there (PAL's profiling run: a fixed piece of
float work timed on the node, :func:`probe_work_s`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import ray
from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
from ray.autoscaler._private.util import format_readonly_node_type
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from dlrover.resource.fit import Node

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0
PROBE_MATRIX, PROBE_PRODUCTS, PROBE_REPEATS = 256, 40, 3  # ~20 ms of one core per repeat


def node_cores() -> int:
    """Cores this process may run on (its CPU affinity; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_on_nodes(fn: Callable[[], Any], nodes: Iterable[str], what: str) -> dict[str, Any]:
    """``fn()`` in a zero-CPU task pinned to each of ``nodes``, all at once: the answers of
    the nodes that gave one within ``PROBE_TIMEOUT_S`` (a lost or late node is left out,
    with a warning naming ``what`` was asked)."""
    remote = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = {remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(): n for n in nodes}
    if not refs:
        return {}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    out = {}
    for ref in ready:
        try:
            out[refs[ref]] = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - a node lost meanwhile
            log.warning("%s probe of node %s failed: %s", what, refs[ref], e)
    for ref in late:
        log.warning("%s probe of node %s gave no answer in %.0f s", what, refs[ref], PROBE_TIMEOUT_S)
        ray.cancel(ref, force=True)
    return out


def cpu_nodes() -> dict[str, float]:
    """The alive nodes that offer Ray CPUs, and how many."""
    out = {}
    for node in ray.nodes():
        cpus = float(node.get("Resources", {}).get("CPU", 0.0))
        if node.get("Alive") and cpus > 0:
            out[node["NodeID"]] = cpus
    return out


def cluster_cores() -> float:
    """Sum of the cores of the alive nodes that offer Ray CPUs. A node whose probe does not
    answer counts its Ray CPUs (no over-commit assumed there). No such node yet (a head
    without CPUs, nodes still to come from an autoscaler): unbounded, no over-commit."""
    here = ray.get_runtime_context().get_node_id()
    nodes = cpu_nodes()
    cores = run_on_nodes(node_cores, [n for n in nodes if n != here], "core")
    if here in nodes:
        cores[here] = node_cores()
    return sum(float(cores.get(n, cpus)) for n, cpus in nodes.items()) or float("inf")


def probe_work_s() -> float:
    """CPU seconds one thread here spends on a fixed piece of float work (the best of
    ``PROBE_REPEATS``), a slow node's injected slowdown included, as a worker there
    would have it (:mod:`dlrover.faults.injected`). CPU time, not wall time: it measures the
    processor, whatever else runs on the node at that moment (the step times of the
    workers that run there later measure the rest)."""
    import torch

    from dlrover.faults.injected import ChaosState, node_slowdown

    chaos, threads = ChaosState(node_slowdown()), torch.get_num_threads()
    a = torch.full((PROBE_MATRIX, PROBE_MATRIX), 0.5)
    best = float("inf")
    torch.set_num_threads(1)
    try:
        for _ in range(PROBE_REPEATS):
            t0, cpu0 = time.perf_counter(), time.thread_time()
            for _ in range(PROBE_PRODUCTS):
                torch.mm(a, a)
            chaos.after_step(time.perf_counter() - t0, time.thread_time() - cpu0)
            best = min(best, time.thread_time() - cpu0)
    finally:
        torch.set_num_threads(threads)  # a pooled Ray worker: later tasks keep their threads
    return best


def free_cpus() -> dict[str, float]:
    """Each alive node's unreserved Ray CPUs as the GCS sees them now (a node with all of
    them taken is missing from Ray's answer: 0). Ray 2.60 has no public per-node call
    without the dashboard; this DeveloperAPI reads the GCS, as Ray's own TPU utilities do.
    It lags actor creation by a resource report, so the caller counts its own recent
    placements."""
    from ray._private.state import available_resources_per_node

    return {node: float(res.get("CPU", 0.0)) for node, res in available_resources_per_node().items()}


def node_totals() -> list[Node]:
    """Each alive node's total resources (what the job could ever be given there)."""
    return [Node.of_ray(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def autoscaler_running() -> bool:
    """Whether an autoscaler can add nodes. Autoscaler v2 reports its iterations to the
    GCS. v1's monitor runs on every head node and writes a status report; without an
    autoscaling config it is read-only, and names each node's type after the node itself."""
    import json

    from ray.autoscaler.v2.sdk import get_cluster_status
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        stats = get_cluster_status(ray.get_runtime_context().gcs_address).stats
        if stats.autoscaler_iteration_time_s is not None or stats.autoscaler_version not in (None, "", "0"):
            return True
    except Exception as e:  # noqa: BLE001 - an older GCS without the v2 state: ask v1
        log.debug("autoscaler v2 state unavailable: %s", e)
    status = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    if not status:
        return False
    types = (json.loads(status).get("autoscaler_report") or {}).get("node_type_mapping") or {}
    return any(kind != format_readonly_node_type(node) for node, kind in types.items())
