"""What a policy sees and what it decides: the contract shared by the live JobMaster and
the cluster simulator.

``JobView`` is a plain snapshot (no Ray handles), so the same ``Policy`` object runs
against a live job or a simulated one. A policy returns a ``ResourcePlan`` (the target
configuration plus targeted corrections); the master diffs it against what runs into a
``ScalePlan`` and a ``Scaler`` executes that on Ray (``dlrover.master.scaler``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from dlrover.resource.configs import Budget, Config

if TYPE_CHECKING:
    from dlrover.resource.history import HistoryRecord
    from dlrover.resource.perf_model import PerfModel, PerfParams


@dataclass
class ActorMetrics:
    """Latest runtime metrics of one actor (a window of its own reports)."""

    name: str
    role: str  # "worker" | "ps"
    cpu: float  # allocated CPUs
    memory_limit_mb: int
    rss_mb: float = 0.0
    cpu_util: float = 0.0  # used / allocated, over the last window (0..1+)
    step_time_s: float = 0.0  # workers: mean step time over the window
    samples_per_s: float = 0.0  # workers
    wait_ps_s: float = 0.0  # workers: per-step time blocked on PS pulls
    queue_depth: int = 0  # workers: parsed batches waiting; PS: pending pulls
    busy: float = 0.0  # PS: fraction of wall time spent serving pulls and pushes
    us_per_id: float = 0.0  # PS: busy time per id pulled or pushed over the window (microseconds)
    slow_since_s: float | None = None  # since when step time (PS: time per id) has been over the straggler bar
    rss_trend_mb_per_s: float = 0.0  # slope of RSS over the recent window
    at_s: float = 0.0


@dataclass
class Measurement:
    """Throughput of the whole job measured while it ran one configuration."""

    config: Config
    throughput: float  # samples/s
    duration_s: float  # length of the measured window (warm-up excluded)
    at_s: float  # end of the window, job time
    predicted: float | None = None  # what the model predicted before the job ran it
    predicted_sd: float | None = None  # how unsure the model was of it (relative standard deviation)
    stage: str = ""  # the stage of the plan that chose it (``ResourcePlan.stage``)

    def row(self) -> dict:
        """The summary's ``configurations`` row: predicted against measured."""
        error = (self.predicted - self.throughput) / self.throughput if self.predicted else None
        return {
            "config": self.config.to_dict(), "summary": self.config.short(), "predicted_throughput": self.predicted,
            "predicted_sd": self.predicted_sd, "stage": self.stage, "measured_throughput": self.throughput, "error": error, "duration_s": self.duration_s, "at_s": self.at_s,
        }  # fmt: skip


@dataclass(frozen=True)
class StreamView:
    """A job following arriving data (``data.follow``): how fast rows arrive, how far
    behind training is, and the bound it must stay under (``policy.max_lag_s``)."""

    arrival_per_s: float  # training rows arriving per second, over the recent window
    lag_rows: float  # rows arrived and not trained yet
    lag_s: float  # age of the oldest such row
    max_lag_s: float

    @property
    def caught_up(self) -> bool:
        """Training keeps up: what is measured then is the arrival rate, not the capacity."""
        return self.lag_s < 0.1 * self.max_lag_s


@dataclass
class JobView:
    """Everything a policy may look at, as plain data."""

    now_s: float  # job time (seconds since submission)
    config: Config  # what runs now
    budget: Budget
    batch_size: int
    signature: str  # model + data signature (history lookups)
    model: "PerfModel"  # online-fitted resource-performance model of this job
    measurements: list[Measurement] = field(default_factory=list)  # finished windows, oldest first
    current: Measurement | None = None  # the running configuration's window so far (None: warming up)
    actors: dict[str, ActorMetrics] = field(default_factory=dict)
    progress: float = 0.0  # fraction of the job's samples done
    remaining_s: float | None = None  # estimated time to finish at the current throughput
    last_change_s: float = 0.0  # when the configuration last changed
    history: list["HistoryRecord"] = field(default_factory=list)  # similar finished jobs, newest first
    requested: Config | None = None  # what the user asked for in the spec
    stream: StreamView | None = None  # a job following arriving data, with a lag bound


class CorrectionKind(str, Enum):
    """Why a policy replaces an actor (or resizes a role) before it fails."""

    STRAGGLER = "straggler"
    MEMORY_PRESSURE = "memory_pressure"


@dataclass(frozen=True)
class Correction:
    """One proactive fix in a plan: ``actor`` is the actor's name as the JobView shows it."""

    kind: CorrectionKind
    actor: str


@dataclass
class ResourcePlan:
    """A policy's decision: the configuration to run, and targeted corrections.

    ``replace`` names actors to be swapped for fresh ones of the plan's size (straggler,
    a hot PS moved to a bigger one, memory pressure); ``rebalance_ps`` asks for vshards
    to be spread by measured PS load; ``corrections`` say which of the changes fix a
    straggler or memory pressure (the master records those as failures handled early).
    """

    config: Config
    reason: str
    # "request" / "default" (a start from the request / the policy's default, no history) |
    # "warm_start" | "model" | "correction" | "scripted" | "resume" | "drain" | "" (static)
    stage: str = ""
    predicted_throughput: float | None = None
    replace: list[str] = field(default_factory=list)
    rebalance_ps: bool = False
    corrections: list[Correction] = field(default_factory=list)  # failures handled before they hurt

    def changes(self, current: Config) -> bool:
        return self.config != current or bool(self.replace) or self.rebalance_ps


class Policy(ABC):
    """Allocation policy: one interface for the live master and the simulator."""

    name: str = "policy"

    @abstractmethod
    def initial(self, view: JobView) -> ResourcePlan:
        """The configuration to start the job with (``view.config`` is the request)."""

    @abstractmethod
    def decide(self, view: JobView) -> ResourcePlan | None:
        """Called every control tick; ``None`` keeps things as they are."""

    def rejected(self, plan: ResourcePlan, why: str) -> None:
        """The runtime could not carry out ``plan`` (over the budget, no room on the nodes).
        A policy that counts its changes gives this one back; by default nothing."""

    def model_prior(self) -> "PerfParams | None":
        """Prior of the job's performance model (knob ``model_prior``; None: the built-in)."""
        from dlrover.resource.perf_model import PerfParams

        prior = getattr(getattr(self, "knobs", None), "model_prior", None)
        return PerfParams(**prior.model_dump()) if prior is not None else None
