"""A job's resource configuration (:class:`Config`) and budget (:class:`Budget`), and the
operations on them that the policies and the master's control loop share: fitting a
configuration into a budget, and saying in one line what a change does."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Config:
    """One resource configuration of a job (the variables of the performance model)."""

    workers: int
    ps: int
    worker_cpu: float
    ps_cpu: float
    worker_memory_mb: int = 2048
    ps_memory_mb: int = 2048

    @property
    def cpu(self) -> float:
        return self.workers * self.worker_cpu + self.ps * self.ps_cpu

    @property
    def memory_mb(self) -> int:
        return self.workers * self.worker_memory_mb + self.ps * self.ps_memory_mb

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    def fits(self, budget: "Budget") -> bool:
        return (
            self.cpu <= budget.cpu + 1e-9
            and self.memory_mb <= budget.memory_mb
            and 1 <= self.workers <= budget.max_workers
            and 1 <= self.ps <= budget.max_ps
        )

    def model_row(self) -> tuple[int, int, float, float]:
        """The performance model's variables ``(w, p, cw, cp)`` (one row of its searches)."""
        return (self.workers, self.ps, self.worker_cpu, self.ps_cpu)

    def short(self) -> str:
        return f"{self.workers}w x {self.worker_cpu:g}cpu + {self.ps}ps x {self.ps_cpu:g}cpu"

    @classmethod
    def from_resources(cls, r: Any) -> "Config":
        """From a spec's ``resources`` section (``dlrover.spec.ResourceSpec``)."""
        return cls(r.workers, r.ps, float(r.worker_cpu), float(r.ps_cpu), r.worker_memory_mb, r.ps_memory_mb)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Budget:
    """The most a job may hold at once (the job's budget within the cluster's)."""

    cpu: float
    memory_mb: int
    max_workers: int = 64
    max_ps: int = 64  # also bounded by the number of vshards


def describe_change(old: Config, new: Config) -> str:
    """``2w x 1cpu + 1ps x 1cpu -> 4w x 1cpu + 1ps x 1cpu``, with memory when it changes."""

    def mem(c: Config) -> str:
        return f" (worker {c.worker_memory_mb} MB, PS {c.ps_memory_mb} MB)"

    same_mem = (old.worker_memory_mb, old.ps_memory_mb) == (new.worker_memory_mb, new.ps_memory_mb)
    return f"{old.short()}{'' if same_mem else mem(old)} -> {new.short()}{'' if same_mem else mem(new)}"


def clip_to_budget(config: Config, budget: Budget) -> Config:
    """The largest-looking configuration like ``config`` that fits ``budget``.

    Counts are first capped by ``max_workers`` / ``max_ps``; then, while over budget, one
    actor of the role holding the larger share of the violated resource is dropped (at
    least one worker and one PS stay); if one worker and one PS still do not fit, their
    sizes shrink proportionally.
    """
    c = config.replace(workers=max(1, min(config.workers, budget.max_workers)), ps=max(1, min(config.ps, budget.max_ps)))
    while not c.fits(budget):
        cpu_over = c.cpu / budget.cpu if budget.cpu > 0 else math.inf
        mem_over = c.memory_mb / budget.memory_mb if budget.memory_mb > 0 else math.inf
        if cpu_over >= mem_over:
            worker_share, ps_share = c.workers * c.worker_cpu, c.ps * c.ps_cpu
        else:
            worker_share, ps_share = c.workers * c.worker_memory_mb, c.ps * c.ps_memory_mb
        if c.workers > 1 and (worker_share >= ps_share or c.ps == 1):
            c = c.replace(workers=c.workers - 1)
        elif c.ps > 1:
            c = c.replace(ps=c.ps - 1)
        else:
            break
    if c.cpu > budget.cpu + 1e-9 and budget.cpu > 0:
        f = budget.cpu / c.cpu * (1 - 1e-9)
        c = c.replace(worker_cpu=c.worker_cpu * f, ps_cpu=c.ps_cpu * f)
    if c.memory_mb > budget.memory_mb and budget.memory_mb > 0:
        f = budget.memory_mb / c.memory_mb
        c = c.replace(worker_memory_mb=int(c.worker_memory_mb * f), ps_memory_mb=int(c.ps_memory_mb * f))
    return c


def job_budget(spec: Any, requested: Config) -> Budget:
    """The job's budget for workers and PS: ``resources.budget_*`` (less the dense PS's
    CPUs), else the request. Memory without its own budget grows with the CPU budget
    (same MB per CPU as the request)."""
    r = spec.resources
    cpu = r.elastic_budget_cpu or requested.cpu
    memory = r.budget_memory_mb or int(requested.memory_mb * cpu / requested.cpu)
    return Budget(cpu=cpu, memory_mb=memory, max_ps=spec.train.vshards)
