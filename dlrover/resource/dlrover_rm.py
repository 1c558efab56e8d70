"""``dlrover_rm``: the three-stage DLRover-RM allocation policy (VLDB'24, arXiv 2304.01468).

Stage 1, warm start (``initial``): the newest similar finished job's best measured
configuration, clipped to the budget, and its measurements seed this job's performance
model; without history, the request (or ``default_config``).

Stage 2, model-driven scaling (``decide``, once the running configuration has been
measured for ``profile_window_s`` and ``cooldown_s`` passed since the last change): search
the configurations within the budget for the one that maximises the *utility*

    U(c) = ln T(c)  -  min_gain_per_cpu * cpu(c)  -  min_elasticity * ln cpu(c)

where ``T`` is the throughput: measured where the job ran ``c``, else the model's
prediction calibrated (scaled) to the measured throughput of the running configuration.
A step that adds CPU is taken iff it raises throughput by at least ``min_gain_per_cpu``
(relative, compounding: ln-ratio) per added CPU; a step that frees CPU iff it loses less
than that per freed CPU. Measuring the gain relative to the throughput *where the step
starts* matters: with a fixed reference (the throughput at the start of the search) the
end point depends on where the search began, and a job scaled up from a small config
would then be scaled back down from the big one, and so on. ``U`` is one potential for
every step, so the greedy search is plain hill climbing on it (no cycles), the point it
stops at proposes nothing when it runs, and ``search: grid`` takes the grid's maximum.
E.g. for throughput linear in CPUs, d ln T / d cpu = 1 / cpu, so a bar of 0.05 stops
adding CPUs at 20, from below and from above. That absolute price suits a job of a few
cores; for jobs of hundreds of cores ``min_elasticity`` is the scale-free price: a step is
worth taking iff throughput grows at least ``min_elasticity`` times as fast as the CPUs
(d ln T / d ln cpu), e.g. 0.5: doubling the CPUs must bring >= 41% more samples/s.

The result is proposed only if it gains more than ``min_gain`` (or, for a move that frees
CPU, raises ``U`` by ``min_gain``), and the time saved over ``view.remaining_s`` beats
``move_cost_s``. If the running configuration measures worse than the best measured one
by more than ``min_gain`` the policy goes back to the best ("revert", the correction of a
change the model got wrong). A configuration measured worse than the best is never
proposed again for more throughput, by construction rather than by a blacklist: the
search uses its measured throughput, and with no revert due (``T_now >= best / (1 +
min_gain)``) such a configuration measures below ``T_now``, so with as many CPUs or more
its utility is below the running one's. It may come back only as a move that frees CPU,
when its measured throughput says the CPUs it saves were not worth their price.

Stage 3, runtime correction (every tick, before stage 2): memory pressure (RSS plus trend
over ``oom_horizon_s`` reaches ``mem_high_watermark`` of the limit: more memory for that
role, or one more PS when PS memory cannot grow), stragglers (slow for
``straggler_window_s``: replace), hot PS (imbalanced: rebalance vshards; single or all hot:
one more PS or bigger PS, whichever the model prefers). Corrections found at one tick
are merged into one plan.

``max_changes`` bounds model-driven changes (and, separately, reverts) per job against
oscillation; ``max_corrections`` bounds corrections. A budget that shrank below what runs
is always obeyed at once. Every plan fits ``view.budget``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from dlrover.resource.perf_model import throughput, throughput_rows
from dlrover.resource.plan import Budget, Config, JobView, Policy, ResourcePlan
from dlrover.resource.policy_config import DLRoverRMKnobs

Key = tuple[int, int, float, float]


def _key(c: Config) -> Key:
    return (c.workers, c.ps, float(c.worker_cpu), float(c.ps_cpu))


def describe_change(old: Config, new: Config) -> str:
    """``2w x 1cpu + 1ps x 1cpu -> 4w x 1cpu + 1ps x 1cpu``, with memory when it changes."""

    def mem(c: Config) -> str:
        return f" (worker {c.worker_memory_mb} MB, PS {c.ps_memory_mb} MB)"

    same_mem = (old.worker_memory_mb, old.ps_memory_mb) == (new.worker_memory_mb, new.ps_memory_mb)
    return f"{old.short()}{'' if same_mem else mem(old)} -> {new.short()}{'' if same_mem else mem(new)}"


def clip_to_budget(config: Config, budget: Budget) -> Config:
    """The largest-looking configuration like ``config`` that fits ``budget``.

    Counts are first capped by ``max_workers`` / ``max_ps``; then, while over budget, one
    actor of the role holding the larger share of the violated resource is dropped (at
    least one worker and one PS stay); if one worker and one PS still do not fit, their
    sizes shrink proportionally.
    """
    c = config.replace(workers=max(1, min(config.workers, budget.max_workers)), ps=max(1, min(config.ps, budget.max_ps)))
    while not c.fits(budget):
        cpu_over = c.cpu / budget.cpu if budget.cpu > 0 else math.inf
        mem_over = c.memory_mb / budget.memory_mb if budget.memory_mb > 0 else math.inf
        if cpu_over >= mem_over:
            worker_share, ps_share = c.workers * c.worker_cpu, c.ps * c.ps_cpu
        else:
            worker_share, ps_share = c.workers * c.worker_memory_mb, c.ps * c.ps_memory_mb
        if c.workers > 1 and (worker_share >= ps_share or c.ps == 1):
            c = c.replace(workers=c.workers - 1)
        elif c.ps > 1:
            c = c.replace(ps=c.ps - 1)
        else:
            break
    if c.cpu > budget.cpu + 1e-9 and budget.cpu > 0:
        f = budget.cpu / c.cpu * (1 - 1e-9)
        c = c.replace(worker_cpu=c.worker_cpu * f, ps_cpu=c.ps_cpu * f)
    if c.memory_mb > budget.memory_mb and budget.memory_mb > 0:
        f = budget.memory_mb / c.memory_mb
        c = c.replace(worker_memory_mb=int(c.worker_memory_mb * f), ps_memory_mb=int(c.ps_memory_mb * f))
    return c


def _round_mb(mb: float) -> int:
    return max(256, int(math.ceil(mb / 64.0) * 64))


def _with_memory(key: Key, like: Config, ps_rss_mb: float = 0.0, watermark: float = 0.9) -> Config:
    """``key`` with ``like``'s memory sizes; except that with fewer PS, when the tables the
    PS hold now (``ps_rss_mb`` each) spread over fewer would pass ``watermark`` of their
    memory, each PS gets enough. (Keeping the size otherwise lets the scaler keep the PS
    it has: a PS of another size is a new actor and a vshard migration.)"""
    ps_mem = like.ps_memory_mb
    if key[1] < like.ps and ps_rss_mb > 0:
        need = ps_rss_mb * like.ps / key[1] / watermark
        if need > ps_mem:
            ps_mem = int(math.ceil(need / 64) * 64)
    return Config(key[0], key[1], key[2], key[3], like.worker_memory_mb, ps_mem)


def _ps_rss(view: JobView, horizon_s: float) -> float:
    """The largest PS RSS the job reports, extrapolated along its trend over ``horizon_s``
    as the memory correction does (MB; 0 when unknown)."""
    return max((a.rss_mb + max(0.0, a.rss_trend_mb_per_s) * horizon_s for a in view.actors.values() if a.role == "ps"), default=0.0)


class DLRoverRMPolicy(Policy):
    """See the module docstring. One object per job: it counts changes and cooldowns."""

    name = "dlrover_rm"

    def __init__(self, knobs: DLRoverRMKnobs | None = None) -> None:
        self.knobs = knobs or DLRoverRMKnobs()
        self.changes = 0  # model-driven changes
        self.reverts = 0
        self.corrections = 0
        self._last_correction: dict[str, float] = {}  # correction key -> job time planned
        self._nothing_at: tuple | None = None  # inputs of the last model search that found nothing
        self._counted: str | None = None  # the counter the last plan used: "changes" | "reverts" | "corrections"

    # ------------------------------------------------------------------ stage 1

    def initial(self, view: JobView) -> ResourcePlan:
        k = self.knobs
        records = [r for r in view.history if r.best_config is not None and r.best_throughput > 0] if k.warm_start else []
        if records:
            rec = records[0]
            best = rec.best_config
            assert best is not None
            # Memory the last run had to grow to (OOM corrections) carries over.
            wanted = best.replace(
                worker_memory_mb=max(best.worker_memory_mb, rec.final_config.worker_memory_mb),
                ps_memory_mb=max(best.ps_memory_mb, rec.final_config.ps_memory_mb),
            )
            wanted = self._right_size_memory(wanted, rec)
            config = clip_to_budget(wanted, view.budget)
            if config.ps != wanted.ps:  # clipped to fewer PS: each holds more of the tables
                config = clip_to_budget(self._right_size_memory(config, rec), view.budget)
            points = self._seed(view, records[: k.history_records])
            reason = (
                f"warm start from {rec.job_id}: its best measured {best.short()} at {rec.best_throughput:.0f} samples/s"
                + (f", clipped to the budget: {config.short()}" if config != wanted else "")
                + f"; model seeded with {points} measurement(s)"
            )
            return ResourcePlan(config, reason, stage="warm_start", predicted_throughput=self._predict_one(view, config))
        if k.start_from_request:
            wanted, what = (view.requested or view.config), "the requested"
        else:
            wanted, what = k.default_config.to_config(), "the default"
        config = clip_to_budget(wanted, view.budget)
        reason = f"no similar finished job: start from {what} {wanted.short()}"
        if config != wanted:
            reason += f", clipped to the budget: {config.short()}"
        return ResourcePlan(config, reason, stage="")

    def _right_size_memory(self, config: Config, rec) -> Config:
        """With ``memory_headroom``: memory from the similar job's peak RSS (per worker, and
        all PS together spread over this config's PS) times the headroom, instead of what
        it was given. Users over-request memory; the RSS trend correction (stage 3) covers
        a job that needs more than its predecessor."""
        h = self.knobs.memory_headroom
        peak = rec.peak_rss_mb or {}
        if h is None:
            return config
        out = config
        if peak.get("worker", 0) > 0:
            out = out.replace(worker_memory_mb=_round_mb(peak["worker"] * h))
        if peak.get("ps_total", 0) > 0:
            out = out.replace(ps_memory_mb=_round_mb(peak["ps_total"] / config.ps * h))
        return out

    def _seed(self, view: JobView, records: Iterable) -> int:
        """Observe the records' measurements into ``view.model``.

        Weighted like the master weighs this job's own windows (by duration, in seconds),
        times ``history_weight``: an old measurement counts that fraction of an equally
        long one of this job, so this job's own windows soon dominate the fit.
        """
        n = 0
        for rec in records:
            points = [(c, t, d if d > 0 else 1.0) for c, t, d in rec.measured()]
            if not points and rec.perf_model:
                points = [
                    (
                        Config(int(p["workers"]), int(p["ps"]), float(p["worker_cpu"]), float(p["ps_cpu"])),
                        float(p["throughput"]),
                        float(p.get("weight", 1.0)),
                    )
                    for p in rec.perf_model.get("points", [])
                    if isinstance(p, dict) and {"workers", "ps", "worker_cpu", "ps_cpu", "throughput"} <= p.keys()
                ]
            for config, thr, weight in points:
                try:
                    view.model.observe(config, thr, weight=self.knobs.history_weight * weight)
                    n += 1
                except (ValueError, TypeError):  # a junk point in an old record must not fail the job
                    continue
        return n

    # ------------------------------------------------------------------ decide

    def decide(self, view: JobView) -> ResourcePlan | None:
        self._counted = None
        return self._budget_guard(view) or self._correct(view) or self._scale(view)

    def rejected(self, plan: ResourcePlan, why: str) -> None:
        """A plan the runtime could not carry out does not use up ``max_changes``."""
        if self._counted is not None:
            setattr(self, self._counted, max(0, getattr(self, self._counted) - 1))
            self._counted = None

    def _budget_guard(self, view: JobView) -> ResourcePlan | None:
        """The budget shrank below what runs: the fastest (by the model) fewer-actor config
        that fits, else :func:`clip_to_budget`."""
        if view.config.fits(view.budget):
            return None
        cur, b = view.config, view.budget
        options = [
            cur.replace(workers=w, ps=p)
            for w in range(1, min(cur.workers, b.max_workers) + 1)
            for p in range(1, min(cur.ps, b.max_ps) + 1)
        ]
        options = [c for c in options if c.fits(b)]
        if options:
            try:
                config = options[int(np.argmax(view.model.predict_many(options)))]
            except Exception:  # noqa: BLE001 - fall back to the model-free clip
                config = clip_to_budget(cur, b)
        else:
            config = clip_to_budget(cur, b)
        return ResourcePlan(
            config,
            f"budget is now {b.cpu:g} CPU / {b.memory_mb} MB (max {b.max_workers}w, {b.max_ps}ps): {describe_change(view.config, config)}",
            stage="correction",
        )

    # ------------------------------------------------------------------ stage 3

    def _ready(self, key: str, now: float) -> bool:
        last = self._last_correction.get(key)
        return last is None or now - last >= self.knobs.correction_cooldown_s

    def _correct(self, view: JobView) -> ResourcePlan | None:
        k = self.knobs
        if self.corrections >= k.max_corrections or not view.actors:
            return None
        now = view.now_s
        config = view.config
        reasons: list[str] = []
        replace: list[str] = []
        rebalance = False
        marks: list[str] = []

        # Memory pressure first: an OOM kill costs the most.
        for name, a in sorted(view.actors.items()):
            if a.memory_limit_mb <= 0 or a.role not in ("worker", "ps"):
                continue
            trend = max(0.0, a.rss_trend_mb_per_s)
            high = a.memory_limit_mb * k.mem_high_watermark
            if a.rss_mb + trend * k.oom_horizon_s < high or not self._ready(f"mem:{name}", now):
                continue
            field = "worker_memory_mb" if a.role == "worker" else "ps_memory_mb"
            crossing = 0.0 if a.rss_mb >= high else (high - a.rss_mb) / trend
            pressure = (
                f"memory: {name} RSS {a.rss_mb:.0f} MB"
                + (f" rising {trend:.1f} MB/s" if trend > 0 else "")
                + (f" reaches {k.mem_high_watermark:.0%} of its {a.memory_limit_mb} MB limit in ~{crossing:.0f}s" if crossing > 0 else f" is over {k.mem_high_watermark:.0%} of its {a.memory_limit_mb} MB limit")
            )
            role_mem = getattr(config, field)
            if role_mem > a.memory_limit_mb:  # the role already got more memory; this actor still has the old size
                replace.append(name)
                reasons.append(f"{pressure}: move it to the planned {role_mem} MB")
                marks.append(f"mem:{name}")
                continue
            target = min(math.ceil(a.memory_limit_mb * k.mem_growth_factor), a.memory_limit_mb + k.mem_max_step_mb)
            target = int(math.ceil(target / 64) * 64)
            grown = config.replace(**{field: max(role_mem, target)})
            if not grown.fits(view.budget):
                count = config.workers if a.role == "worker" else config.ps
                others = config.memory_mb - count * role_mem
                affordable = int((view.budget.memory_mb - others) // count // 64 * 64)
                grown = config.replace(**{field: affordable}) if affordable > a.memory_limit_mb else None
            if grown is not None and grown.fits(view.budget):
                config = grown
                replace.append(name)
                new_mem = getattr(grown, field)
                reasons.append(f"{pressure}: {a.role} memory {role_mem} -> {new_mem} MB" + (" (budget cap)" if new_mem < target else ""))
                marks.append(f"mem:{name}")
                continue
            more_ps = config.replace(ps=config.ps + 1)
            if a.role == "ps" and more_ps.fits(view.budget):
                config = more_ps
                reasons.append(f"{pressure}: no budget for more PS memory, add a PS to spread the embeddings")
                marks.append(f"mem:{name}")

        # Stragglers: the one slow the longest, if there is a healthy median to compare with.
        workers = [a for a in view.actors.values() if a.role == "worker"]
        if max(config.workers, len(workers)) >= 2:
            slow = [
                a
                for a in workers
                if a.slow_since_s is not None
                and now - a.slow_since_s >= k.straggler_window_s
                and a.name not in replace
                and self._ready(f"straggler:{a.name}", now)
            ]
            if slow and len(slow) < len(workers):
                a = min(slow, key=lambda x: (x.slow_since_s, x.name))
                times = [w.step_time_s for w in workers if w.step_time_s > 0]
                median = float(np.median(times)) if times else 0.0
                detail = f" (step {a.step_time_s:.3f}s vs median {median:.3f}s)" if a.step_time_s > 0 and median > 0 else ""
                replace.append(a.name)
                reasons.append(f"straggler: {a.name} slow for {now - a.slow_since_s:.0f}s{detail}: replace it")
                marks.append(f"straggler:{a.name}")

        # Hot PS.
        ps = [a for a in view.actors.values() if a.role == "ps"]
        if ps:
            hot = max(ps, key=lambda x: x.busy)
            mean = float(np.mean([a.busy for a in ps]))
            if hot.busy >= k.hot_ps_busy:
                if len(ps) > 1 and mean > 0 and hot.busy / mean >= k.hot_ps_imbalance:
                    if self._ready("ps:rebalance", now):
                        rebalance = True
                        reasons.append(f"hot PS: {hot.name} busy {hot.busy:.0%} vs mean {mean:.0%}: rebalance vshards by load")
                        marks.append("ps:rebalance")
                elif self._ready("ps:scale", now):
                    grown_ps = self._bigger_ps(view, config)
                    why = "the only PS" if len(ps) == 1 else f"all PS hot (mean {mean:.0%})"
                    if grown_ps is not None:
                        reasons.append(f"hot PS: {hot.name} busy {hot.busy:.0%}, {why}: {describe_change(config, grown_ps)}")
                        config = grown_ps
                        marks.append("ps:scale")

        if not reasons:
            return None
        self.corrections += 1
        self._counted = "corrections"
        for m in marks:
            self._last_correction[m] = now
        predicted = self._predict_one(view, config) if _key(config) != _key(view.config) else None
        return ResourcePlan(config, "; ".join(reasons), stage="correction", predicted_throughput=predicted, replace=replace, rebalance_ps=rebalance)

    def _bigger_ps(self, view: JobView, config: Config) -> Config | None:
        """One more PS, or the next PS CPU size, whichever the model predicts faster."""
        k = self.knobs
        max_ps = min(view.budget.max_ps, k.max_ps or view.budget.max_ps)
        options = []
        if config.ps + 1 <= max_ps:
            options.append(config.replace(ps=config.ps + 1))
        bigger = [c for c in k.ps_cpu_choices if c > config.ps_cpu + 1e-9]
        if bigger:
            options.append(config.replace(ps_cpu=bigger[0]))
        options = [c for c in options if c.fits(view.budget)]
        if not options:
            return None
        pred = view.model.predict_many(options)
        return options[int(np.argmax(pred))]  # ties: the first, i.e. one more PS

    # ------------------------------------------------------------------ stage 2

    def _predict_one(self, view: JobView, config: Config) -> float | None:
        try:
            return float(view.model.predict(config))
        except Exception:  # noqa: BLE001 - a prediction is informational here
            return None

    @staticmethod
    def _measured(view: JobView) -> dict[Key, float]:
        """Duration-weighted mean measured throughput per configuration (current window included)."""
        acc: dict[Key, list[float]] = {}
        windows = list(view.measurements) + ([view.current] if view.current is not None else [])
        for m in windows:
            if m.throughput <= 0:
                continue
            w = max(m.duration_s, 1e-3)
            s = acc.setdefault(_key(m.config), [0.0, 0.0])
            s[0] += w * m.throughput
            s[1] += w
        return {key: s[0] / s[1] for key, s in acc.items()}

    def _scale(self, view: JobView) -> ResourcePlan | None:
        k = self.knobs
        cur_win = view.current
        if cur_win is None or cur_win.duration_s < k.profile_window_s or cur_win.throughput <= 0:
            return None
        if view.now_s - view.last_change_s < k.cooldown_s:
            return None
        if view.remaining_s is not None and view.remaining_s < k.min_remaining_s:
            return None
        cur = view.config
        measured = self._measured(view)
        t_now = measured.get(_key(cur), cur_win.throughput)
        best_key = max(measured, key=lambda x: measured[x])
        best_thr = measured[best_key]

        # Runtime correction "revert": the running config measures clearly worse than one we ran.
        if best_key != _key(cur) and best_thr > t_now * (1 + k.min_gain) and self.reverts < k.max_changes:
            back = _with_memory(best_key, cur, _ps_rss(view, k.oom_horizon_s), k.mem_high_watermark)
            if back.fits(view.budget):
                self.reverts += 1
                self._counted = "reverts"
                return ResourcePlan(
                    back,
                    f"revert: {cur.short()} measures {t_now:.0f} samples/s, {1 - t_now / best_thr:.0%} below "
                    f"{back.short()} measured at {best_thr:.0f} samples/s",
                    stage="correction",
                    predicted_throughput=best_thr,
                )

        if self.changes >= k.max_changes:
            return None
        return self._model_step(view, cur, measured, t_now)

    def _model_step(self, view: JobView, cur: Config, measured: dict[Key, float], t_now: float) -> ResourcePlan | None:
        """Stage 2 proper: search the utility's maximum and propose it if it is worth a move."""
        k = self.knobs
        # A search over the same model, measurements, memory and budget as one that found
        # the running config best would find it again: skip it (the simulator asks every tick).
        ps_rss = _ps_rss(view, k.oom_horizon_s)
        memo = (
            view.model.n_points, _key(cur), cur.ps_memory_mb, round(math.log(t_now), 2), view.budget, round(math.log1p(ps_rss) * 20),  # RSS in 5% steps
            tuple(sorted((x, round(math.log(v), 2)) for x, v in measured.items())),
        )  # fmt: skip
        if memo == self._nothing_at:
            return None
        pred_cur = self._predict_one(view, cur)
        calib = t_now / pred_cur if pred_cur and pred_cur > 0 else 1.0
        bar = k.min_gain_per_cpu

        def thr_of(keys: list[Key]) -> np.ndarray:
            if not keys:
                return np.zeros(0)
            pred = throughput_rows(view.model.params, np.asarray(keys), view.model.batch_size) * calib  # memory does not enter the model
            return np.array([measured.get(x, p) for x, p in zip(keys, pred)], dtype=np.float64)

        kappa = k.min_elasticity

        def utility(keys: list[Key]) -> np.ndarray:
            cpu = np.array([x[0] * x[2] + x[1] * x[3] for x in keys], dtype=np.float64)
            return np.log(np.maximum(thr_of(keys), 1e-12)) - bar * cpu - kappa * np.log(cpu)

        max_w = min(view.budget.max_workers, k.max_workers or view.budget.max_workers)
        max_p = min(view.budget.max_ps, k.max_ps or view.budget.max_ps)
        wcpus = sorted(set(k.worker_cpu_choices) | {float(cur.worker_cpu)})
        pcpus = sorted(set(k.ps_cpu_choices) | {float(cur.ps_cpu)})

        def ok(x: Key) -> bool:
            return 1 <= x[0] <= max_w and 1 <= x[1] <= max_p and _with_memory(x, cur, ps_rss, k.mem_high_watermark).fits(view.budget)

        start = _key(cur)
        if k.search == "grid":
            target = self._grid_best(view, start, max_w, max_p, wcpus, pcpus, measured, calib, t_now, bar, kappa, ps_rss, k.mem_high_watermark)
        else:
            target = self._hill_climb(start, ok, utility, wcpus, pcpus)
        if target == start:
            self._nothing_at = memo
            return None

        new = _with_memory(target, cur, ps_rss, k.mem_high_watermark)
        t_new = float(thr_of([target])[0])
        gain = t_new / t_now - 1
        d_cpu = new.cpu - cur.cpu
        d_u = float(utility([target])[0] - utility([start])[0])
        if gain > k.min_gain:
            if view.remaining_s is not None:
                samples_left = view.remaining_s * t_now
                if k.move_cost_s + samples_left / t_new >= view.remaining_s:
                    return None
            reason = (
                f"model: {cur.short()} -> {new.short()}: predicted {t_new:.0f} samples/s ({gain:+.0%}) "
                f"vs {t_now:.0f} measured, {d_cpu:+g} CPU"
            )
        elif d_cpu < 0 and d_u >= k.min_gain:
            reason = (
                f"model: {cur.short()} -> {new.short()}: frees {-d_cpu:g} CPU for a predicted {gain:+.0%} "
                f"throughput ({t_new:.0f} vs {t_now:.0f} samples/s; bar {bar:.0%} per CPU)"
            )
        else:
            return None
        self.changes += 1
        self._counted = "changes"
        return ResourcePlan(new, reason, stage="model", predicted_throughput=t_new)

    @staticmethod
    def _grid_best(
        view: JobView, start: Key, max_w: int, max_p: int, wcpus: list[float], pcpus: list[float],
        measured: dict[Key, float], calib: float, t_now: float, bar: float, kappa: float = 0.0, ps_rss: float = 0.0,
        watermark: float = 0.9,
    ) -> Key:
        """The grid point of highest utility (vectorised: the grid may hold ~10^5 points)."""
        cur, b = view.config, view.budget
        axes = (np.arange(1, max_w + 1.0), np.arange(1, max_p + 1.0), np.array(wcpus, dtype=np.float64), np.array(pcpus, dtype=np.float64))
        w, p, cw, cp = (x.ravel() for x in np.meshgrid(*axes, indexing="ij"))
        cpu = w * cw + p * cp
        need = ps_rss * cur.ps / p / watermark
        ps_mem = np.where((p < cur.ps) & (need > cur.ps_memory_mb), np.ceil(need / 64) * 64, cur.ps_memory_mb)  # as _with_memory
        fit = (cpu <= b.cpu + 1e-9) & (w * cur.worker_memory_mb + p * ps_mem <= b.memory_mb)
        w, p, cw, cp, cpu = w[fit], p[fit], cw[fit], cp[fit], cpu[fit]
        if len(w) == 0:
            return start
        batch = getattr(view.model, "batch_size", view.batch_size)
        thr = np.asarray(throughput(view.model.params, w, p, cw, cp, batch), dtype=np.float64).ravel() * calib
        u = np.log(np.maximum(thr, 1e-12)) - bar * cpu - kappa * np.log(cpu)
        for x, thr_x in measured.items():  # a handful of points
            at = (w == x[0]) & (p == x[1]) & (cw == x[2]) & (cp == x[3])
            x_cpu = x[0] * x[2] + x[1] * x[3]
            u[at] = math.log(thr_x) - bar * x_cpu - kappa * math.log(x_cpu)
        i = int(np.argmax(u))
        start_cpu = start[0] * start[2] + start[1] * start[3]
        u_start = math.log(measured.get(start, t_now)) - bar * start_cpu - kappa * math.log(start_cpu)
        if u[i] <= u_start + 1e-12:
            return start
        return (int(w[i]), int(p[i]), float(cw[i]), float(cp[i]))

    @staticmethod
    def _hill_climb(start: Key, ok, utility, wcpus: list[float], pcpus: list[float]) -> Key:
        """Greedy marginal gain: take the best one-step move while it raises the utility."""

        def step(values: list[float], v: float, d: int) -> float | None:
            i = values.index(v) + d
            return values[i] if 0 <= i < len(values) else None

        x, ux = start, float(utility([start])[0])
        seen = {start}
        for _ in range(1000):
            moves: list[Key] = []
            w, p, cw, cp = x
            moves += [(w + 1, p, cw, cp), (w - 1, p, cw, cp), (w, p + 1, cw, cp), (w, p - 1, cw, cp)]
            for d in (1, -1):
                ncw, ncp = step(wcpus, cw, d), step(pcpus, cp, d)
                if ncw is not None:
                    moves.append((w, p, ncw, cp))
                if ncp is not None:
                    moves.append((w, p, cw, ncp))
            moves = [m for m in moves if m not in seen and ok(m)]
            if not moves:
                break
            u = utility(moves)
            i = int(np.argmax(u))
            if u[i] <= ux + 1e-12:
                break
            x, ux = moves[i], float(u[i])
            seen.add(x)
        return x
