"""Typed identities of a job's actors and processes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessInfo:
    """Where an actor runs: what a liveness probe answers, and what a kill needs."""

    pid: int
    node_id: str
