"""How a job answers the loss of an actor, decided as data.

The master's recovery asks a :class:`FailurePolicy` what to do and its states carry the
decision out (``Running`` replaces workers in place, ``Recovering`` recovers a PS,
``Restarting`` restarts everything); the simulator asks the same policy for its
simulated jobs. It is injected beside the scaling policy, so a test or an operator can
give a job another one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlrover.faults.records import LostPs


@dataclass(frozen=True)
class ReplaceWorkers:
    """The lost workers get replacements of their size; the others train on."""

    workers: tuple[str, ...]


@dataclass(frozen=True)
class RecoverPs:
    """The lost PS are replaced: with ``partial``, only their vshards go back to the
    newest checkpoint; else the whole job rolls back to it."""

    lost: LostPs
    partial: bool


@dataclass(frozen=True)
class RestartAll:
    """Every actor restarts from the last durable checkpoint (a job without live recovery)."""


@dataclass(frozen=True)
class Fail:
    """The job ends FAILED: ``reason`` in one line."""

    reason: str


Decision = ReplaceWorkers | RecoverPs | RestartAll | Fail


@dataclass(frozen=True)
class FailurePolicy:
    """``on_failure``: ``recover`` (live recovery) or ``restart`` (every failure restarts
    the job); ``ps``: ``partial`` or ``rollback``; ``max_failures``: the job fails
    after more failures than this; ``replays``: rows trained before a checkpoint can be
    read again (False for a ray_data job, whose trained blocks are released: a lost PS,
    which only a checkpoint can replace, fails it)."""

    on_failure: Literal["recover", "restart"] = "recover"
    ps: Literal["partial", "rollback"] = "partial"
    max_failures: int = 20
    replays: bool = True

    def worker_lost(self, workers: tuple[str, ...]) -> ReplaceWorkers | RestartAll:
        return RestartAll() if self.on_failure == "restart" else ReplaceWorkers(workers)

    def ps_lost(self, lost: LostPs) -> RecoverPs | RestartAll | Fail:
        """The dense PS's loss is never partial: every worker's dense state goes with it."""
        if not self.replays:
            return Fail("a PS was lost, and a ray_data job cannot go back to a checkpoint: the blocks trained since are released")
        if self.on_failure == "restart":
            return RestartAll()
        return RecoverPs(lost, partial=self.ps == "partial" and not lost.dense)

    def after(self, failures: int, last: str) -> Fail | None:
        """``failures`` so far (``last``: the newest, in words): Fail once past the limit."""
        if failures <= self.max_failures:
            return None
        return Fail(f"{failures} failures (checkpoint.max_failures: {self.max_failures}); last: {last}")
