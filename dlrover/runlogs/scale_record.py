"""Typed records of the resource changes a job went through (``summary.json``'s
``scale_events``).

A ``ScaleEvent`` is built when a plan is carried out (or fails) and serialised once, by
``to_dict``, into the documented summary row; a restarted master and the summary's
readers read it back with ``from_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from dlrover.resource.configs import Config, describe_change
from dlrover.resource.plan import ResourcePlan


class ScaleKind(str, Enum):
    """What changed most visibly."""

    WARM_START = "warm_start"
    FAILED = "failed"
    REPLACE = "replace"
    REBALANCE = "rebalance"
    RESIZE = "resize"
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    RESCALE = "rescale"

    @classmethod
    def of(cls, old: Config, new: Config, plan: ResourcePlan) -> "ScaleKind":
        if plan.replace and old == new:
            return cls.REPLACE
        if plan.rebalance_ps and old == new:
            return cls.REBALANCE
        if (old.workers, old.ps) == (new.workers, new.ps):
            return cls.RESIZE
        if new.workers + new.ps > old.workers + old.ps:
            return cls.SCALE_OUT
        if new.workers + new.ps < old.workers + old.ps:
            return cls.SCALE_IN
        return cls.RESCALE


@dataclass
class ScaleEvent:
    """One resource change. ``timings``: those of the way it was carried out, as the typed
    result of that way gives them (``ScaleResult.timings``: launch, pre-copy, pause, bytes;
    ``RestartResult.timings``: stop, checkpoint, launch, restore); they go into the row as
    they are."""

    kind: ScaleKind
    at_s: float  # job time of the plan
    stage: str
    reason: str
    old: Config
    new: Config
    predicted_throughput: float | None = None
    error: str | None = None  # a failed change: why
    ops: list[str] | None = None
    spares_used: int | None = None
    duration_s: float | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    first_step_s: dict[str, float] = field(default_factory=dict)  # new worker -> plan to its first step

    @classmethod
    def of(cls, kind: ScaleKind, plan: ResourcePlan, old: Config, new: Config, at_s: float, **done: Any) -> "ScaleEvent":
        return cls(kind, round(at_s, 3), plan.stage, plan.reason, old, new, plan.predicted_throughput, **done)

    def to_dict(self) -> dict:
        row = {"kind": self.kind.value, "at_s": self.at_s, "stage": self.stage, "reason": self.reason}
        row.update({"from": self.old.to_dict(), "to": self.new.to_dict(), "summary": describe_change(self.old, self.new)})
        row["predicted_throughput"] = self.predicted_throughput
        row.update({k: v for k, v in (("error", self.error), ("ops", self.ops), ("spares_used", self.spares_used), ("duration_s", self.duration_s)) if v is not None})
        row.update(self.timings)
        if self.first_step_s:
            row["first_step_s"] = dict(self.first_step_s)  # a copy: a first step may come while it is written
        return row

    @classmethod
    def from_dict(cls, row: dict) -> "ScaleEvent":
        own = {f.name for f in fields(cls)} | {"from", "to", "summary"}
        done = {k: row[k] for k in ("error", "ops", "spares_used", "duration_s", "first_step_s") if k in row}
        timings = {k: v for k, v in row.items() if k not in own}
        old, new = Config(**row["from"]), Config(**row["to"])
        return cls(ScaleKind(row["kind"]), row["at_s"], row["stage"], row["reason"], old, new, row.get("predicted_throughput"), timings=timings, **done)
