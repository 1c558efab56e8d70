"""What a worker gets of the job spec (``WorkerSpec``), and its torch threads."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlrover.data.layout import DataLayout
from dlrover.spec import JobSpec, ModelSpec


@dataclass(frozen=True)
class WorkerSpec:
    """The part of the job spec a worker uses (it gets nothing else)."""

    model: ModelSpec
    layout: DataLayout  # the feature schema and how the files hold it
    seed: int
    batch_size: int
    on_bad_line: str
    staleness: int
    max_staleness: int  # adaptive pull-ahead's bound (= staleness: fixed)
    deterministic: bool
    log_every_s: float
    device: str = "cpu"  # where the DLRM runs: "cuda" with resources.worker_gpu
    dense_rounds: bool = False  # train.dense_sync is sync or coded

    @classmethod
    def of(cls, spec: JobSpec) -> "WorkerSpec":
        d, t = spec.data, spec.train
        device = "cuda" if spec.resources.worker_gpu else "cpu"
        return cls(spec.model, spec.layout(), spec.seed, d.batch_size, d.on_bad_line, t.staleness, t.pull_ahead_bound, t.deterministic, t.log_every_s, device, t.dense_sync != "async")


def worker_threads(cpu: float, override: int | None) -> int:
    """Torch threads of an actor given ``cpu`` CPUs: ``override``, else one per CPU begun."""
    return override or max(1, math.ceil(cpu))
