"""Policy knobs: one strict pydantic model per policy, loaded from ``policies/<name>.yaml``.

A policy file is::

    name: dlrover_rm
    knobs:
      min_gain: 0.05
      ...

Knobs not in the file take the defaults below (which equal ``policies/<name>.yaml``, a
test checks it); the job spec's ``policy`` section may override single knobs. Like the
job spec, every model forbids unknown keys, so a typo is a one-line :class:`SpecError`
naming the file and the dotted knob (``policies/x.yaml: knobs.min_gian: unknown field``).

Knobs that a tuner may vary carry their search space in the field's JSON schema:
``{"search": [low, high], "type": "int" | "float"}`` for a numeric range,
``{"search": {"choices": [...]}, "type": "categorical"}`` for a categorical one (see
:func:`knob_search_space`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from dlrover.errors import SpecError, format_validation_error
from dlrover.resource.configs import Config
from dlrover.spec import read_yaml
from dlrover.spec_base import SpecSection

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


def _range(low: float, high: float, log: bool = False) -> dict:
    """A numeric search range; integer if both ends are ints; ``log``: sampled on a log
    scale (times and windows that span orders of magnitude between a minutes-long test
    job and an hours-long production one)."""
    kind = "int" if isinstance(low, int) and isinstance(high, int) else "float"
    return {"search": [low, high], "type": kind, **({"log": True} if log else {})}


def _choices(*values: Any) -> dict:
    return {"search": {"choices": list(values)}, "type": "categorical"}


# --------------------------------------------------------------------------- static


class StaticKnobs(SpecSection):
    """``static`` has no knobs: it keeps the resources the job spec asked for."""


# --------------------------------------------------------------------------- scripted


class ScriptStep(SpecSection):
    """One queued decision: when it fires and what it changes (unset fields are kept)."""

    at_progress: float | None = Field(None, ge=0.0, le=1.0, description="fire once this fraction of the samples is done")
    at_s: float | None = Field(None, ge=0.0, description="fire at this job time (s)")
    after_window_s: float | None = Field(None, gt=0.0, description="fire once the running config was measured this long (s)")
    workers: int | None = Field(None, ge=1, description="new number of workers")
    ps: int | None = Field(None, ge=1, description="new number of parameter servers")
    worker_cpu: float | None = Field(None, gt=0, description="CPUs per worker")
    ps_cpu: float | None = Field(None, gt=0, description="CPUs per PS")
    worker_memory_mb: int | None = Field(None, ge=64, description="memory per worker (MB)")
    ps_memory_mb: int | None = Field(None, ge=64, description="memory per PS (MB)")
    rebalance_ps: bool = Field(False, description="spread vshards over the PS by measured load")
    replace: list[str] = Field(default_factory=list, description="actor names to swap for fresh ones")

    @model_validator(mode="after")
    def _one_trigger(self) -> "ScriptStep":
        if sum(x is not None for x in (self.at_progress, self.at_s, self.after_window_s)) != 1:
            raise ValueError("exactly one of at_progress, at_s, after_window_s")
        return self

    def changes(self) -> dict[str, Any]:
        keys = ("workers", "ps", "worker_cpu", "ps_cpu", "worker_memory_mb", "ps_memory_mb")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class ScriptedKnobs(SpecSection):
    """``scripted``: a fixed list of decisions for tests and benchmarks."""

    steps: list[ScriptStep] = Field(default_factory=list, description="decisions, fired once each, in order")


# --------------------------------------------------------------------------- dlrover_rm


class ConfigKnob(SpecSection):
    """A resource configuration written in a policy file."""

    workers: int = Field(2, ge=1, description="workers")
    ps: int = Field(1, ge=1, description="parameter servers")
    worker_cpu: float = Field(1.0, gt=0, description="CPUs per worker")
    ps_cpu: float = Field(1.0, gt=0, description="CPUs per PS")
    worker_memory_mb: int = Field(2048, ge=64, description="memory per worker (MB)")
    ps_memory_mb: int = Field(2048, ge=64, description="memory per PS (MB)")

    def to_config(self) -> Config:
        return Config(**self.model_dump())


class PriorKnob(SpecSection):
    """Prior coefficients of the step-time model (``dlrover.resource.perf_model.PerfParams``):
    what the job's model predicts before its own measurements say otherwise. Fit them to
    the history of your cluster's jobs; the built-in prior suits the 2-core dev machine."""

    t0: float = Field(ge=0, description="fixed per-step overhead (s)")
    t1: float = Field(ge=0, description="worker compute: t1 * B / cw")
    t2: float = Field(ge=0, description="PS compute: t2 * w / (p * cp)")
    t3: float = Field(ge=0, description="PS communication: t3 * w / p")
    t4: float = Field(ge=0, description="shared contention: t4 * w")
    t5: float = Field(0.0, ge=0, description="host over-commit: t5 * B * max(0, w * cw + p * cp - cores)")
    t6: float = Field(0.0, ge=0, description="threads over the cores in each other's way: t6 * B * max(0, w * cw + p * cp - cores)**2")
    model_config = ConfigDict(allow_inf_nan=False)  # merged with SpecSection's

    @model_validator(mode="after")
    def _not_all_zero(self) -> "PriorKnob":
        if self.t0 + self.t1 + self.t2 + self.t3 + self.t4 <= 0:
            raise ValueError("t0..t4 must not all be zero")
        return self


def _cpu_choices(v: list[float]) -> list[float]:
    if not v or any(x <= 0 for x in v):
        raise ValueError("needs at least one CPU size, each > 0")
    return sorted({float(x) for x in v})


class DLRoverRMKnobs(SpecSection):
    """``dlrover_rm``: warm start, model-driven scaling, runtime correction.

    Knobs with a search range are the ones ``dlrover tune`` varies: those that move JCT,
    utilisation and OOM kills in the simulator. The others keep their file values (a
    30-trial study over all twenty found nothing better than the defaults)."""

    # Stage 1: warm start
    warm_start: bool = Field(True, description="start from the best measured config of similar finished jobs")
    history_records: int = Field(
        1, ge=1, le=50, description="newest similar records whose measurements seed the model"
    )
    history_weight: float = Field(
        0.5, gt=0, le=1, description="weight of a history measurement relative to an equally long one of this job"
    )
    start_from_request: bool = Field(True, description="without history: start from the spec's resources (else default_config)")
    default_config: ConfigKnob = Field(default_factory=ConfigKnob, description="start config without history or request")
    model_prior: PriorKnob | None = Field(None, description="prior of the job's performance model (null: the built-in one)")
    memory_headroom: float | None = Field(
        None, gt=1, le=4, description="warm start sizes memory as the similar job's peak RSS x this (null: keep its memory)",
        json_schema_extra=_range(1.1, 2.0),
    )

    # Stage 2: model-driven scaling
    profile_window_s: float = Field(
        10.0, ge=0, description="measure a config this long (after warm-up) before scaling", json_schema_extra=_range(5.0, 1800.0, log=True)
    )
    cooldown_s: float = Field(10.0, ge=0, description="least time between two config changes (s)", json_schema_extra=_range(5.0, 3600.0, log=True))
    min_gain: float = Field(
        0.05, ge=0, description="least predicted relative throughput gain worth a change", json_schema_extra=_range(0.01, 0.3)
    )
    min_gain_per_cpu: float = Field(
        0.05, ge=0, description="least relative throughput gain per added CPU (cost efficiency)", json_schema_extra=_range(0.0, 0.05)
    )
    min_elasticity: float = Field(
        0.0, ge=0, lt=1, description="scale-free CPU price: a step must grow throughput >= this x as fast as CPUs (d ln T / d ln cpu)",
        json_schema_extra=_range(0.0, 0.9),
    )
    move_cost_s: float = Field(
        10.0, ge=0, description="training time lost by one reconfiguration (s)"
    )
    min_remaining_s: float = Field(
        20.0, ge=0, description="no model-driven change when the job ends sooner than this (s)"
    )
    search: Literal["greedy", "grid"] = Field(
        "greedy", description="greedy: hill-climb from the current config; grid: best point of the whole grid",
    )
    max_workers: int | None = Field(None, ge=1, description="cap on workers (null: the budget's)")
    max_ps: int | None = Field(None, ge=1, description="cap on parameter servers (null: the budget's)")
    worker_cpu_choices: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0], description="CPU sizes a worker may get")
    ps_cpu_choices: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0], description="CPU sizes a PS may get")
    max_changes: int = Field(6, ge=0, description="most model-driven changes and reverts per job", json_schema_extra=_range(1, 20))
    explore: float = Field(
        0.0, ge=-5, le=5, description="weight of the model's uncertainty: an unmeasured config is valued at its predicted throughput x "
        "exp(explore x the model's relative uncertainty there). > 0: optimism, a move to measure what the model is unsure of; "
        "< 0: caution, a move only where even the pessimistic prediction gains; 0: the prediction alone",
        json_schema_extra=_range(-2.0, 2.0),
    )

    # Stage 2 for a followed stream (JobView.stream): the least CPU that keeps the lag bound
    stream_headroom: float = Field(0.2, ge=0, le=5, description="size for the arrival rate x (1 + this)", json_schema_extra=_range(0.0, 1.0))
    stream_scale_in_margin: float = Field(
        0.3, ge=0, le=5, description="scale in only to a config predicted this much above what the stream needs", json_schema_extra=_range(0.05, 1.0)
    )

    # Stage 3: runtime correction
    straggler_factor: float = Field(
        1.5, gt=1, description="a worker is slow while its step time exceeds this x the workers' median, a PS while its busy time per id served exceeds this x the PS's median",
    )
    straggler_window_s: float = Field(
        20.0, ge=0, description="replace a worker or PS slow for this long (s)", json_schema_extra=_range(5.0, 1800.0, log=True)
    )
    hot_ps_busy: float = Field(0.9, gt=0, le=1, description="a PS this busy (fraction of wall time) is hot")
    hot_ps_imbalance: float = Field(
        1.5, ge=1, description="max/mean PS busy at or above this: rebalance vshards"
    )
    mem_high_watermark: float = Field(
        0.9, gt=0, le=1, description="act when RSS is predicted to reach this fraction of the limit"
    )
    oom_horizon_s: float = Field(
        120.0, ge=0, description="how far ahead the RSS trend is extrapolated (s)", json_schema_extra=_range(30.0, 3600.0, log=True)
    )
    mem_growth_factor: float = Field(1.5, gt=1, description="memory multiplier when raising a role's memory")
    mem_max_step_mb: int = Field(8192, ge=64, description="largest single memory raise (MB)")
    correction_cooldown_s: float = Field(
        30.0, ge=0, description="least time between two corrections of the same kind and actor (s)"
    )
    max_corrections: int = Field(20, ge=0, description="most runtime corrections per job")

    @field_validator("worker_cpu_choices", "ps_cpu_choices")
    @classmethod
    def _cpus(cls, v: list[float]) -> list[float]:
        return _cpu_choices(v)


# --------------------------------------------------------------------------- optimus


class OptimusKnobs(SpecSection):
    """``optimus``: greedy marginal gain per dominant resource share (Optimus, EuroSys'18)."""

    start: Literal["minimal", "request"] = Field(
        "minimal", description="initial config: minimal = 1 worker + 1 PS of the requested sizes (grow from there); request = the spec's resources",
        json_schema_extra=_choices("minimal", "request"),
    )
    profile_window_s: float = Field(
        10.0, ge=0, description="measure a config this long (after warm-up) before deciding from it (s)", json_schema_extra=_range(5.0, 300.0)
    )
    cooldown_s: float = Field(10.0, ge=0, description="least time between two config changes (s)", json_schema_extra=_range(5.0, 600.0))
    min_gain: float = Field(
        0.05, ge=0, description="least predicted relative throughput gain worth a change; a change that frees CPU may lose less than this",
        json_schema_extra=_range(0.01, 0.3),
    )
    min_gain_per_share: float = Field(
        0.5, ge=0,
        description=(
            "least relative throughput gain of one added actor per dominant share of the budget it takes "
            "(0.5: an actor taking 1/32 of the budget must add >= 1.6%; a job that scales linearly still fills its "
            "budget, since there an actor adds >= its share; a saturating one stops once an actor adds < half its share)"
        ),
        json_schema_extra=_range(0.0, 4.0),
    )
    max_changes: int = Field(6, ge=0, description="most model-driven changes per job", json_schema_extra=_range(1, 20))
    max_workers: int | None = Field(None, ge=1, description="cap on workers (null: the budget's)")
    max_ps: int | None = Field(None, ge=1, description="cap on parameter servers (null: the budget's)")
    model_prior: PriorKnob | None = Field(None, description="prior of the job's performance model (null: the built-in one)")


KNOBS: dict[str, type[BaseModel]] = {"static": StaticKnobs, "scripted": ScriptedKnobs, "dlrover_rm": DLRoverRMKnobs, "optimus": OptimusKnobs}


def _file_model(name: str) -> type[BaseModel]:
    knobs = KNOBS[name]
    return create_model(  # type: ignore[call-overload]
        f"{name}_policy_file",
        __config__=ConfigDict(extra="forbid"),
        name=(str, ...),
        knobs=(knobs, Field(default_factory=knobs)),
    )


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _prefixed(source: str, err: ValidationError, prefix: str) -> str:
    line = format_validation_error(source, err)
    head = f"{source}: "
    return head + prefix + line[len(head):] if prefix and line.startswith(head) else line


def _read_file(name: str, path: str) -> dict:
    doc = read_yaml(path, "policy")
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a YAML mapping with name: and knobs:")
    if "name" not in doc:
        raise SpecError(f"{path}: name: missing (expected name: {name})")
    if doc["name"] != name:
        raise SpecError(f"{path}: name: file is for policy {doc['name']!r}, not {name!r}")
    if doc.get("knobs") is None:
        doc["knobs"] = {}
    try:
        _file_model(name).model_validate(doc)
    except ValidationError as e:
        raise SpecError(format_validation_error(str(path), e)) from None
    return doc


def load_knobs(
    name: str, config_path: str | None = None, overrides: dict | None = None, overrides_source: str = "job spec"
) -> BaseModel:
    """Validated knobs of policy ``name``: defaults < ``config_path`` file < ``overrides``.

    ``overrides`` is a knobs mapping (the job spec's ``policy.knobs``); an error in it is
    reported as ``<overrides_source>: policy.knobs.<knob>: <problem>``.
    """
    if name not in KNOBS:
        raise SpecError(f"policy.name: unknown policy {name!r} (known: {', '.join(sorted(KNOBS))})")
    model = KNOBS[name]
    raw: dict = {}
    if config_path is not None:
        raw = _read_file(name, config_path)["knobs"]
    if overrides is None:
        return model.model_validate(raw)
    if not isinstance(overrides, dict):
        raise SpecError(f"{overrides_source}: policy.knobs: expected a mapping of knob: value")
    try:
        return model.model_validate(_merge(raw, overrides))
    except ValidationError as e:
        raise SpecError(_prefixed(overrides_source, e, "policy.knobs.")) from None


def knob_search_space(name: str) -> dict[str, dict]:
    """Tunable knobs of policy ``name``: ``{knob: {"search": [low, high] | {"choices": [...]}, ...}}``."""
    out = {}
    for key, f in KNOBS[name].model_fields.items():
        extra = f.json_schema_extra
        if isinstance(extra, dict) and "search" in extra:
            out[key] = dict(extra)
    return out
