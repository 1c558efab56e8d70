"""Typed identities of a job's actors and processes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class ProcessInfo:
    """Where an actor runs: what a liveness probe answers, and what a kill needs."""

    pid: int
    node_id: str


class Role(str, Enum):
    WORKER = "worker"
    PS = "ps"
    DENSE_PS = "dense-ps"


@dataclass(frozen=True)
class ActorId:
    """Who an actor is in its job. Its Ray name is made from it and never parsed back:
    the launcher keeps the id of every name it made."""

    role: Role
    index: int  # workers and PS: counted per role, never reused; the dense PS: its shard
    generation: int = 0  # the dense PS: a new one each time a rollback re-creates it

    def __str__(self) -> str:
        gen = f"-g{self.generation}" if self.role is Role.DENSE_PS else ""
        return f"{self.role.value}-{self.index}{gen}"

    def ray_name(self, job_id: str) -> str:
        """``<job_id>/worker-3``: the Ray dashboard groups a job's actors by the prefix."""
        return f"{job_id}/{self}"
