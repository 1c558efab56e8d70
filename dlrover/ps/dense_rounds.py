"""Synchronous dense rounds (``train.dense_sync: sync | coded``): which workers' gradients
one optimizer step of the dense PS combines.

Each worker in the round set gives one gradient per round; round ``r`` closes when its
rule says so, and the PS then takes one step with the mean of the gradients it got:

* ``sync``: when every member gave one (synchronous SGD over the members: the slowest
  member sets every round's pace);
* ``coded`` (scheme ``ignore``, the uncoded baseline of approximate gradient coding,
  Johri et al. arXiv 2105.06124): once all but ``stragglers`` members gave one; a
  gradient that comes after its round closed is dropped (``ignored``), and its worker
  goes on with the round still open, so a slow worker never holds the others back.

Membership follows the workers, not a count from the master: a worker joins with its
first push, leaves when it stops pushing for a while (parked for an elastic operation or
a checkpoint, waiting for input, done) and is dropped for good when the master forgets
it (dead, hung, retired). A round waits only for the members of the moment, so a pause,
a scale event or a death never leaves a round waiting for someone who will not push.
This class is the bookkeeping only (no locks, no tensors); ``DenseParamServer`` holds
the lock and applies the closed rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dlrover.optimizer_spec import DenseSync


class Caller(NamedTuple):
    """Who sends a round call: the worker, its run (a ``DenseClient``'s id) and the call's
    place in that run's calls (0 starts the run). A threaded server may start one worker's
    calls in any order; it serves them in this one, and voids a call of a run after it."""

    name: str
    run: str
    seq: int


@dataclass
class RoundRule:
    """When a round closes: ``wait_for_all`` (sync), else once at most ``stragglers``
    members still owe it (coded, ignore)."""

    wait_for_all: bool
    stragglers: int = 0

    @classmethod
    def of(cls, mode: DenseSync, stragglers: int) -> "RoundRule | None":
        """The rule of a ``train.dense_sync`` mode (None: ``async``, no rounds)."""
        if mode == "async":
            return None
        return cls(wait_for_all=mode == "sync", stragglers=0 if mode == "sync" else stragglers)


@dataclass
class Rounds:
    """Open rounds, who owes them, and what was dropped."""

    rule: RoundRule
    next_round: int = 0  # the oldest open round; every round below it is closed
    active: set[str] = field(default_factory=set)  # the members now
    next_of: dict[str, int] = field(default_factory=dict)  # worker -> the round its next gradient goes to
    gone: set[str] = field(default_factory=set)  # dropped for good: never a member again
    payloads: dict[int, list[Any]] = field(default_factory=dict)  # open round -> gradients given
    ignored: int = 0  # gradients that came after their round closed (coded)

    def push(self, name: str, payload: Any) -> int | None:
        """Add ``name``'s gradient; the round it went to, or None if it came late (dropped:
        its round closed without it). A worker not in the set joins at the oldest open
        round it has not given to."""
        if name in self.gone:  # not counted: its replacement trains the batch again
            return None
        if name in self.active:
            r = self.next_of[name]
            if r < self.next_round:  # its round closed without it: drop, go on with the open one
                self.next_of[name] = self.next_round
                self.ignored += 1
                return None
        else:
            self.active.add(name)
            r = max(self.next_of.get(name, 0), self.next_round)
        self.payloads.setdefault(r, []).append(payload)
        self.next_of[name] = r + 1
        return r

    def leave(self, name: str) -> None:
        """``name`` stops pushing for now; its next push joins again."""
        self.active.discard(name)

    def drop(self, name: str) -> None:
        """``name`` is gone for good (a late push of it is dropped)."""
        self.active.discard(name)
        self.gone.add(name)

    def owing(self, r: int) -> int:
        """Members that have not given a gradient to round ``r`` yet."""
        return sum(1 for name in self.active if self.next_of[name] <= r)

    def close_ready(self) -> list[list[Any]]:
        """Close every round that may close now, oldest first; their gradients."""
        closed = []
        while self.payloads.get(self.next_round):
            r = self.next_round
            if self.owing(r) > (0 if self.rule.wait_for_all else self.rule.stragglers):
                break
            closed.append(self.payloads.pop(r))
            self.next_round = r + 1  # a member that still owes r: its gradient for r is dropped when it comes
        return closed

    def is_closed(self, r: int) -> bool:
        return r < self.next_round
