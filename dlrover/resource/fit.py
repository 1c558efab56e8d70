"""Whether a cluster's nodes can ever hold a job's actors: checked before launching, so
that a job the cluster cannot fit (and no autoscaler can grow) fails at once, naming the
shortfall, instead of waiting for actors Ray can never place.

Pure logic over the nodes' total resources: first-fit decreasing, the largest actors
first, each on the first node with room. It may call a job unplaceable that a cleverer
packing would place, only where actors of different sizes compete for the last room of
several nodes; the Ray scheduler is greedy the same way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

RESOURCES = ("CPU", "GPU", "memory_mb")
_EPS = 1e-9


@dataclass(frozen=True)
class Demand:
    """One actor's request: ``role`` names it in messages (``worker``, ``PS``, ``dense PS``)."""

    role: str
    cpu: float
    gpu: float = 0.0
    memory_mb: float = 0.0

    def amounts(self) -> tuple[float, float, float]:
        return (self.cpu, self.gpu, self.memory_mb)


@dataclass(frozen=True)
class Node:
    """A node's total resources, as Ray counts them (``ray.nodes()``'s ``Resources``)."""

    cpu: float
    gpu: float = 0.0
    memory_mb: float = 0.0

    @classmethod
    def of_ray(cls, resources: dict[str, float]) -> "Node":
        return cls(float(resources.get("CPU", 0.0)), float(resources.get("GPU", 0.0)), float(resources.get("memory", 0.0)) / 2**20)

    def amounts(self) -> tuple[float, float, float]:
        return (self.cpu, self.gpu, self.memory_mb)


@dataclass
class Fit:
    """The packing's outcome: the actors the greedy packing found no room for."""

    unplaced: list[Demand] = field(default_factory=list)
    demands: list[Demand] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)

    def largest(self) -> list[float]:
        """Per resource, the most any one node has."""
        return [max((n.amounts()[i] for n in self.nodes), default=0.0) for i in range(len(RESOURCES))]

    def have(self) -> list[float]:
        """Per resource, what all nodes have together."""
        return [sum(n.amounts()[i] for n in self.nodes) for i in range(len(RESOURCES))]

    def need(self) -> list[float]:
        """Per resource, what all the actors ask for together."""
        return [sum(d.amounts()[i] for d in self.demands) for i in range(len(RESOURCES))]

    @property
    def impossible(self) -> bool:
        """No placement at all can hold the job: an actor larger than every node, or more
        of a resource than all nodes have. (A greedy packing that fails short of that
        may still be beaten by Ray's own placement.)"""
        largest, have, need = self.largest(), self.have(), self.need()
        return any(w > h + _EPS for d in self.demands for w, h in zip(d.amounts(), largest)) or any(n > h + _EPS for n, h in zip(need, have))

    def shortfall(self) -> str:
        """One clause naming what is missing: an actor no node is large enough for, or
        the totals the job needs against the cluster's."""
        largest = self.largest()
        for d in self.unplaced:
            too_big = [r for r, want, have in zip(RESOURCES, d.amounts(), largest) if want > have + _EPS]
            if too_big:
                r = too_big[0]
                i = RESOURCES.index(r)
                return f"a {d.role} asks for {_amount(r, d.amounts()[i])} and the largest node has {_amount(r, largest[i])}"
        need, have = self.need(), self.have()
        i = next((i for i in range(len(RESOURCES)) if need[i] > have[i] + _EPS), 0)
        groups = Counter((d.role, d.amounts()[i]) for d in self.demands if d.amounts()[i] > 0)
        asked = " + ".join(f"{k} {PLURAL.get(role, role) if k > 1 else role} x {_amount(RESOURCES[i], v)}" for (role, v), k in groups.items())
        nodes = f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}"
        if need[i] > have[i] + _EPS:
            return f"{asked} need {_amount(RESOURCES[i], need[i])}; the cluster has {_amount(RESOURCES[i], have[i])} on {nodes}"
        return f"{asked} do not pack into the {_amount(RESOURCES[i], have[i])} of {nodes}"


PLURAL = {"worker": "workers"}


def _amount(resource: str, value: float) -> str:
    if resource == "memory_mb":
        return f"{value / 1024:.1f} GiB of memory"
    return f"{value:g} {resource}{'s' if value != 1 else ''}"


def pack(demands: list[Demand], nodes: list[Node]) -> Fit:
    """Place ``demands`` on ``nodes`` (their totals), the largest first."""
    room = [list(n.amounts()) for n in nodes]
    unplaced = []
    for d in sorted(demands, key=lambda d: (d.gpu, d.cpu, d.memory_mb), reverse=True):
        want = d.amounts()
        spot = next((r for r in room if all(w <= h + _EPS for w, h in zip(want, r))), None)
        if spot is None:
            unplaced.append(d)
            continue
        for i, w in enumerate(want):
            spot[i] -= w
    return Fit(unplaced, list(demands), list(nodes))
