"""Gradient coding: which data partitions each worker computes, and how the dense PS decodes.

n workers, n data partitions. An :class:`Assignment` holds ``B`` (workers x partitions):
worker ``i`` sends ``sum_j B[i, j] g_j``, ``g_j`` the gradient of partition ``j``. Given
the workers that arrived (``F``), the PS sends ``a^T (B_F G)``; :func:`decode` picks ``a``.
Schemes (Johri et al. arXiv 2105.06124 and its baselines):

* ``ignore``: uncoded (``B = I``); the PS takes whatever arrived, rescaled by n / |F|.
* ``sync``: uncoded, waits for every worker (exact; the slowest worker bounds the step).
* ``frc``: fractional repetition (Tandon et al. 2017): groups of at least s+1 workers hold
  the same partitions, so one worker per group is enough for the exact sum.
* ``cyclic``: worker i holds partitions i .. i+d-1 (mod n); least-squares decoding
  ``a* = argmin ||B_F^T a - 1||`` (approximate gradient coding; exact in some patterns).

The error of a decoding is the paper's ``||B^T a - 1||^2 / n``: how far the weight each
partition's gradient got is from 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from scipy.linalg import lstsq

from dlrover.errors import DLRoverError

EXACT_TOL = 1e-9  # a decoding error below this is exact (lstsq leaves ~1e-30 on exact systems)


class Scheme(str, Enum):
    IGNORE = "ignore"
    SYNC = "sync"
    FRC = "frc"
    CYCLIC = "cyclic"


@dataclass(frozen=True, eq=False)
class Assignment:
    """A scheme's partitions per worker for ``stragglers`` tolerated stragglers; ``groups``
    (FRC only) are the worker indices of each repetition group."""

    scheme: Scheme
    B: np.ndarray
    stragglers: int
    groups: tuple[np.ndarray, ...] = field(default=())

    @property
    def workers(self) -> int:
        return self.B.shape[0]

    @property
    def load(self) -> np.ndarray:
        """Partitions each worker computes: its compute time in units of one partition."""
        return np.count_nonzero(self.B, axis=1)


def check_sizes(workers: int, stragglers: int) -> None:
    """A user error unless 1 <= workers and 0 <= stragglers < workers (someone must arrive)."""
    if workers < 1:
        raise DLRoverError(f"--workers {workers}: expected at least 1")
    if not 0 <= stragglers < workers:
        raise DLRoverError(f"--stragglers {stragglers}: expected 0 <= stragglers < workers ({workers}): at least one worker must arrive")


def assignment(scheme: Scheme | str, workers: int, stragglers: int, d: int | None = None) -> Assignment:
    """The assignment of ``scheme`` for ``workers`` workers tolerating ``stragglers``.
    ``d`` (cyclic only) is partitions per worker, by default s + 1 (FRC's load)."""
    scheme, n, s = Scheme(scheme), workers, stragglers
    check_sizes(n, s)
    if scheme in (Scheme.IGNORE, Scheme.SYNC):
        return Assignment(scheme, np.eye(n), s)
    if scheme is Scheme.FRC:
        # n // (s+1) groups of (nearly) equal size >= s+1; worker group k holds partition group k
        parts = np.array_split(np.arange(n), n // (s + 1))
        B = np.zeros((n, n))
        for p in parts:
            B[np.ix_(p, p)] = 1.0
        return Assignment(scheme, B, s, tuple(parts))
    d = s + 1 if d is None else d
    if not 1 <= d <= n:
        raise DLRoverError(f"--d {d}: expected 1 <= d <= workers ({n}) partitions per cyclic worker")
    B = np.zeros((n, n))
    rows = np.repeat(np.arange(n), d)
    B[rows, (rows + np.tile(np.arange(d), n)) % n] = 1.0
    return Assignment(scheme, B, s)


@dataclass(frozen=True, eq=False)
class Decoded:
    """The PS's combination of the messages that arrived: ``weights`` per worker (0 for one
    that did not), ``coefficients = B^T weights`` (each partition's weight in the sum)."""

    weights: np.ndarray
    coefficients: np.ndarray
    error: float  # ||coefficients - 1||^2 / n

    @property
    def exact(self) -> bool:
        return self.error <= EXACT_TOL

    def gradient(self, partition_grads: np.ndarray) -> np.ndarray:
        """``a^T (B G)`` for per-partition gradients ``G`` (partitions x dim), i.e.
        ``coefficients @ G``: what the dense PS applies."""
        return self.coefficients @ partition_grads


def decode(a: Assignment, arrived: np.ndarray) -> Decoded:
    """Weights for the workers in ``arrived`` (bool per worker): ``ignore`` rescales the sum
    by n / |F|; the others take the least-squares ``a* = argmin ||B_F^T a - 1||``."""
    n = a.workers
    arrived = np.asarray(arrived, dtype=bool)
    weights = np.zeros(n)
    if arrived.any():
        if a.scheme is Scheme.IGNORE:
            weights[arrived] = n / np.count_nonzero(arrived)
        else:
            weights[arrived] = lstsq(a.B[arrived].T, np.ones(n))[0]
    coefficients = a.B.T @ weights
    return Decoded(weights, coefficients, float(np.sum((coefficients - 1.0) ** 2) / n))


def stop_times(a: Assignment, finish: np.ndarray) -> np.ndarray:
    """When the PS stops waiting, per step, given each worker's finish time (steps x
    workers): ``sync`` waits for all, ``frc`` for the first of every group, ``ignore`` and
    ``cyclic`` for the first n - s (with every worker that finishes at that same time)."""
    if a.scheme is Scheme.SYNC:
        return finish.max(axis=1)
    if a.scheme is Scheme.FRC:
        return np.max([finish[:, g].min(axis=1) for g in a.groups], axis=0)
    return np.sort(finish, axis=1)[:, a.workers - a.stragglers - 1]


def arrivals(a: Assignment, speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Given each worker's speed per step (steps x workers, 1 = an active node): when the
    PS stops waiting, in units of one partition on an active node, and who arrived by then
    (steps x workers)."""
    finish = a.load / speeds
    stop = stop_times(a, finish)
    return stop, finish <= stop[:, None]
