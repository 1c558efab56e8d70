"""Typed failure records: what failed, how it was classified, and how it was handled.

A failure's kind comes from where the fault came from (the master's own kill of a hung
or over-limit actor, an injected fault, a node Ray reports dead, a policy's proactive
correction) and from exception types, never from an error message's wording. The cause
class follows from the kind: only infrastructure faults count against the cluster's
reliability (``dlrover.metrics.reliability``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any


class FailureKind(str, Enum):
    WORKER_DEATH = "worker_death"
    WORKER_HANG = "worker_hang"  # alive but silent: its process was killed by the master
    PS_DEATH = "ps_death"
    MASTER_DEATH = "master_death"
    NODE_LOSS = "node_loss"
    OOM_KILL = "oom_kill"  # over its memory limit: killed by the master
    STRAGGLER = "straggler"  # replaced proactively by the policy
    MEMORY_PRESSURE = "memory_pressure"  # memory raised proactively before a limit


class CauseClass(str, Enum):
    USER_CODE = "user_code"
    SYSTEM = "system"
    INFRASTRUCTURE = "infrastructure"


CAUSE_OF_KIND = {
    FailureKind.WORKER_DEATH: CauseClass.SYSTEM,
    FailureKind.WORKER_HANG: CauseClass.SYSTEM,
    FailureKind.PS_DEATH: CauseClass.SYSTEM,
    FailureKind.MASTER_DEATH: CauseClass.SYSTEM,
    FailureKind.NODE_LOSS: CauseClass.INFRASTRUCTURE,
    FailureKind.OOM_KILL: CauseClass.SYSTEM,  # allocation sized too small for the workload
    FailureKind.STRAGGLER: CauseClass.INFRASTRUCTURE,  # slow hardware or a noisy host
    FailureKind.MEMORY_PRESSURE: CauseClass.SYSTEM,
}


@dataclass(frozen=True)
class CheckpointRef:
    """The checkpoint a recovery went back to."""

    seq: int
    at_s: float
    source: str  # "memory", "durable" or "initial" (the launch cut, see Checkpointer.payloads)


@dataclass
class Failure:
    """One failure as the summary reports it (``summary.json``: ``failures``)."""

    kind: FailureKind
    actor: str
    at_s: float  # when the fault happened (injected, last sign of life, or detected)
    detected_s: float
    cause: str = ""
    node: str | None = None
    handled_s: float | None = None
    recovered_s: float | None = None  # the first step of training after it
    replacement: str | None = None
    shards_requeued: int | None = None
    capacity_lost: float | None = None  # share of the job's capacity it took (ETTR weight)
    checkpoint: CheckpointRef | None = None
    samples_replayed: int | None = None
    rollback_s: float | None = None  # the rollback's (or partial recovery's) own time
    restarts: int | None = None
    updates_lost: int | None = None  # ids a replaced PS had applied since its checkpoint (partial)

    @property
    def cause_class(self) -> CauseClass:
        return CAUSE_OF_KIND[self.kind]

    def to_dict(self) -> dict[str, Any]:
        """The summary's row: the fields set, enums as their values."""
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "actor": self.actor,
            "node": self.node,
            "at_s": self.at_s,
            "detected_s": self.detected_s,
            "cause": self.cause,
            "cause_class": self.cause_class.value,
            "handled_s": self.handled_s,
            "recovered_s": self.recovered_s,
        }
        for name in ("replacement", "shards_requeued", "capacity_lost", "samples_replayed", "rollback_s", "restarts", "updates_lost"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.checkpoint is not None:
            out["checkpoint"] = asdict(self.checkpoint)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> "Failure":
        """A row written by :meth:`to_dict` (a restarted master reads its own)."""
        plain = {f.name for f in fields(cls)} - {"kind", "checkpoint"}
        ckpt = row.get("checkpoint")
        return cls(
            kind=FailureKind(row["kind"]),
            checkpoint=CheckpointRef(int(ckpt["seq"]), float(ckpt["at_s"]), str(ckpt["source"])) if ckpt else None,
            **{k: row[k] for k in plain if k in row},
        )


@dataclass(frozen=True)
class LostPs:
    """The parameter servers found dead: embedding PS by id, and whether the dense PS."""

    ps: tuple[int, ...] = ()
    dense: bool = False

    def __bool__(self) -> bool:
        return bool(self.ps) or self.dense

    def __or__(self, other: "LostPs") -> "LostPs":
        return LostPs(tuple(sorted(set(self.ps) | set(other.ps))), self.dense or other.dense)
