"""The ``optimus`` policy: greedy marginal gain per dominant resource share.

No Ray: JobViews are built by hand; the model is a real PerfModel fitted to points of a
known ground truth (``TRUTH``), which it identifies exactly.
"""

from __future__ import annotations

import pytest

from dlrover.errors import SpecError
from dlrover.resource.optimus import OptimusPolicy
from dlrover.resource.perf_model import PerfModel, PerfParams, throughput
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import JobView, Measurement
from dlrover.resource.policies import load_policy
from dlrover.resource.policy_config import OptimusKnobs
from dlrover.spec import PolicySpec

B = 512
# Saturating in workers (contention) and PS-bound at few PS: growth pays less and less.
TRUTH = PerfParams(t0=0.004, t1=2e-5, t2=0.004, t3=0.003, t4=0.002)
BUDGET = Budget(cpu=24, memory_mb=1_000_000, max_workers=32, max_ps=16)


def cfg(w=1, p=1, cw=1.0, cp=1.0, wm=2048, pm=2048) -> Config:
    return Config(w, p, float(cw), float(cp), wm, pm)


def truth(c: Config) -> float:
    return float(throughput(TRUTH, c.workers, c.ps, c.worker_cpu, c.ps_cpu, B)[0])


def fitted_model() -> PerfModel:
    model = PerfModel(B)
    for c in (cfg(), cfg(2), cfg(4), cfg(2, 2), cfg(2, 1, 2), cfg(2, 1, 1, 2)):
        model.observe(c, truth(c))
    assert all(model.identified[:5])  # no cores given: no host term to identify
    return model


def view(config=None, budget=BUDGET, duration_s=60.0, now_s=100.0, last_change_s=0.0, **kw) -> JobView:
    config = config or cfg()
    defaults = {
        "now_s": now_s, "config": config, "budget": budget, "batch_size": B, "signature": "m-x", "model": fitted_model(),
        "current": Measurement(config, truth(config), duration_s=duration_s, at_s=now_s),
        "last_change_s": last_change_s, "requested": config,
    }
    return JobView(**(defaults | kw))


def best_reachable(sizes: Config, budget: Budget) -> float:
    """Brute force: the best true throughput over worker/PS counts of these sizes that fit."""
    return max(
        truth(c)
        for w in range(1, budget.max_workers + 1)
        for p in range(1, budget.max_ps + 1)
        if (c := sizes.replace(workers=w, ps=p)).fits(budget)
    )


def test_initial_is_minimal_or_the_request_and_fits():
    req = cfg(8, 4, 2.0, 1.0, wm=4096)
    plan = OptimusPolicy().initial(view(requested=req))
    assert plan.config == cfg(1, 1, 2.0, 1.0, wm=4096)
    plan = OptimusPolicy(OptimusKnobs(start="request")).initial(view(requested=req))
    assert plan.config == req
    small = Budget(cpu=6, memory_mb=1_000_000)
    plan = OptimusPolicy(OptimusKnobs(start="request")).initial(view(requested=req, budget=small))
    assert plan.config.fits(small) and "clipped" in plan.reason
    tiny = Budget(cpu=2, memory_mb=4096)
    plan = OptimusPolicy().initial(view(requested=req, budget=tiny))
    assert plan.config.fits(tiny) and (plan.config.workers, plan.config.ps) == (1, 1)


def test_decide_waits_for_the_window_the_cooldown_and_max_changes():
    assert OptimusPolicy().decide(view(duration_s=5.0)) is None
    assert OptimusPolicy().decide(view(current=None)) is None
    assert OptimusPolicy().decide(view(now_s=100.0, last_change_s=95.0)) is None
    pol = OptimusPolicy(OptimusKnobs(max_changes=1))
    assert pol.decide(view()) is not None
    assert pol.decide(view()) is None


def test_grows_from_one_and_one_near_the_best_reachable_and_then_stays():
    pol = OptimusPolicy()
    v = view()
    plan = pol.decide(v)
    assert plan is not None and plan.stage == "model" and plan.config.fits(BUDGET)
    assert plan.config.workers > 1 and plan.config.ps > 1
    assert "1w x 1cpu + 1ps x 1cpu ->" in plan.reason and "%" in plan.reason
    assert plan.predicted_throughput == pytest.approx(truth(plan.config), rel=1e-6)
    assert truth(plan.config) >= 0.85 * best_reachable(cfg(), BUDGET)
    # Running the target, with its window measured, proposes nothing more.
    assert pol.decide(view(plan.config, now_s=200.0, last_change_s=100.0)) is None


@pytest.mark.parametrize(
    "budget",
    [
        Budget(cpu=12, memory_mb=1_000_000),
        Budget(cpu=64, memory_mb=1_000_000, max_workers=64, max_ps=64),
        Budget(cpu=64, memory_mb=20 * 2048),  # memory is the dominant resource
        Budget(cpu=64, memory_mb=1_000_000, max_workers=5, max_ps=2),
    ],
)
def test_never_exceeds_the_budget(budget):
    for sizes in (cfg(), cfg(1, 1, 2.0, 1.0), cfg(1, 1, 1.0, 1.0, pm=8192)):
        plan = OptimusPolicy(OptimusKnobs(min_gain_per_share=0.0)).decide(view(sizes, budget=budget))
        assert plan is not None and plan.config.fits(budget)
        assert truth(plan.config) >= 0.85 * best_reachable(sizes, budget)


def test_knob_caps_and_a_higher_bar_give_fewer_cpus():
    cpus = [OptimusPolicy(OptimusKnobs(min_gain_per_share=g)).decide(view()).config.cpu for g in (0.0, 0.5, 1.0, 4.0)]
    assert cpus == sorted(cpus, reverse=True) and cpus[0] > cpus[-1]
    plan = OptimusPolicy(OptimusKnobs(max_workers=3, max_ps=2)).decide(view())
    assert (plan.config.workers, plan.config.ps) == (3, 2)


def test_frees_cpu_when_the_running_config_is_past_the_greedy_stop():
    target = OptimusPolicy().decide(view()).config
    big = target.replace(workers=target.workers + 2)  # fits BUDGET, gains little over the target
    assert big.fits(BUDGET) and truth(big) < truth(target) * 1.05
    plan = OptimusPolicy().decide(view(big))
    assert plan is not None and plan.config == target and "-2 CPU" in plan.reason


def test_a_shrunken_budget_is_obeyed_at_once():
    running = cfg(12, 8)
    small = Budget(cpu=6, memory_mb=1_000_000)
    pol = OptimusPolicy(OptimusKnobs(max_changes=0))
    plan = pol.decide(view(running, budget=small, duration_s=0.0, current=None))
    assert plan is not None and plan.config.fits(small) and "budget is now 6 CPU" in plan.reason


def test_load_policy_and_knob_errors():
    pol = load_policy("optimus")
    assert isinstance(pol, OptimusPolicy) and pol.knobs == OptimusKnobs()
    assert load_policy("optimus", overrides={"min_gain_per_share": 2}).knobs.min_gain_per_share == 2.0
    with pytest.raises(SpecError, match=r"policy\.knobs\.min_gian: ") as e:
        load_policy("optimus", overrides={"min_gian": 0.1})
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match=r"policy\.knobs\.start: "):
        load_policy("optimus", overrides={"start": "huge"})
    assert PolicySpec(name="optimus").name == "optimus"
