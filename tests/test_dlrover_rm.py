"""DLRover-RM's three stages: warm start from history, model-driven scaling, runtime
correction (stragglers, slow and hot PS, memory trends).

No Ray: every JobView is built by hand (policy_views.py), and the performance model is
a real PerfModel whose prior is the ground truth of the test.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from dlrover.resource.configs import Budget, clip_to_budget
from dlrover.resource.dlrover_rm import DLRoverRMPolicy
from dlrover.resource.plan import ActorMetrics, Measurement
from dlrover.resource.policies import load_policy
from dlrover.resource.policy_config import DLRoverRMKnobs
from policy_views import BIG, COMPUTE_BOUND, SATURATING, cfg, key, mk_view, ps, record, rm, truth, worker


# ------------------------------------------------------------------ stage 1


def test_warm_start_picks_newest_best_config_clipped_to_budget_and_seeds_model():
    hist = [
        record("job-nobest", None, 0.0, 3000.0, final=cfg(1, 1)),  # unusable: skipped
        record("job-b", cfg(12, 4, 2, 2), 4000.0, 2000.0,
               measurements=[(cfg(2, 1), 900.0), (cfg(0, 1), 5.0), (cfg(12, 4, 2, 2), 4000.0)],  # one junk point
               final=cfg(12, 4, 2, 2, wm=3072)),
        record("job-a", cfg(2, 1), 900.0, 1000.0, measurements=[(cfg(2, 1), 900.0)]),
    ]
    budget = Budget(cpu=16, memory_mb=1_000_000, max_workers=32, max_ps=16)
    v = mk_view(config=cfg(1, 1), budget=budget, history=hist, current=None)
    plan = rm().initial(v)
    assert plan.stage == "warm_start" and "job-b" in plan.reason and "clipped" in plan.reason
    assert plan.config.fits(budget) and plan.config.cpu > budget.cpu - 2  # clipped, not shrunk to nothing
    assert (plan.config.worker_cpu, plan.config.ps_cpu) == (2.0, 2.0)
    assert plan.config.worker_memory_mb == 3072  # memory the last run grew to carries over
    assert v.model.n_points == 2  # only the newest usable record seeds (history_records: 1); junk skipped
    assert list(v.model.points()["weight"]) == [30.0, 30.0]  # history_weight 0.5 x 60 s, like the master's own windows
    assert plan.predicted_throughput == pytest.approx(v.model.predict(plan.config))

    big = mk_view(config=cfg(1, 1), history=hist, current=None)
    assert key(rm(history_records=2).initial(big).config) == (12, 4, 2.0, 2.0)
    assert big.model.n_points == 3


def test_initial_without_history_uses_request_or_default():
    v = mk_view(config=cfg(3, 2), current=None)
    p = rm().initial(v)
    assert p.config == cfg(3, 2) and p.stage != "warm_start"
    p = load_policy("dlrover_rm", overrides={"start_from_request": False, "default_config": {"workers": 5}}).initial(v)
    assert key(p.config) == (5, 1, 1.0, 1.0)
    p = rm(warm_start=False).initial(mk_view(history=[record("j", cfg(8, 8), 1.0, 1.0)], current=None))
    assert p.config == cfg() and v.model.n_points == 0


# ------------------------------------------------------------------ stage 2


def test_model_scales_up_on_a_big_predicted_gain():
    budget = Budget(cpu=16, memory_mb=1_000_000, max_workers=32, max_ps=16)
    v = mk_view(budget=budget)
    plan = rm().decide(v)
    assert plan is not None and plan.stage == "model"
    assert plan.config.cpu > v.config.cpu and plan.config.fits(budget)
    assert plan.predicted_throughput > 1.5 * v.current.throughput
    assert truth(COMPUTE_BOUND, plan.config) > 1.5 * truth(COMPUTE_BOUND, v.config)


def test_model_stops_where_marginal_gain_per_cpu_falls_below_the_bar():
    bar = 0.05
    v = mk_view(prior=SATURATING)
    plan = rm(min_gain_per_cpu=bar).decide(v)
    assert plan is not None
    x = plan.config
    assert x.cpu > v.config.cpu
    # No single step that adds CPU from the chosen point pays the bar any more ...
    ups = [x.replace(workers=x.workers + 1), x.replace(ps=x.ps + 1)]
    ups += [x.replace(worker_cpu=c) for c in (0.5, 1.0, 2.0, 4.0) if c > x.worker_cpu][:1]
    ups += [x.replace(ps_cpu=c) for c in (0.5, 1.0, 2.0, 4.0) if c > x.ps_cpu][:1]
    for n in ups:
        marginal = np.log(truth(SATURATING, n) / truth(SATURATING, x)) / (n.cpu - x.cpu)
        assert marginal < bar, (n.short(), marginal)
    # ... while the last step that added CPU on the way there did (it was taken).
    downs = [x.replace(workers=x.workers - 1), x.replace(ps=x.ps - 1)]
    assert any(np.log(truth(SATURATING, x) / truth(SATURATING, d)) / (x.cpu - d.cpu) >= bar for d in downs if d.workers and d.ps)
    # ... the chosen point is a fixed point (running it, the policy proposes nothing) ...
    assert rm(min_gain_per_cpu=bar).decide(mk_view(config=x, prior=SATURATING)) is None
    # ... and a price above any marginal gain never adds CPU: it frees some instead.
    dear = rm(min_gain_per_cpu=5.0).decide(mk_view(prior=SATURATING))
    assert dear is not None and dear.config.cpu < v.config.cpu and "frees" in dear.reason
    # The grid search finds a point at least as good in utility.
    g = rm(min_gain_per_cpu=bar, search="grid").decide(mk_view(prior=SATURATING))

    def utility(c):
        return np.log(truth(SATURATING, c)) - bar * c.cpu

    assert g is not None and utility(g.config) >= utility(x) - 1e-9


def test_model_gates_profile_window_cooldown_cost_and_max_changes():
    assert rm().decide(mk_view(current=None)) is None  # warming up
    short = mk_view()
    short.current.duration_s = 10.0
    assert rm(profile_window_s=60).decide(short) is None
    assert rm(cooldown_s=120).decide(mk_view(last_change_s=950.0)) is None
    assert rm(move_cost_s=30, min_remaining_s=0).decide(mk_view(remaining_s=31.0)) is None  # gain cannot repay the move
    assert rm(move_cost_s=30, min_remaining_s=0).decide(mk_view(remaining_s=600.0)) is not None
    pol = rm(max_changes=1, cooldown_s=0)
    assert pol.decide(mk_view()) is not None
    assert pol.decide(mk_view(config=cfg(3, 1))) is None


def test_revert_to_best_measured_and_never_repropose_a_worse_one():
    a, b = cfg(2, 1), cfg(4, 1)
    v = mk_view(config=b, measured=800.0, measurements=[Measurement(a, 1000.0, 120.0, 500.0)])
    plan = rm().decide(v)
    assert plan is not None and key(plan.config) == key(a) and plan.reason.startswith("revert")
    # Back on A: the model still predicts B (and more) to be faster, but B measured worse.
    v2 = mk_view(config=a, measured=1000.0, measurements=[Measurement(a, 1000.0, 120.0, 500.0), Measurement(b, 800.0, 120.0, 700.0)])
    for search in ("greedy", "grid"):
        p = rm(search=search).decide(v2)
        assert p is None or key(p.config) != key(b)
    # With B the largest config the search may reach, it stops short of B (at 3 workers).
    for search in ("greedy", "grid"):
        p = rm(search=search, max_workers=4, max_ps=1, worker_cpu_choices=[1], ps_cpu_choices=[1]).decide(v2)
        assert p is not None and key(p.config) == (3, 1, 1.0, 1.0), p.reason
    # Random measured histories: a model-driven plan never targets a config measured worse
    # than the best unless it frees CPU.
    rng = random.Random(3)
    hits = 0
    for _ in range(200):
        runs = [cfg(rng.randint(1, 8), rng.randint(1, 4), rng.choice([0.5, 1, 2]), rng.choice([0.5, 1, 2])) for _ in range(4)]
        ms = [Measurement(c, truth(COMPUTE_BOUND, c) * rng.uniform(0.5, 1.5), 120.0, 100.0 * i) for i, c in enumerate(runs)]
        cur = ms[-1]
        cur.throughput = max(m.throughput for m in ms[:-1]) * rng.uniform(0.96, 1.2)  # no revert due
        v = mk_view(config=cur.config, measured=cur.throughput, measurements=ms[:-1])
        p = rm(search=rng.choice(["greedy", "grid"]), max_workers=8, max_ps=4, worker_cpu_choices=[0.5, 1, 2],
               ps_cpu_choices=[0.5, 1, 2], min_gain_per_cpu=rng.choice([0.02, 0.1, 0.3])).decide(v)
        means = DLRoverRMPolicy._measured(v)
        if p is not None and p.stage == "model" and key(p.config) in means:
            assert means[key(p.config)] >= max(means.values()) or p.config.cpu < cur.config.cpu, p.reason
            hits += 1
    assert hits >= 3
    # Within min_gain of the best: no revert.
    v3 = mk_view(config=b, measured=980.0, measurements=[Measurement(a, 1000.0, 120.0, 500.0)], prior=SATURATING)
    p = rm().decide(v3)
    assert p is None or not p.reason.startswith("revert")
    assert rm(min_gain=0.01).decide(v3).reason.startswith("revert")


def test_explore_measures_a_config_the_model_is_unsure_of_where_exploiting_would_stay():
    bar = 0.05
    x = rm(min_gain_per_cpu=bar).decide(mk_view(prior=SATURATING)).config  # exploitation's fixed point
    assert rm(min_gain_per_cpu=bar).decide(mk_view(config=x, prior=SATURATING)) is None
    for search in ("greedy", "grid"):
        plan = rm(min_gain_per_cpu=bar, explore=1.0, search=search).decide(mk_view(config=x, prior=SATURATING))
        assert plan is not None and plan.stage == "model" and "exploring" in plan.reason, plan and plan.reason
        assert key(plan.config) != key(x) and plan.config.fits(BIG)
        # The plan's prediction is the model's, not the optimism that chose it.
        assert plan.predicted_throughput == pytest.approx(truth(SATURATING, plan.config), rel=1e-6)


def test_explore_goes_by_the_prediction_where_the_model_is_sure():
    bar = 0.05
    x = rm(min_gain_per_cpu=bar).decide(mk_view(prior=SATURATING)).config
    v = mk_view(config=x, prior=SATURATING)
    for w, p, cw, cp in itertools.product(range(1, 9), range(1, 5), [1.0, 2.0, 4.0], [1.0, 2.0, 4.0]):
        c = cfg(w, p, cw, cp)
        v.model.observe(c, truth(SATURATING, c))  # every configuration measured: the model is sure
    assert rm(min_gain_per_cpu=bar, explore=0.5).decide(v) is None
    # A neighbour predicted just short of worth it tempts a bolder policy (+/- 1% left) ...
    near = cfg(x.workers, x.ps + 1)
    plan = rm(min_gain_per_cpu=bar, explore=2.0).decide(v)
    assert plan is not None and key(plan.config) == key(near), plan and plan.reason
    # ... until the job measured it: then it counts at its measurement, without optimism.
    v.measurements = [Measurement(near, truth(SATURATING, near), 120.0, 500.0)]
    assert rm(min_gain_per_cpu=bar, explore=2.0).decide(v) is None


def test_caution_moves_only_where_the_pessimistic_prediction_still_gains():
    v = mk_view(prior=SATURATING)  # the model has measured nothing: unsure of every move
    assert rm().decide(v) is not None
    assert rm(explore=-2.0).decide(mk_view(prior=SATURATING)) is None
    plan = rm(explore=-0.5).decide(mk_view(prior=SATURATING))
    assert plan is not None
    sd = float(v.model.relative_sd(np.array([key(plan.config)], dtype=np.float64))[0])
    assert plan.predicted_throughput * np.exp(-0.5 * sd) > v.current.throughput * (1 + DLRoverRMKnobs().min_gain)


def test_plans_never_exceed_the_budget():
    rng = random.Random(7)
    stages: dict[str, int] = {}
    for i in range(150):
        budget = Budget(
            cpu=rng.choice([1.5, 2, 3, 5, 8, 13, 24, 40]),
            memory_mb=rng.choice([3000, 6000, 12_000, 40_000, 200_000]),
            max_workers=rng.randint(1, 12),
            max_ps=rng.randint(1, 6),
        )
        c = cfg(rng.randint(1, 10), rng.randint(1, 5), rng.choice([0.5, 1, 2]), rng.choice([0.5, 1, 2]),
                rng.choice([512, 1024, 2048]), rng.choice([512, 1024, 2048]))
        if rng.random() < 0.7:
            c = clip_to_budget(c, budget)  # mostly a running config that fits; else the budget shrank
        actors = {}
        for j in range(c.workers):
            actors[f"w-{j}"] = ActorMetrics(f"w-{j}", "worker", c.worker_cpu, c.worker_memory_mb,
                                            rss_mb=rng.uniform(0, c.worker_memory_mb), rss_trend_mb_per_s=rng.choice([0, 1, 20]),
                                            slow_since_s=rng.choice([None, None, 0.0]), step_time_s=0.1)
        for j in range(c.ps):
            actors[f"ps-{j}"] = ActorMetrics(f"ps-{j}", "ps", c.ps_cpu, c.ps_memory_mb, rss_mb=rng.uniform(0, c.ps_memory_mb),
                                             rss_trend_mb_per_s=rng.choice([0, 5]), busy=rng.choice([0.2, 0.95]))
        prior = rng.choice([COMPUTE_BOUND, SATURATING])
        hist = [record("h", cfg(rng.randint(1, 20), rng.randint(1, 8), 2, 2), 1000.0, 1.0)] if rng.random() < 0.5 else []
        v = mk_view(config=c, prior=prior, budget=budget, actors=actors, history=hist,
                    measurements=[Measurement(cfg(1, 1), rng.uniform(100, 5000), 60, 100)])
        pol = rm(search=rng.choice(["greedy", "grid"]), cooldown_s=0)
        assert pol.initial(v).config.fits(budget), (i, budget)
        for t in range(4):
            v.now_s = 1000.0 + 100 * t
            plan = pol.decide(v)
            if plan is not None:
                assert plan.config.fits(budget), (i, t, plan.reason, plan.config, budget)
                kind = plan.reason.split(":")[0].split(" is now")[0]
                stages[kind] = stages.get(kind, 0) + 1
                v.config = plan.config
                v.current = Measurement(plan.config, truth(prior, plan.config), 120.0, v.now_s)
        assert v.config.fits(budget)
    # Not vacuous: every kind of plan came up, many times.
    assert {"model", "budget", "memory", "hot PS", "straggler"} <= set(stages), stages
    assert sum(stages.values()) > 150, stages


def test_shrunk_budget_is_obeyed_at_once_keeping_the_fastest_fit():
    budget = Budget(cpu=3, memory_mb=1_000_000)
    v = mk_view(config=cfg(3, 2), budget=budget, prior=SATURATING, current=None, last_change_s=999.0)
    plan = rm(max_changes=0, max_corrections=0).decide(v)  # neither limit nor cooldown holds it back
    assert plan is not None and plan.config.fits(budget) and plan.reason.startswith("budget is now")
    fits = [cfg(w, p) for w in range(1, 4) for p in range(1, 3) if cfg(w, p).fits(budget)]
    assert truth(SATURATING, plan.config) == max(truth(SATURATING, c) for c in fits)


# ------------------------------------------------------------------ stage 3


def test_straggler_is_replaced_after_its_window():
    workers = {n: worker(n, step_time_s=0.1) for n in ("w-0", "w-1", "w-2")}
    workers["w-1"] = worker("w-1", step_time_s=0.4, slow_since_s=940.0)
    pol = rm(straggler_window_s=30)
    plan = pol.decide(mk_view(config=cfg(3, 1), actors=workers))
    assert plan is not None and plan.replace == ["w-1"] and plan.stage == "correction"
    assert plan.config == cfg(3, 1) and "w-1" in plan.reason
    assert pol.decide(mk_view(config=cfg(3, 1), actors=workers, now_s=1001.0, current=None)) is None  # cooldown
    workers["w-1"] = worker("w-1", step_time_s=0.4, slow_since_s=990.0)  # slow for 10 s only
    assert rm(straggler_window_s=30).decide(mk_view(config=cfg(3, 1), actors=workers, current=None)) is None
    alone = {"w-0": worker("w-0", slow_since_s=0.0)}
    assert rm().decide(mk_view(config=cfg(1, 1), actors=alone, current=None)) is None  # no peer to compare with


def test_slow_ps_is_replaced_not_rebalanced_after_its_window():
    """A PS whose calls take longer than the others' (a slow host or link) holds up every
    step whatever share of the vshards it keeps: it is replaced, and its busy share (the
    delay occupies it) does not also trigger the hot-PS rebalance."""
    actors = {"w-0": worker("w-0", step_time_s=0.1), "ps-0": ps("ps-0", busy=0.2, us_per_id=0.2),
              "ps-1": ps("ps-1", busy=0.97, us_per_id=4.0, slow_since_s=960.0)}  # fmt: skip
    pol = rm(straggler_window_s=30)
    plan = pol.decide(mk_view(config=cfg(1, 2), actors=actors, current=None))
    assert plan is not None and plan.replace == ["ps-1"] and not plan.rebalance_ps
    assert plan.config == cfg(1, 2) and plan.reason.startswith("slow PS: ps-1") and "4.00 us per id" in plan.reason
    assert pol.decide(mk_view(config=cfg(1, 2), actors=actors, current=None, now_s=1001.0)) is None  # cooldown
    actors["ps-1"] = ps("ps-1", busy=0.97, us_per_id=4.0, slow_since_s=990.0)  # slow for 10 s only
    assert rm(straggler_window_s=30).decide(mk_view(config=cfg(1, 2), actors=actors, current=None)) is None


def test_hot_ps_rebalances_or_grows():
    imbalanced = {"ps-0": ps("ps-0", busy=0.95), "ps-1": ps("ps-1", busy=0.3)}
    pol = rm()
    plan = pol.decide(mk_view(config=cfg(2, 2), actors=imbalanced, current=None))
    assert plan is not None and plan.rebalance_ps and plan.config == cfg(2, 2) and "ps-0" in plan.reason
    assert pol.decide(mk_view(config=cfg(2, 2), actors=imbalanced, current=None, now_s=1010.0)) is None  # cooldown

    single = {"ps-0": ps("ps-0", busy=0.97)}
    plan = rm().decide(mk_view(config=cfg(2, 1), actors=single, current=None, prior=SATURATING))
    assert plan is not None and not plan.rebalance_ps and plan.config.ps_cpu * plan.config.ps > 1.0
    balanced_hot = {"ps-0": ps("ps-0", busy=0.95), "ps-1": ps("ps-1", busy=0.93)}
    plan = rm().decide(mk_view(config=cfg(2, 2), actors=balanced_hot, current=None))
    assert plan is not None and not plan.rebalance_ps and plan.config.ps * plan.config.ps_cpu > 2.0
    tight = Budget(cpu=3, memory_mb=100_000)
    assert rm().decide(mk_view(config=cfg(2, 1), actors=single, current=None, budget=tight)) is None  # no room
    cool = {"ps-0": ps("ps-0", busy=0.5), "ps-1": ps("ps-1", busy=0.1)}
    assert rm().decide(mk_view(config=cfg(2, 2), actors=cool, current=None)) is None


def test_memory_trend_raises_memory_before_the_limit():
    def view(trend, budget=BIG):
        a = {"w-0": worker("w-0", rss_mb=1500.0, rss_trend_mb_per_s=trend), "w-1": worker("w-1", rss_mb=900.0)}
        return mk_view(config=cfg(2, 1), actors=a, current=None, budget=budget)

    assert rm(oom_horizon_s=120, mem_high_watermark=0.9).decide(view(2.0)) is None  # 1740 MB < 1843 MB in 120 s
    plan = rm(oom_horizon_s=120, mem_high_watermark=0.9, mem_growth_factor=1.5).decide(view(4.0))
    assert plan is not None and plan.stage == "correction"
    assert plan.config.worker_memory_mb == 3072 and plan.config.ps_memory_mb == 2048 and plan.replace == ["w-0"]
    assert "w-0" in plan.reason and "~86s" in plan.reason  # (1843 - 1500) / 4
    capped = Budget(cpu=64, memory_mb=2 * 2560 + 2048)
    plan = rm().decide(view(4.0, capped))
    assert plan is not None and plan.config.worker_memory_mb == 2560 and plan.config.fits(capped)
    assert rm().decide(view(4.0, Budget(cpu=64, memory_mb=3 * 2048))) is None  # no memory left in the budget


