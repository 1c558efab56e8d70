"""Variability-aware placement (PAL, arXiv 2408.11919): the simulator's and the live job's.

Nodes of the same type still run at different speeds. PAL measures each node's speed,
normalised to the median, groups the nodes into performance classes with K-Means, and
places a job's actors on the fastest class that has room. Here a live node's speed comes
from the step times its workers report (:func:`node_speeds`) and, for nodes no worker
has run on yet, from a probe timed there when the job starts (:func:`merged_speeds`);
the simulator draws them.
Pure logic: Ray's view of the nodes is read by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median

import numpy as np

PAL_CLASSES = 3  # K-Means classes over node speed (the simulator's default too)


@dataclass(frozen=True)
class StepSample:
    """A worker's median step time over its latest steps, and the node it runs on."""

    node: str
    step_time_s: float


def kmeans_classes(perf: np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """PAL's performance classes: ``(class of each node, score of each class)``; a score
    is the class centroid over the median centroid. Classes are numbered fastest first."""
    from sklearn.cluster import KMeans

    k = max(1, min(k, len(np.unique(perf))))
    km = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(perf.reshape(-1, 1))
    centers = km.cluster_centers_.ravel()
    order = np.argsort(-centers)  # fastest first
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k)
    scores = centers[order] / np.median(centers)
    return rank[km.labels_], scores


def node_speeds(samples: Iterable[StepSample]) -> dict[str, float]:
    """Speed of each node some worker measured: the job's median step time over the median
    step time of the workers on that node (1: a median node; 2: twice as fast). Medians,
    as PAL's, so one odd window does not move a node."""
    by_node: dict[str, list[float]] = {}
    for s in samples:
        if s.step_time_s > 0:
            by_node.setdefault(s.node, []).append(s.step_time_s)
    if not by_node:
        return {}
    job = median(t for times in by_node.values() for t in times)
    return {node: job / median(times) for node, times in by_node.items()}


def merged_speeds(measured: Mapping[str, float], probed: Mapping[str, float], nodes: Iterable[str]) -> dict[str, float]:
    """The speed of each of ``nodes``: from the workers' steps where there are some, else
    from the probe (PAL's profiling run) put on the workers' scale (times the median ratio
    of the two on the nodes that have both), else the probe's median on that scale (a
    node neither measured: as fast as a typical probed node, not as the median worker)."""
    common = [n for n in measured if probed.get(n, 0) > 0]
    scale = median(measured[n] / probed[n] for n in common) if common else 1.0
    typical = scale * median(probed.values()) if probed else 1.0
    return {n: measured[n] if n in measured else probed[n] * scale if n in probed else typical for n in nodes}


def pal_node(free_cpu: Mapping[str, float], speeds: Mapping[str, float], cpu: float, classes: int = PAL_CLASSES) -> str | None:
    """The node for a new actor of ``cpu`` CPUs among ``free_cpu``'s (node -> free CPUs):
    in the fastest performance class that has a node with the room, the one with the most
    room (spreading the actors keeps them off each other's cores), then the faster, then
    the lowest id. Nodes nobody measured count as median speed (1). None: no room anywhere."""
    nodes = sorted(free_cpu)
    if not nodes:
        return None
    speed = np.array([speeds.get(n, 1.0) for n in nodes])
    cls, _ = kmeans_classes(speed, classes)
    roomy = [i for i, n in enumerate(nodes) if free_cpu[n] >= cpu - 1e-9]
    if not roomy:
        return None
    best = min(int(cls[i]) for i in roomy)
    i = min((i for i in roomy if cls[i] == best), key=lambda i: (-free_cpu[nodes[i]], -speed[i], nodes[i]))
    return nodes[i]
