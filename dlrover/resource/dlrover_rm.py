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

Explore or exploit (``explore``, 0 by default): an unmeasured configuration's ``ln T``
gains ``explore x sd``, ``sd`` the performance model's relative uncertainty there (its
Bayesian posterior, ``PerfModel.relative_sd``): small near measured configurations,
large where the prediction rests on the prior. With ``explore`` > 0 the policy moves to
measure a configuration the model is unsure of but could be better (the reason says
"exploring"); with ``explore`` < 0 it moves only where even the pessimistic prediction
gains. A measured configuration's ``sd`` is 0, and a move that measured worse is undone
by the revert.

Stage 3, runtime correction (every tick, before stage 2): memory pressure (RSS plus trend
over ``oom_horizon_s`` reaches ``mem_high_watermark`` of the limit: more memory for that
role, or one more PS when PS memory cannot grow), stragglers (slow for
``straggler_window_s``: replace), hot PS (imbalanced: rebalance vshards; single or all hot:
one more PS or bigger PS, whichever the model prefers). Corrections found at one tick
are merged into one plan.

``max_changes`` bounds model-driven changes (and, separately, reverts) per job against
oscillation; ``max_corrections`` bounds corrections. A budget that shrank below what runs
is always obeyed at once. Every plan fits ``view.budget``.

Stage 2's search is :mod:`dlrover.resource.rm_search`, stage 3's checks are
:mod:`dlrover.resource.rm_correction`; this module holds the policy's decisions and counts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np

from dlrover.resource.configs import Config, clip_to_budget, describe_change
from dlrover.resource.plan import JobView, Policy, ResourcePlan
from dlrover.resource.policy_config import DLRoverRMKnobs
from dlrover.resource.rm_correction import find_correction
from dlrover.resource.rm_search import Key, Scores, config_key, feasible_grid, grid_best, hill_climb, ps_rss, with_memory
from dlrover.resource.stream_sizing import stream_step


def _round_mb(mb: float) -> int:
    return max(256, int(math.ceil(mb / 64.0) * 64))


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
        return ResourcePlan(config, reason, stage="request" if k.start_from_request else "default")

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

    def _correct(self, view: JobView) -> ResourcePlan | None:
        """:func:`~dlrover.resource.rm_correction.find_correction`, counted against
        ``max_corrections``, each kind of correction with its own cooldown."""
        k = self.knobs
        if self.corrections >= k.max_corrections or not view.actors:
            return None
        now = view.now_s

        def ready(key: str) -> bool:
            last = self._last_correction.get(key)
            return last is None or now - last >= k.correction_cooldown_s

        fix = find_correction(view, k, ready)
        if fix is None:
            return None
        self.corrections += 1
        self._counted = "corrections"
        for m in fix.marks:
            self._last_correction[m] = now
        config = fix.config
        predicted = self._predict_one(view, config) if config_key(config) != config_key(view.config) else None
        return ResourcePlan(
            config, "; ".join(fix.reasons), stage="correction", predicted_throughput=predicted, replace=fix.replace, rebalance_ps=fix.rebalance_ps,
            corrections=fix.fixes,
        )

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
            s = acc.setdefault(config_key(m.config), [0.0, 0.0])
            s[0] += w * m.throughput
            s[1] += w
        return {key: s[0] / s[1] for key, s in acc.items()}

    def _scale(self, view: JobView) -> ResourcePlan | None:
        k = self.knobs
        cur_win = view.current
        if view.stream is not None:  # a followed stream: the least CPU under the lag bound
            if view.now_s - view.last_change_s < k.cooldown_s:
                return None
            return self._stream(view, cur_win.throughput if cur_win is not None and cur_win.throughput > 0 else None)
        if cur_win is None or cur_win.duration_s < k.profile_window_s or cur_win.throughput <= 0:
            return None
        if view.now_s - view.last_change_s < k.cooldown_s:
            return None
        if view.remaining_s is not None and view.remaining_s < k.min_remaining_s:
            return None
        cur = view.config
        measured = self._measured(view)
        t_now = measured.get(config_key(cur), cur_win.throughput)
        best_key = max(measured, key=lambda x: measured[x])
        best_thr = measured[best_key]

        # Runtime correction "revert": the running config measures clearly worse than one we ran.
        if best_key != config_key(cur) and best_thr > t_now * (1 + k.min_gain) and self.reverts < k.max_changes:
            back = with_memory(best_key, cur, ps_rss(view, k.oom_horizon_s), k.mem_high_watermark)
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

    def _stream(self, view: JobView, t_now: float | None) -> ResourcePlan | None:
        k = self.knobs
        rss_mb = ps_rss(view, k.oom_horizon_s)
        max_w = min(view.budget.max_workers, k.max_workers or view.budget.max_workers)
        max_p = min(view.budget.max_ps, k.max_ps or view.budget.max_ps)
        cur = view.config
        wcpus = sorted(set(k.worker_cpu_choices) | {float(cur.worker_cpu)})
        pcpus = sorted(set(k.ps_cpu_choices) | {float(cur.ps_cpu)})
        rows = feasible_grid(cur, view.budget, max_w, max_p, wcpus, pcpus, rss_mb, k.mem_high_watermark)
        return stream_step(view, t_now, rows, k.stream_headroom, k.stream_scale_in_margin, rss_mb, k.mem_high_watermark)

    def _model_step(self, view: JobView, cur: Config, measured: dict[Key, float], t_now: float) -> ResourcePlan | None:
        """Stage 2 proper: search the utility's maximum and propose it if it is worth a move."""
        k = self.knobs
        # A search over the same model, measurements, memory and budget as one that found
        # the running config best would find it again: skip it (the simulator asks every tick).
        rss_mb = ps_rss(view, k.oom_horizon_s)
        memo = (
            view.model.n_points, config_key(cur), cur.ps_memory_mb, round(math.log(t_now), 2), view.budget, round(math.log1p(rss_mb) * 20),  # RSS in 5% steps
            tuple(sorted((x, round(math.log(v), 2)) for x, v in measured.items())),
        )  # fmt: skip
        if memo == self._nothing_at:
            return None
        pred_cur = self._predict_one(view, cur)
        calib = t_now / pred_cur if pred_cur and pred_cur > 0 else 1.0
        bar = k.min_gain_per_cpu

        kappa = k.min_elasticity
        scores = Scores(view.model, measured, calib, k.explore)

        def utility(keys: list[Key]) -> np.ndarray:
            cpu = np.array([x[0] * x[2] + x[1] * x[3] for x in keys], dtype=np.float64)
            thr, hope = scores.of(keys)
            return np.log(np.maximum(thr, 1e-12)) + hope - bar * cpu - kappa * np.log(cpu)

        max_w = min(view.budget.max_workers, k.max_workers or view.budget.max_workers)
        max_p = min(view.budget.max_ps, k.max_ps or view.budget.max_ps)
        wcpus = sorted(set(k.worker_cpu_choices) | {float(cur.worker_cpu)})
        pcpus = sorted(set(k.ps_cpu_choices) | {float(cur.ps_cpu)})

        @functools.lru_cache(maxsize=None)  # the climb asks again for the points around each step
        def ok(x: Key) -> bool:
            return 1 <= x[0] <= max_w and 1 <= x[1] <= max_p and with_memory(x, cur, rss_mb, k.mem_high_watermark).fits(view.budget)

        start = config_key(cur)
        if k.search == "grid":
            target = grid_best(view, start, max_w, max_p, wcpus, pcpus, measured, calib, t_now, bar, kappa, rss_mb, k.mem_high_watermark, k.explore)
        else:
            target = hill_climb(start, ok, utility, wcpus, pcpus)
        if target == start:
            self._nothing_at = memo
            return None

        new = with_memory(target, cur, rss_mb, k.mem_high_watermark)
        thrs, hopes = scores.of([target, start])
        t_new, hope, start_hope = float(thrs[0]), float(hopes[0]), float(hopes[1])  # hope: its value over its prediction
        t_hoped = t_new * math.exp(hope)
        gain = t_hoped / t_now - 1
        d_cpu = new.cpu - cur.cpu
        d_u = float(utility([target])[0] - utility([start])[0])
        if gain > k.min_gain:
            if view.remaining_s is not None:
                samples_left = view.remaining_s * t_now
                # Paid back on the prediction (or less, with caution), not on optimism:
                # near the job's end what a measurement would teach comes too late.
                if k.move_cost_s + samples_left / min(t_new, t_hoped) >= view.remaining_s:
                    return None
            unsure = f" +/- {hope / k.explore:.0%}" if hope != 0 else ""
            if hope > 0 and d_u - hope + start_hope <= 0:  # worth it only for what the model does not know
                unsure += ", exploring: the model is unsure of it"
            reason = (
                f"model: {cur.short()} -> {new.short()}: predicted {t_new:.0f} samples/s ({t_new / t_now - 1:+.0%}{unsure}) "
                f"vs {t_now:.0f} measured, {d_cpu:+g} CPU"
            )
        elif d_cpu < 0 and d_u >= k.min_gain:
            reason = (
                f"model: {cur.short()} -> {new.short()}: frees {-d_cpu:g} CPU for a predicted {t_new / t_now - 1:+.0%} "
                f"throughput ({t_new:.0f} vs {t_now:.0f} samples/s; bar {bar:.0%} per CPU)"
            )
        else:
            return None
        self.changes += 1
        self._counted = "changes"
        return ResourcePlan(new, reason, stage="model", predicted_throughput=t_new)
