"""JobSpec: the YAML a data scientist writes, validated by pydantic.

Every model forbids unknown keys so that a typo (``batchsize:``) is an error naming the
field instead of a silently ignored setting. :func:`load_spec` turns pydantic's
multi-line report into one line: ``<file>: <dotted.field>: <problem>``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import Field, ValidationError, model_validator

from dlrover.data.data_spec import DataSpec
from dlrover.data.layout import DataLayout, check_layout
from dlrover.data.schema import FeaturesSpec, Schema
from dlrover.model.spec import ModelSpec
from dlrover.errors import SpecError, format_validation_error
from dlrover.optimizer_spec import DenseSync, OptimizerSpec
from dlrover.spec_base import SpecSection, set_dotted
from dlrover.table_spec import check_capacities
from dlrover.tracking.spec import TrackingSpec


class ResourceSpec(SpecSection):
    workers: int = Field(2, ge=1)
    ps: int = Field(2, ge=1)
    worker_cpu: float = Field(1.0, gt=0)
    ps_cpu: float = Field(1.0, gt=0, description="CPUs reserved per PS; it computes on one thread, the rest is headroom (RPC, migration)")
    worker_memory_mb: int = Field(2048, ge=64)
    ps_memory_mb: int = Field(2048, ge=64)
    # GPUs per worker: its DLRM runs on CUDA, pooled embeddings go to the device once per
    # step and their gradient back; all PS stay on CPU (the DLRover / PERSIA hybrid).
    worker_gpu: int = Field(0, ge=0, le=8)
    dense_ps: int = Field(1, ge=1, le=16, description="dense PS actors, each holding a slice of the MLP parameters")
    dense_ps_cpu: float = Field(0.25, ge=0, description="CPUs each dense PS reserves, counted in budget_cpu")
    budget_cpu: float | None = Field(None, gt=0)
    budget_memory_mb: int | None = Field(None, gt=0)
    # The master kills an actor whose RSS goes over its memory (as a container's limit
    # would): memory-pressure prediction must act before that.
    enforce_memory: bool = True

    @property
    def dense_cpu(self) -> float:
        """CPUs the dense PS holds for the whole job."""
        return self.dense_ps * self.dense_ps_cpu

    @property
    def elastic_budget_cpu(self) -> float | None:
        """``budget_cpu`` less the dense PS: what the policy may give workers and PS."""
        return None if self.budget_cpu is None else self.budget_cpu - self.dense_cpu

    @model_validator(mode="after")
    def _budget(self) -> "ResourceSpec":
        cpu = self.workers * self.worker_cpu + self.ps * self.ps_cpu + self.dense_cpu
        if self.budget_cpu is not None and cpu > self.budget_cpu + 1e-9:
            raise ValueError(f"budget_cpu: {self.budget_cpu} is below the requested {cpu:g} CPUs (workers, PS and dense PS)")
        mem = self.workers * self.worker_memory_mb + self.ps * self.ps_memory_mb
        if self.budget_memory_mb is not None and mem > self.budget_memory_mb:
            raise ValueError(f"budget_memory_mb: {self.budget_memory_mb} is below the requested {mem} MB")
        return self


class PolicySpec(SpecSection):
    """Allocation policy: who decides the job's resources while it runs.

    ``static`` keeps the request; ``dlrover_rm`` is the three-stage elastic policy;
    ``optimus`` grows by greedy marginal gain per dominant resource share; ``scripted``
    replays fixed steps (tests, benchmarks). ``config`` is a policy YAML
    (``policies/<name>.yaml``); ``knobs`` override single knobs of it inline.
    """

    name: Literal["static", "dlrover_rm", "optimus", "scripted"] = "static"
    config: str | None = None
    knobs: dict[str, Any] = Field(default_factory=dict)
    interval_s: float = Field(2.0, gt=0, description="how often the master asks the policy")
    warmup_s: float = Field(4.0, ge=0, description="after a change, seconds before throughput counts")
    history_dir: str | None = Field(None, description="history store of finished jobs (warm start); default ~/.dlrover/history")
    # live: rescale while training goes on (the platform's way). restart: stop at shard
    # boundaries, checkpoint to disk, relaunch everything, restore (the baseline that
    # `dlrover bench elastic` compares against).
    rescale: Literal["live", "restart"] = "live"
    standby: int = Field(0, ge=0, le=4, description="pre-started spare workers and PS kept idle so a scale-out skips actor start-up (they hold their resources)")
    placement: Literal["default", "pal"] = Field("default", description="where new actors go: Ray's choice, or pal (fastest node class with room)")
    max_lag_s: float | None = Field(None, gt=0, description="data.follow with dlrover_rm: the least CPU that keeps the lag under this (s)")


class CheckpointSpec(SpecSection):
    """Checkpoints for fault recovery, and the trained model.

    In-memory checkpoints (every ``memory_interval_s``: a consistent cut of PS vshards with
    optimizer state, dense parameters and the shard queue, kept in the Ray object store)
    serve PS recovery; durable ones (``dir``, a directory or fsspec URL; default the run
    directory) serve master restarts and the loss of a node with its objects (and all
    recovery with ``keep_in_memory: false``). ``interval_s: auto``: Young-Daly spacing,
    sqrt(2 x write time / failure rate), ``prior_mttf_s`` until a failure is seen.
    With ``dir`` set the trained model also goes to ``<dir>/<job_id>/final.pt``.
    """

    dir: str | None = None
    memory_interval_s: float = Field(10.0, ge=0, description="in-memory checkpoint period (0: only at start)")
    interval_s: float | Literal["auto"] = Field("auto", description="durable checkpoint period in seconds, or auto (Young-Daly)")
    min_interval_s: float = Field(20.0, gt=0)
    max_interval_s: float = Field(600.0, gt=0)
    prior_mttf_s: float = Field(3600.0, gt=0, description="mean time to failure assumed before any is observed")
    keep: int = Field(3, ge=1, description="durable checkpoints kept")
    keep_in_memory: bool = Field(True, description="false: a checkpoint leaves the object store once on disk (models that fill it)")
    # recover: replace what failed, roll back only when PS state is lost (the platform).
    # restart: every failure restarts the whole job from its last durable checkpoint (the
    # baseline `dlrover bench recovery` compares against, as Ray Train does).
    on_failure: Literal["recover", "restart"] = "recover"
    max_failures: int = Field(20, ge=0, description="the job fails after this many failures")
    # Durable checkpoints are incremental (rows pushed since the previous one), a full one
    # every ``full_every``. ``quantize``: embedding weights as fp16 or int8 (per-row scale
    # and offset), optimizer state fp32. See docs/FAULTS.md, "Incremental checkpoints".
    full_every: int = Field(5, ge=1, le=1000, description="every Nth durable checkpoint is full, the others deltas")
    quantize: Literal["none", "fp16", "int8"] = Field("none", description="embedding weights written as fp32, fp16 or int8")

    @model_validator(mode="after")
    def _interval(self) -> "CheckpointSpec":
        if isinstance(self.interval_s, float) and self.interval_s <= 0:
            raise ValueError("interval_s: must be > 0 or auto")
        if self.min_interval_s > self.max_interval_s:
            raise ValueError("min_interval_s: must be <= max_interval_s")
        return self


class RecoverySpec(SpecSection):
    """What a lost embedding PS costs (a lost dense PS always rolls the job back).

    ``partial``: only the dead PS's vshards go back to the newest checkpoint; the other PS,
    the dense PS and the workers keep their state, and the updates the dead PS had applied
    since that checkpoint are counted as ``updates_lost``. ``rollback``: the whole job goes
    back to the checkpoint and retrains the samples since (nothing lost, more replayed).
    See docs/FAULTS.md, "Partial PS recovery".
    """

    ps: Literal["partial", "rollback"] = "partial"


class TrainSpec(SpecSection):
    """How a worker trains. ``staleness`` 1 overlaps the embedding pull of step i+1 with
    step i (bounded staleness of one step); 0 pulls only after the previous push landed."""

    staleness: Literal[0, 1] = 1
    max_staleness: int | None = Field(None, ge=0, le=8, description="adaptive pull-ahead: pulls may run up to this many batches ahead while they keep training waiting (slow links); default: staleness (fixed)")
    vshards: int = Field(64, ge=1, le=65536)
    threads_per_worker: int | None = Field(None, ge=1)
    log_every_s: float = Field(2.0, gt=0)
    # An actor silent this long (no probe answer, or a worker's shard leases not renewed
    # by progress) is declared hung, killed and replaced. Default: sized for the step time.
    liveness_timeout_s: float | None = Field(None, gt=0)
    # One shard in flight across all workers, each started from the latest dense
    # parameters: the run is a pure function of the data order, however many workers
    # and PS come and go (slow; for reproducibility checks).
    deterministic: bool = False
    dense_sync: DenseSync = Field("async", description="dense PS: each gradient alone, or one step per round of all workers' (sync) or all but stragglers' (coded)")
    stragglers: int = Field(1, ge=0, description="coded: gradients a round may go without")

    @model_validator(mode="after")
    def _deterministic(self) -> "TrainSpec":
        if self.deterministic and (self.staleness != 0 or self.dense_sync != "async"):
            raise ValueError("deterministic: true needs staleness: 0 and dense_sync: async")
        if self.max_staleness is not None and self.max_staleness < self.staleness:
            raise ValueError(f"max_staleness: {self.max_staleness} is below staleness: {self.staleness}")
        if self.max_staleness and self.staleness == 0:
            raise ValueError(f"max_staleness: {self.max_staleness} needs staleness: 1 (staleness 0 pulls only after the previous push landed)")
        return self

    def vshards_for(self, ps: int) -> int:
        """The vshards of a job that starts with ``ps`` PS: at least one for each."""
        return max(self.vshards, ps)

    @property
    def pull_ahead_bound(self) -> int:
        """The most batches a worker's pulls may run ahead (``max_staleness``, else ``staleness``)."""
        return self.staleness if self.max_staleness is None else self.max_staleness


class ChaosEvent(SpecSection):
    """A fault injected on purpose ``at_s`` seconds after the job's actors first started
    (master restarts do not count), to test what the platform does. ``kill``: the actor
    dies. ``slow``: it runs ``factor`` times slower. ``leak``: its memory grows by
    ``mb_per_s``. ``delay``: a PS answers each pull and push ``ms`` later, busy meanwhile (a
    slow server). ``latency``: a PS's answers reach every worker ``ms`` after its pulls went
    out, the PS free meanwhile (a slow link).
    ``target``: ``worker:i`` the i-th running worker (launch order), ``ps:i`` the i-th PS,
    ``master`` (its process exits; Ray restarts it), ``node:i`` the i-th node of the
    cluster (by node id) with the job's actors on it (not the master's node's master and
    dense PS). An actor the job can never have (:meth:`JobSpec.max_actors`) is an error.
    """

    at_s: float = Field(ge=0)
    action: Literal["kill", "slow", "leak", "delay", "latency"]
    target: str = Field(pattern=r"^((worker|ps|node):[0-9]+|master)$")
    factor: float = Field(3.0, gt=1, description="slow: how many times slower")
    mb_per_s: float = Field(50.0, gt=0, description="leak: growth of RSS (MB/s)")
    ms: float = Field(50.0, gt=0, description="delay: added to each PS pull and push; latency: a pull's round trip (ms)")

    @model_validator(mode="after")
    def _supported(self) -> "ChaosEvent":
        if self.action != "kill" and (self.target == "master" or self.target.startswith("node:")):
            raise ValueError(f"target: {self.target} can only be killed")
        if self.action in ("delay", "latency") and not self.target.startswith("ps:"):
            raise ValueError(f"target: {self.target}: {self.action} applies to a PS (ps:i)")
        return self

    def role_index(self) -> tuple[str, int]:
        role, _, i = self.target.partition(":")
        return role, int(i or 0)


class PublishSpec(SpecSection):
    """Model versions published while the job trains (docs/CONTINUOUS.md): every
    ``every_s`` a cut, written to ``dir`` as a full model every ``full_every`` versions and
    otherwise as the embedding rows changed since the previous version."""

    dir: str = Field(min_length=1, description="a local directory; versions go to v00000001/, v00000002/, ...")
    every_s: float = Field(300.0, gt=0)
    full_every: int = Field(12, ge=1, le=10_000)
    quantize: Literal["none", "fp16", "int8"] = Field("none", description="embedding weights written as fp32, fp16 or int8")


class JobSpec(SpecSection):
    name: str = Field("job", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = 0
    features: FeaturesSpec | None = None  # the data's columns; default: Criteo's layout
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    chaos: list[ChaosEvent] = Field(default_factory=list)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    publish: PublishSpec | None = None

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> "JobSpec":
        """The spec in a YAML file, validated; ``overrides`` (``{"data.epochs": 1}``) are set
        before validation, as ``dlrover run --set`` does."""
        return load_spec(path, overrides)

    def with_overrides(self, overrides: Mapping[str, Any]) -> "JobSpec":
        """A copy with dotted fields changed (``{"data.epochs": 1, "resources.ps": 2}``),
        validated again as a whole: the same checks as the YAML's."""
        return spec_from_dict(self.model_dump(mode="json", exclude_unset=True), f"{self.name} with overrides", overrides)

    def max_actors(self, role: Literal["worker", "ps"]) -> int:
        """The most workers (or PS) the job can ever run at once: the request under the
        static policy; otherwise as many of the requested size as fit the CPU budget
        (the request's CPUs without one), PS at most one per vshard."""
        r = self.resources
        count, cpu = (r.workers, r.worker_cpu) if role == "worker" else (r.ps, r.ps_cpu)
        if self.policy.name != "static":
            budget = r.elastic_budget_cpu or r.workers * r.worker_cpu + r.ps * r.ps_cpu
            count = max(count, math.floor(budget / cpu + 1e-9))
        return min(count, self.train.vshards) if role == "ps" else count

    @property
    def schema(self) -> Schema:
        """The feature schema every part of the job follows (:mod:`dlrover.data.schema`).
        Resolved on each use, not cached: ``model_copy(update=...)`` must not keep a stale one."""
        return self.model.schema(self.features, npy=self.data.format == "torchrec_npy")

    def model_short(self) -> str:
        return self.model.short(self.schema)

    def layout(self) -> DataLayout:
        """What the readers need to know of the data files."""
        d = self.data
        return DataLayout(self.schema, d.format, d.header, d.delimiter, tuple(d.columns) if d.columns else None, d.on_long_bag)

    @model_validator(mode="after")
    def _layout(self) -> "JobSpec":
        d = self.data
        check_layout(self.features, d.format, d.header, d.columns)
        self.schema  # resolving it checks model.tables against the features
        check_capacities(self.model.tables, self.train.vshards)  # named as the user keyed them
        return self

    @model_validator(mode="after")
    def _chaos_targets(self) -> "JobSpec":  # (and chaos: a fault aimed at an actor the job never has would test nothing)
        if self.train.dense_sync != "async" and self.resources.dense_ps > 1:  # each shard would form its rounds apart: they can deadlock
            raise ValueError(f"train.dense_sync: {self.train.dense_sync} needs resources.dense_ps: 1 (got {self.resources.dense_ps})")
        for i, ev in enumerate(self.chaos):
            role, index = ev.role_index()
            if role in ("worker", "ps") and index >= (most := self.max_actors(role)):
                noun = "workers" if role == "worker" else "PS"
                why = "policy static keeps the request" if self.policy.name == "static" else "as many as fit its CPU budget"
                raise ValueError(f"chaos.{i}.target: {ev.target} never exists: this job runs at most {most} {noun} ({why})")
        return self

    @model_validator(mode="after")
    def _publishable(self) -> "JobSpec":
        if self.publish is not None and self.schema.dynamic():
            raise ValueError("publish: not with dynamic tables (model.tables.*.kind: dynamic) yet: their id maps are not published")
        return self

    @model_validator(mode="after")
    def _stream_never_restarts(self) -> "JobSpec":  # a ray_data job's trained blocks are released, and its master owns the rest
        if self.data.source == "ray_data":
            restarts = {"checkpoint.on_failure: restart": self.checkpoint.on_failure == "restart", "policy.rescale: restart": self.policy.rescale == "restart"}
            if bad := [k for k, v in restarts.items() if v]:
                raise ValueError(f"{bad[0]}: replays rows from a checkpoint, which a ray_data job cannot (its trained blocks are released)")
            if any(ev.target == "master" for ev in self.chaos):
                raise ValueError("chaos: master: a ray_data job's master owns its blocks; it is not restarted")
        return self


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``--set key=value`` items as ``{key: value}``, each value read as YAML (``3``,
    ``[64, 16]``, ``null``; what YAML cannot read stays a string)."""
    if bad := [item for item in items or [] if "=" not in item]:
        raise SpecError(f"--set {bad[0]}: expected key=value")
    out: dict[str, Any] = {}
    for key, raw in (item.split("=", 1) for item in items or []):
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def spec_from_dict(doc: Any, source: str = "<spec>", overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """Validate a spec's document (``overrides`` set in it first, see ``with_overrides``);
    a problem is a one-line :class:`SpecError`: ``<source>: <dotted.field>: <problem>``."""
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: expected a YAML mapping at the top level")
    set_dotted(doc, overrides or {})
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(source, e)) from None


def read_yaml(path: str | Path, what: str = "spec") -> Any:
    """``yaml.safe_load`` of a file; a problem is a :class:`SpecError` naming file(:line)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{path}: {what} file not found")
    try:
        return yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: cannot read {what}: {e.__class__.__name__}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise SpecError(f"{where}: {problem}") from None


def load_spec(path: str | Path, overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """Read and validate a job spec (``JobSpec.from_yaml``); raises :class:`SpecError`
    with a one-line message."""
    return spec_from_dict(read_yaml(path, "spec"), str(path), overrides)
