"""The job loop both runtimes share: measurement windows, the ``JobView``, the policy's
decision and the budget check, stragglers and memory trends, memory after an OOM kill.

The live master (``dlrover.master.control.Controller``) and the cluster simulator
(``dlrover.sim``) differ in where the numbers come from (actors' reports vs a truth
model) and in how a plan is carried out (a ``Scaler`` on Ray vs placement on simulated
nodes). What lies between, when a configuration counts as measured, what the policy
sees, when a plan is refused, is here once, so the two loops cannot drift apart (they
had: a 2 s minimum window live, 1 s simulated). Pure: no Ray, no clock of its own;
every call takes the job time (seconds) it happens at. Not thread-safe: the live
master holds its lock around the calls.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from dlrover.resource.driver.actors import DEFAULT_TREND, ActorWatch, TrendParams
from dlrover.resource.driver.window import MIN_WINDOW_S, Window
from dlrover.resource.perf_model import REFERENCE_IDS, PerfModel, config_rows
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import ActorMetrics, JobView, Measurement, Policy, ResourcePlan, StreamView

if TYPE_CHECKING:
    from dlrover.resource.history import HistoryRecord

OOM_GROWTH = 1.5  # an actor killed over its memory limit comes back with this much more
OVER_BUDGET = "over budget"


class Progress(NamedTuple):
    """How far the job is: ``progress = done / expected``, ``remaining_s = (expected - done) / throughput``."""

    samples_done: float
    samples_expected: float


class DecisionKind(enum.Enum):
    NONE = "none"  # the policy keeps things as they are
    APPLY = "apply"  # carry out the plan
    REJECTED = "rejected"  # the plan is beyond the budget; the policy was told (``Policy.rejected``)


@dataclass(frozen=True)
class Decision:
    """What one control step decided, and the view it decided on."""

    kind: DecisionKind
    view: JobView
    plan: ResourcePlan | None = None
    why: str = ""  # REJECTED: the reason given to the policy


def straggler_factor(policy: Policy) -> float:
    """The policy's "slow" bar (knob ``straggler_factor``), else the default."""
    knobs = getattr(policy, "knobs", None)
    return float(getattr(knobs, "straggler_factor", ActorWatch.DEFAULT_FACTOR))


class PolicyDriver:
    """One job's loop around its policy. The runtime reports what happened (``open``,
    ``observe``, ``close``, ``rss``, ``rolled_back``, ``forget``) and asks for decisions
    (``initial``, ``view`` then ``decide``); it carries out what comes back."""

    def __init__(
        self,
        policy: Policy,
        *,
        budget: Budget,
        requested: Config,
        batch_size: int,
        signature: str,
        history: list[HistoryRecord] | None = None,
        warmup_s: float,
        trend: TrendParams = DEFAULT_TREND,
        cores: float = math.inf,
        ids_per_sample: float = REFERENCE_IDS,
    ) -> None:
        """``cores``: the cluster's physical cores, for the model's host terms (``inf``:
        never over-committed, as in the simulator, whose nodes hold what they advertise);
        ``ids_per_sample``: the ids a sample of the job's data, for its PS terms."""
        self.policy = policy
        self.model = PerfModel(batch_size, prior=policy.model_prior(), cores=cores, ids_per_sample=ids_per_sample)
        self.budget = budget  # the job's own; a view may be given less (what the cluster has free)
        self.requested = requested
        self.batch_size = batch_size
        self.signature = signature
        self.history = history if history is not None else []  # similar finished jobs, newest first (the runtime may add to it)
        self.warmup_s = warmup_s
        self.measurements: list[Measurement] = []  # closed windows, oldest first
        self.window: Window | None = None
        self.running: Config | None = None  # the configuration measured last
        self.stage = ""  # the stage of the plan that chose it
        self.last_change_s = 0.0  # when it began running
        self.watch = ActorWatch(straggler_factor(policy), trend)

    # -- measurement windows --------------------------------------------------------------
    def open(self, config: Config, at_s: float, plan: ResourcePlan | None = None) -> None:
        """``config`` runs from ``at_s`` on: measure it after the warm-up. A window still
        open is dropped unmeasured (``close`` first to keep it). ``plan``: the plan behind
        it, if one (its prediction; when it changed the configuration, its stage says in
        the summary what chose it: the request or a policy stage)."""
        predicted = plan.predicted_throughput if plan is not None else None
        if predicted is None or predicted <= 0:
            predicted = self.model.predict(config)
        if config != self.running:
            self.running, self.last_change_s, self.stage = config, at_s, plan.stage if plan is not None else ""
        sd = float(self.model.relative_sd(config_rows([config]))[0])
        self.window = Window(config, at_s, at_s + self.warmup_s, predicted, sd, self.stage)

    def observe(self, now: float, samples: float) -> None:
        """The job's cumulative sample count at ``now``."""
        if self.window is not None:
            self.window.observe(now, samples)

    def close(self) -> Measurement | None:
        """End the running window; one of at least ``MIN_WINDOW_S`` refits the model and
        is returned."""
        w, self.window = self.window, None
        m = w.measurement() if w is not None else None
        if m is None or m.duration_s < MIN_WINDOW_S:
            return None
        self.measurements.append(m)
        self.model.observe(m.config, m.throughput, weight=m.duration_s)
        return m

    def current(self) -> Measurement | None:
        """The running window once it is ``MIN_WINDOW_S`` long (what the policy sees)."""
        m = self.window.measurement() if self.window is not None else None
        return m if m is not None and m.duration_s >= MIN_WINDOW_S else None

    def window_s(self) -> float:
        """How long the running configuration has been measured so far."""
        m = self.window.measurement() if self.window is not None else None
        return m.duration_s if m is not None else 0.0

    def rolled_back(self, config: Config, at_s: float) -> None:
        """The job went back to a checkpoint: what the running window and the actors'
        samples saw is void; ``config`` runs again from ``at_s``."""
        self.watch.clear()
        self.open(config, at_s)

    # -- actors ---------------------------------------------------------------------------
    def rss(self, name: str, at_s: float, rss_mb: float) -> None:
        """One RSS sample of an actor (for its memory trend)."""
        self.watch.rss(name, at_s, rss_mb)

    def forget(self, name: str) -> None:
        """The actor is gone (or was replaced under the same name)."""
        self.watch.forget(name)

    # -- decisions ------------------------------------------------------------------------
    def view(
        self, now: float, config: Config, progress: Progress, reports: Iterable[ActorMetrics] = (), budget: Budget | None = None,
        stream: StreamView | None = None,
    ) -> JobView:  # fmt: skip
        """What the policy sees: ``reports`` (the actors' latest metrics) come back with
        their straggler mark and RSS trend filled in; ``budget`` defaults to the job's;
        ``stream``: a followed stream's arrivals and lag."""
        current = self.current()
        done, expected = progress
        remaining = (expected - done) / max(current.throughput, 1e-9) if current is not None else None
        return JobView(
            now_s=now,
            config=config,
            budget=budget or self.budget,
            batch_size=self.batch_size,
            signature=self.signature,
            model=self.model,
            measurements=list(self.measurements),
            current=current,
            actors=self.watch.metrics(reports),
            progress=done / max(expected, 1),
            remaining_s=remaining,
            last_change_s=self.last_change_s,
            history=self.history,
            requested=self.requested,
            stream=stream,
        )

    def initial(self, now: float) -> ResourcePlan:
        """The configuration to start with (stage 1 or the request, as the policy says).
        Raises ValueError for a plan beyond the budget: every policy clips to it."""
        view = self.view(now, self.requested, Progress(0.0, 1.0))
        plan = self.policy.initial(view)
        if not plan.config.fits(self.budget):
            raise ValueError(f"policy {self.policy.name} chose {plan.config.short()}, beyond the budget {self.budget}")
        return plan

    def decide(self, view: JobView) -> Decision:
        """Ask the policy; a plan beyond ``view.budget`` is refused and given back to it."""
        plan = self.policy.decide(view)
        if plan is None or not plan.changes(view.config):
            return Decision(DecisionKind.NONE, view)
        if not plan.config.fits(view.budget):
            self.policy.rejected(plan, OVER_BUDGET)
            return Decision(DecisionKind.REJECTED, view, plan, OVER_BUDGET)
        return Decision(DecisionKind.APPLY, view, plan)

    def memory_after_oom(self, memory_mb: int) -> int:
        """Memory for the replacement of an actor killed over its limit: 1.5x, within the
        job's budget."""
        return int(min(memory_mb * OOM_GROWTH, self.budget.memory_mb))
