"""Step times and decoding errors of the gradient-coding schemes (:mod:`dlrover.sim.coding`)
under the two-class slow/active straggler model with persistence, and ``dlrover simulate-coding``.

One worker per node. Each step a node is active or slow (a Markov chain per node, as in
:class:`~dlrover.sim.cluster.ClusterSpec`: active -> slow with ``p_slow``, slow stays slow
with ``p_stay``; the first step is drawn from the chain's stationary distribution). A
worker's compute time is its partitions / speed (1, or ``slow_factor`` when
slow); the dense PS stops waiting as :func:`~dlrover.sim.coding.stop_times` says and
decodes what arrived by then. Every scheme sees the same straggler path and the same
gradients (common random numbers), drawn from the injected generator.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, replace

import numpy as np

from dlrover.errors import DLRoverError
from dlrover.sim.cluster import ClusterSpec
from dlrover.sim.coding import EXACT_TOL, Scheme, arrivals, assignment, check_sizes, decode

DEFAULT_RATES = (0.01, 0.05, 0.1, 0.2)


@dataclass(frozen=True)
class StragglerModel:
    """Johri et al.'s slow/active nodes; the defaults are the cluster simulator's."""

    p_slow: float = ClusterSpec.p_slow  # active -> slow per step (the "straggler rate")
    p_stay: float = ClusterSpec.p_stay  # slow -> slow per step (persistence)
    slow_factor: float = ClusterSpec.slow_factor  # speed of a slow node

    @property
    def slow_fraction(self) -> float:
        """The stationary share of slow nodes, p_slow / (p_slow + 1 - p_stay)."""
        leave = self.p_slow + 1.0 - self.p_stay
        return self.p_slow / leave if leave > 0 else 1.0


def straggler_speeds(model: StragglerModel, workers: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Each worker's speed per step (steps x workers): ``model.slow_factor`` while its node
    is slow, else 1."""
    return np.where(slow_states(model, workers, steps, rng), model.slow_factor, 1.0)


def slow_states(model: StragglerModel, workers: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Whether each worker's node is slow at each step (steps x workers), the Markov chain
    started from its stationary distribution so that no warm-up is needed."""
    u = rng.random((steps, workers))
    slow = np.empty((steps, workers), dtype=bool)
    slow[0] = u[0] < model.slow_fraction
    for t in range(1, steps):
        slow[t] = np.where(slow[t - 1], u[t] < model.p_stay, u[t] < model.p_slow)
    return slow


@dataclass(frozen=True)
class SchemeResult:
    """One scheme at one straggler rate. Times are in units of one partition's compute on
    an active node; ``grad_error_mean`` is ||decoded - true sum|| / ||true sum||."""

    scheme: str
    rate: float
    load: float  # mean partitions computed per worker (compute per step vs uncoded)
    step_time_mean: float
    step_time_p95: float
    error_mean: float  # the paper's ||B_F^T a - 1||^2 / n
    grad_error_mean: float
    exact_fraction: float


def run_scheme(
    scheme: Scheme, stragglers: int, speeds: np.ndarray, grads: np.ndarray, rate: float, d: int | None = None
) -> SchemeResult:
    """``scheme`` over the steps of ``speeds`` (steps x workers) with partition gradients
    ``grads`` (steps x partitions x dim); each distinct arrival pattern is decoded once.
    Times are in units of one partition's compute on an active node."""
    a = assignment(scheme, speeds.shape[1], stragglers, d)
    stop, arrived = arrivals(a, speeds)
    patterns, which = np.unique(arrived, axis=0, return_inverse=True)
    decoded = [decode(a, p) for p in patterns]
    which = which.ravel()
    coef = np.array([x.coefficients for x in decoded])[which]
    error = np.array([x.error for x in decoded])[which]
    true = grads.sum(axis=1)
    miss = np.einsum("sn,snd->sd", coef - 1.0, grads)
    return SchemeResult(
        scheme.value, rate, float(a.load.mean()), float(stop.mean()), float(np.percentile(stop, 95)), float(error.mean()),
        float(np.mean(np.linalg.norm(miss, axis=1) / np.linalg.norm(true, axis=1))), float(np.mean(error <= EXACT_TOL)),
    )  # fmt: skip


def sweep(
    workers: int,
    stragglers: int,
    rates: tuple[float, ...] | list[float],
    steps: int,
    rng: np.random.Generator,
    model: StragglerModel = StragglerModel(),
    d: int | None = None,
    dim: int = 16,
) -> list[SchemeResult]:
    """Every scheme at every straggler rate (``p_slow``; the rest of ``model`` fixed);
    ``d``: partitions per ``cyclic`` worker (default s + 1).
    Partition gradients are a shared per-step mean plus independent noise of the same
    scale (i.i.d. partitions of one data set), so a rescaled partial sum is unbiased."""
    check_sizes(workers, stragglers)
    assignment(Scheme.CYCLIC, workers, stragglers, d)  # a bad d fails before any work
    if steps < 1:
        raise DLRoverError(f"--steps {steps}: expected at least 1")
    if not 0.0 < model.slow_factor <= 1.0:
        raise DLRoverError(f"--slow-factor {model.slow_factor}: expected 0 < slow_factor <= 1")
    if not rates or not all(0.0 <= rate <= 1.0 for rate in rates):
        raise DLRoverError(f"--rates: expected probabilities in [0, 1], got {','.join(map(str, rates))}")
    out = []
    for rate in rates:
        m = replace(model, p_slow=rate)
        speeds = straggler_speeds(m, workers, steps, rng)
        grads = rng.standard_normal((steps, 1, dim)) + rng.standard_normal((steps, workers, dim))
        out += [run_scheme(s, stragglers, speeds, grads, rate, d) for s in Scheme]
    return out


def parse_rates(text: str) -> list[float]:
    """``0.01,0.05`` -> [0.01, 0.05], or a one-line user error (:func:`sweep` checks the range)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise DLRoverError(f"--rates: expected probabilities separated by commas (e.g. 0.01,0.1), got {text!r}") from None


def format_table(results: list[SchemeResult], model: StragglerModel = StragglerModel()) -> str:
    """Scheme x straggler rate: mean and p95 step time, decoding errors, exact fraction."""
    head = f"{'rate':>6} {'slow%':>6} {'scheme':<7} {'load':>5} {'t/step':>7} {'p95':>6} {'err':>8} {'grad err':>8} {'exact':>6}"
    lines = [head, "-" * len(head)]
    for r in results:
        slow = replace(model, p_slow=r.rate).slow_fraction
        lines.append(
            f"{r.rate:>6.3f} {100 * slow:>5.1f}% {r.scheme:<7} {r.load:>5.1f} {r.step_time_mean:>7.3f} {r.step_time_p95:>6.2f}"
            f" {r.error_mean:>8.4f} {r.grad_error_mean:>8.4f} {r.exact_fraction:>6.3f}"
        )
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    """``dlrover simulate-coding``: the sweep, printed as a table or a JSON list."""
    rng = np.random.default_rng(args.seed)
    model = StragglerModel(slow_factor=args.slow_factor)
    results = sweep(args.workers, args.stragglers, parse_rates(args.rates), args.steps, rng, model, d=args.d)
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
    else:
        d = args.stragglers + 1 if args.d is None else args.d
        print(f"{args.workers} workers, {args.stragglers} stragglers tolerated, cyclic d={d}, slow factor {args.slow_factor},"
              f" {args.steps} steps, seed {args.seed};"
              " time in units of one partition on an active node")  # fmt: skip
        print(format_table(results, model))
    return 0
