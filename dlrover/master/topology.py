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

import os
import time

from dlrover.master.cluster import Cluster
from dlrover.resource.fit import Node

PROBE_MATRIX, PROBE_PRODUCTS, PROBE_REPEATS = 256, 40, 3  # ~20 ms of one core per repeat


def node_cores() -> int:
    """Cores this process may run on (its CPU affinity; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_nodes(cluster: Cluster) -> dict[str, float]:
    """The alive nodes that offer Ray CPUs, and how many."""
    return {node: float(res.get("CPU", 0.0)) for node, res in cluster.alive_nodes().items() if res.get("CPU", 0.0) > 0}


def cluster_cores(cluster: Cluster) -> float:
    """Sum of the cores of the alive nodes that offer Ray CPUs. A node whose probe does not
    answer counts its Ray CPUs (no over-commit assumed there). No such node yet (a head
    without CPUs, nodes still to come from an autoscaler): unbounded, no over-commit."""
    here = cluster.node_id()
    nodes = cpu_nodes(cluster)
    cores = cluster.run_on_nodes(node_cores, [n for n in nodes if n != here], "core")
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


def node_totals(cluster: Cluster) -> list[Node]:
    """Each alive node's total resources (what the job could ever be given there)."""
    return [Node.of_ray(res) for res in cluster.alive_nodes().values()]
