"""Tune a policy's knobs on the cluster simulator (``dlrover tune``).

Policy knobs (windows, cooldowns, gain bars...) decide how well elastic allocation works,
and their best values depend on the cluster and its jobs. Trying them on a live cluster
costs days; the simulator replays a trace in seconds, so an Optuna study can search the
knobs that :func:`dlrover.resource.policy_config.knob_search_space` declares tunable and
write the best as a policy file that ``dlrover run`` and ``dlrover simulate`` accept.

The base config (by default ``policies/cluster/<policy>.yaml``) is always the first trial,
so the written config is never worse than the default on the tuning trace; a held-out
trace tells whether the gain generalises. Studies in a storage (``sqlite:///tune.db``)
resume: running again adds trials.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml

from dlrover.errors import DLRoverError, SpecError
from dlrover.resource.policy_config import knob_search_space, load_knobs
from dlrover.sim import cluster_policy_config, simulate
from dlrover.sim.cluster import ClusterSpec
from dlrover.sim.job import SimSettings
from dlrover.sim.report import metrics


def _jct(m: dict) -> float:
    rate, jct = m["completion_rate"], m["jct_mean_s"]
    if not rate or not math.isfinite(jct) or not math.isfinite(rate):
        return math.inf
    return float(jct / rate)


def _cost(m: dict) -> float:
    v = float(m["cpu_hours"])
    return v if math.isfinite(v) else math.inf


# name -> (description, metrics dict -> value to minimise)
OBJECTIVES: dict[str, tuple[str, Callable[[dict], float]]] = {
    "jct": ("mean JCT of completed jobs / completion rate (s; failing slow jobs does not pay)", _jct),
    "cost": ("CPU-hours held by all jobs", _cost),
}
ATTRS = ("jct_mean_s", "completion_rate", "cpu_hours", "cpu_util", "mem_util")
SIG_DIGITS = 4  # knobs are rounded to this many significant digits before a trial runs


@dataclass
class TuneResult:
    policy: str
    objectives: list[str]
    n_trials: int  # trials in the study, earlier runs of a resumed study included
    baseline: dict  # objective values of the base config on the tuning trace
    best: dict  # objective values of the chosen trial on the tuning trace
    best_knobs: dict  # the full knobs mapping (written to ``out_path``)
    pareto: list[dict] = field(default_factory=list)  # [{"trial", "values", "params"}]; single objective: [best]
    out_path: str | None = None
    holdout: dict | None = None  # {"base": {obj: v}, "tuned": {obj: v}, "improvement": {obj: relative change}}
    base_config: str | None = None
    study_name: str = ""
    chosen_trial: int = 0
    base_knobs: dict = field(default_factory=dict)  # the full knobs mapping of the base config

    def to_dict(self) -> dict:
        return asdict(self)


def _round(v: Any) -> Any:
    if isinstance(v, float) and math.isfinite(v) and v != 0:
        return float(f"{v:.{SIG_DIGITS}g}")
    return v


def _values(m: dict, objectives: list[str]) -> dict[str, float]:
    return {o: OBJECTIVES[o][1](m) for o in objectives}


def _fmt(name: str, v: float) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v / 3600:.3f}h" if name == "jct" else f"{v:,.0f} CPU-h"


def _fingerprint(trace: pd.DataFrame, policy: str, base: dict, cluster: ClusterSpec | None, settings: SimSettings | None, seed: int) -> str:
    h = hashlib.sha256()
    h.update(pd.util.hash_pandas_object(trace, index=False).to_numpy().tobytes())
    h.update(repr((policy, sorted(map(str, trace.columns)), base, cluster, settings, seed)).encode())
    return h.hexdigest()[:16]


def _suggest(trial: optuna.Trial, space: dict[str, dict], skip: set[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, s in space.items():
        if name in skip:
            continue
        if s["type"] == "categorical":
            params[name] = trial.suggest_categorical(name, s["search"]["choices"])
        elif s["type"] == "int":
            lo, hi = s["search"]
            params[name] = trial.suggest_int(name, int(lo), int(hi), log=bool(s.get("log")))
        else:
            lo, hi = s["search"]
            params[name] = trial.suggest_float(name, float(lo), float(hi), log=bool(s.get("log")))
    return params


def _widen(space: dict[str, dict], base: dict) -> dict[str, dict]:
    """Stretch each knob's range (or choices) to hold the base config's value, so the
    base trial lies inside the searched space (a base file may go beyond the declared
    ranges; a log range is not stretched down to 0)."""
    out = {}
    for name, s in space.items():
        s = {**s}
        v = base.get(name)
        if v is not None:
            if s["type"] == "categorical":
                if v not in s["search"]["choices"]:
                    s["search"] = {"choices": [*s["search"]["choices"], v]}
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and not (s.get("log") and v <= 0):
                lo, hi = s["search"]
                s["search"] = [min(lo, type(lo)(v)), max(hi, type(hi)(v))]
        out[name] = s
    return out


def _choose(front: list[optuna.trial.FrozenTrial], baseline: list[float] | None) -> optuna.trial.FrozenTrial:
    """Multi-objective pick: among Pareto trials no worse than the baseline on objectives
    2..k, the best on objective 1 (ties: then objectives 2..k, then the earlier trial).
    Since the baseline is a trial, it or a trial dominating it qualifies, so the pick is
    never worse than the base config on any objective; without a finite baseline, the
    best on objective 1 of the whole front."""
    def key(t: optuna.trial.FrozenTrial) -> tuple:
        return (tuple(t.values), t.number)

    if baseline is not None and all(math.isfinite(b) for b in baseline):
        ok = [t for t in front if all(v <= b for v, b in zip(t.values[1:], baseline[1:]))]
        if ok:
            return min(ok, key=key)
    return min(front, key=key)


def _write_yaml(out: Path, policy: str, knobs: dict, header: list[str]) -> None:
    """Atomically write the policy file, validating the temporary copy first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump({"name": policy, "knobs": knobs}, sort_keys=False, default_flow_style=False, width=120)
    text = "".join(f"# {h}\n" if h else "#\n" for h in header) + body
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".yaml", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            load_knobs(policy, tmp)
        except SpecError as e:
            raise SpecError(f"{out}: tuned policy file does not validate: {str(e).replace(tmp, str(out))}") from None
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def tune(
    policy: str,
    trace: pd.DataFrame,
    trials: int,
    objectives: list[str] | tuple[str, ...] = ("jct",),
    storage: str | None = None,
    study_name: str | None = None,
    base_config: str | None = None,
    cluster: ClusterSpec | None = None,
    settings: SimSettings | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    holdout: pd.DataFrame | None = None,
    log: Callable[[str], None] | None = print,
) -> TuneResult:
    """Search ``policy``'s tunable knobs with ``trials`` simulations of ``trace``.

    Knobs: built-in defaults < ``base_config`` (default ``policies/cluster/<policy>.yaml``
    when it exists) < the trial's values of the searched knobs. One objective: TPE, the
    chosen config is the best trial. Several: multi-objective TPE (sample-efficient at
    the tens of trials a simulation budget allows, where NSGA-II's populations of 50 would
    barely finish one generation), the chosen config by :func:`_choose`. ``out``: write
    the full knobs mapping there as a policy file; ``holdout``: simulate that trace with
    the base and the tuned knobs and report both.
    """
    objectives = list(objectives)
    if not objectives:
        raise DLRoverError(f"tune: no objective given (known: {', '.join(OBJECTIVES)})")
    bad = [o for o in objectives if o not in OBJECTIVES]
    if bad:
        raise DLRoverError(f"tune: unknown objective {bad[0]!r} (known: {', '.join(OBJECTIVES)})")
    if len(set(objectives)) != len(objectives):
        raise DLRoverError(f"tune: objective listed twice in {','.join(objectives)}")
    if not isinstance(trials, int) or trials < 1:
        raise DLRoverError(f"tune: trials must be >= 1, got {trials}")
    base_config = cluster_policy_config(policy, base_config)
    base = load_knobs(policy, base_config).model_dump()  # also rejects an unknown policy
    space = knob_search_space(policy)
    if not space:
        raise DLRoverError(f"policy {policy} has no tunable knobs")
    space = _widen(space, base)
    say = log or (lambda _s: None)

    name = study_name or f"dlrover-{policy}-{'-'.join(objectives)}"
    fp = _fingerprint(trace, policy, base, cluster, settings, seed)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        # The sampler is set once the study's size is known: a resumed study's sampler gets a
        # fresh seed, or its random start-up trials would repeat the earlier run's.
        study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True, directions=["minimize"] * len(objectives))
        done_before = len(study.trials)
        if done_before:
            prev = study.user_attrs
            if prev.get("objectives", objectives) != objectives:
                raise DLRoverError(f"study {name}: was tuned for {','.join(prev['objectives'])}, not {','.join(objectives)}; pick another study name")
            if prev.get("fingerprint", fp) != fp:
                raise DLRoverError(
                    f"study {name}: earlier trials ran on another trace, cluster, base config or seed; pick another study name"
                )
        study.sampler = optuna.samplers.TPESampler(seed=seed + done_before)
        study.set_user_attr("objectives", objectives)
        study.set_user_attr("fingerprint", fp)
        study.set_user_attr("policy", policy)
        study.set_user_attr("base_config", base_config)
        if not done_before:
            # The base config is trial 0; nullable knobs it leaves unset (null) are not
            # sampled in that trial, so it is exactly the default.
            study.enqueue_trial({k: base[k] for k in space if base.get(k) is not None}, user_attrs={"baseline": True})

        def objective(trial: optuna.Trial) -> list[float] | float:
            is_base = bool(trial.user_attrs.get("baseline"))
            skip = {k for k in space if base.get(k) is None} if is_base else set()
            params = {k: _round(v) for k, v in _suggest(trial, space, skip).items()}
            if is_base:  # exactly the base values, unrounded
                params = {k: base[k] for k in params}
            trial.set_user_attr("params", params)
            try:
                load_knobs(policy, base_config, params, overrides_source="tune")
            except SpecError as e:
                trial.set_user_attr("error", str(e))
                raise optuna.TrialPruned(str(e)) from None
            m = metrics(simulate(trace, policy, policy_config=base_config, knobs=params, cluster=cluster, settings=settings, seed=seed))
            for k in ATTRS:
                trial.set_user_attr(k, float(m[k]))
            vals = [OBJECTIVES[o][1](m) for o in objectives]
            return vals[0] if len(vals) == 1 else vals

        def progress(st: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
            n = t.number + 1 - done_before
            head = f"trial {n}/{trials} (#{t.number}{', base config' if t.user_attrs.get('baseline') else ''})"
            if t.state != optuna.trial.TrialState.COMPLETE:
                say(f"{head}: {t.state.name.lower()} {t.user_attrs.get('error', '')}".rstrip())
                return
            now = "  ".join(f"{o}={_fmt(o, v)}" for o, v in zip(objectives, t.values))
            if len(objectives) == 1:
                bt = st.best_trial
                say(f"{head}: {now}  | best {_fmt(objectives[0], bt.values[0])} (#{bt.number})")
            else:
                say(f"{head}: {now}  | Pareto front: {len(st.best_trials)}")

        with warnings.catch_warnings():  # "fixed parameter out of range": a base value a log range cannot hold
            warnings.filterwarnings("ignore", message="Fixed parameter", category=UserWarning)
            study.optimize(objective, n_trials=trials, callbacks=[progress])
    finally:
        optuna.logging.set_verbosity(verbosity)

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise DLRoverError(f"study {name}: no trial completed")
    base_trial = next((t for t in complete if t.user_attrs.get("baseline")), None)
    baseline = dict(zip(objectives, base_trial.values)) if base_trial else {o: math.nan for o in objectives}

    def entry(t: optuna.trial.FrozenTrial) -> dict:
        return {"trial": t.number, "values": dict(zip(objectives, t.values)), "params": dict(t.user_attrs.get("params", t.params))}

    if len(objectives) == 1:
        chosen = study.best_trial
        pareto = [entry(chosen)]
    else:
        front = sorted(study.best_trials, key=lambda t: (tuple(t.values), t.number))
        chosen = _choose(front, base_trial.values if base_trial else None)
        pareto = [entry(t) for t in front]
    best_params = dict(chosen.user_attrs.get("params", chosen.params))
    best_knobs = {**base, **best_params}
    best = dict(zip(objectives, chosen.values))

    out_path = None
    if out is not None:
        out_p = Path(out)
        stamp = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        header = [
            f"generated by dlrover tune on {stamp}",
            f"policy {policy}, base config {base_config or 'built-in defaults'}",
            f"tuning trace: {len(trace)} jobs; study {name}: {len(study.trials)} trials, chosen #{chosen.number}, seed {seed}",
            *[f"{o}: base {_fmt(o, baseline[o])} -> tuned {_fmt(o, best[o])}{_rel(baseline[o], best[o])}" for o in objectives],
            "",
        ]
        _write_yaml(out_p, policy, best_knobs, header)
        out_path = str(out_p)

    hold = None
    if holdout is not None:
        say(f"holdout: {len(holdout)} jobs, base and tuned")
        mb = metrics(simulate(holdout, policy, policy_config=base_config, cluster=cluster, settings=settings, seed=seed))
        if out_path is not None:  # the file as written is what a user will run
            mt = metrics(simulate(holdout, policy, policy_config=out_path, cluster=cluster, settings=settings, seed=seed))
        else:
            mt = metrics(simulate(holdout, policy, policy_config=base_config, knobs=best_knobs, cluster=cluster, settings=settings, seed=seed))
        vb, vt = _values(mb, objectives), _values(mt, objectives)
        hold = {"base": vb, "tuned": vt, "improvement": {o: _relv(vb[o], vt[o]) for o in objectives}}

    return TuneResult(
        policy=policy,
        objectives=objectives,
        n_trials=len(study.trials),
        baseline=baseline,
        best=best,
        best_knobs=best_knobs,
        pareto=pareto,
        out_path=out_path,
        holdout=hold,
        base_config=base_config,
        study_name=name,
        chosen_trial=chosen.number,
        base_knobs=base,
    )


def _relv(base: float, new: float) -> float:
    """Relative change ``new / base - 1`` (negative: lower, i.e. better); nan if undefined."""
    if not (math.isfinite(base) and math.isfinite(new)) or base == 0:
        return math.nan
    return new / base - 1


def _rel(base: float, new: float) -> str:
    r = _relv(base, new)
    return "" if math.isnan(r) else f" ({r:+.1%})"


def print_tune(result: TuneResult) -> None:
    """Human-readable report: objectives base vs tuned, changed knobs, Pareto front, holdout."""
    r = result
    print(f"tuned {r.policy} ({', '.join(r.objectives)}), study {r.study_name}: {r.n_trials} trials, chosen #{r.chosen_trial}")
    print(f"base config: {r.base_config or 'built-in defaults'}")
    w = max(len(o) for o in r.objectives) + 2
    print(f"{'':<{w}}{'base':>16}{'tuned':>16}{'change':>9}")
    for o in r.objectives:
        print(f"{o:<{w}}{_fmt(o, r.baseline[o]):>16}{_fmt(o, r.best[o]):>16}{_rel(r.baseline[o], r.best[o]).strip(' ()'):>9}")
    changed = {k: v for k, v in r.best_knobs.items() if r.base_knobs.get(k) != v}
    if changed:
        print("changed knobs (base -> tuned):")
        for k, v in changed.items():
            print(f"  {k:<24}{r.base_knobs.get(k)!s:>10} -> {v!s}")
    else:
        print("no knob changed: no trial beat the base config")
    if len(r.objectives) > 1:
        print(f"Pareto front ({len(r.pareto)} trials; * = written):")
        print(f"  {'trial':>6}" + "".join(f"{o:>16}" for o in r.objectives))
        for p in r.pareto:
            mark = "*" if p["trial"] == r.chosen_trial else " "
            print(f" {mark}{p['trial']:>6}" + "".join(f"{_fmt(o, p['values'][o]):>16}" for o in r.objectives))
    if r.holdout is not None:
        print("holdout trace:")
        for o in r.objectives:
            h = r.holdout
            print(f"  {o:<{w}}{_fmt(o, h['base'][o]):>16}{_fmt(o, h['tuned'][o]):>16}{_rel(h['base'][o], h['tuned'][o]).strip(' ()'):>9}")
    if r.out_path:
        print(f"wrote {r.out_path} (dlrover simulate --policies {r.out_path}; in a job spec: policy.config: {r.out_path})")
