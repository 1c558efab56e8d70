"""The job loop both runtimes share (``dlrover.resource.driver``), on a fake clock: windows,
decisions, the budget check, memory after an OOM kill, straggler marks, RSS trends. The
same policy deciding the same live and simulated is in test_live_vs_sim.py."""

from __future__ import annotations

import pytest

from dlrover.resource.driver import ActorWatch, DecisionKind, PolicyDriver, Progress, TrendParams
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import ActorMetrics, JobView, Policy, ResourcePlan
from dlrover.resource.static import StaticPolicy

A = Config(2, 1, 2.0, 2.0, 2048, 1024)
B = Config(4, 2, 2.0, 2.0, 2048, 1024)
BUDGET = Budget(cpu=16.0, memory_mb=16384)


class Planned(Policy):
    """Proposes ``plan`` at every tick and records what the runtime gave back."""

    name = "planned"

    def __init__(self, plan: ResourcePlan | None = None) -> None:
        self.plan = plan
        self.given_back: list[tuple[ResourcePlan, str]] = []
        self.seen: list[JobView] = []

    def initial(self, view: JobView) -> ResourcePlan:
        return self.plan or ResourcePlan(view.config, "the request")

    def decide(self, view: JobView) -> ResourcePlan | None:
        self.seen.append(view)
        return self.plan

    def rejected(self, plan: ResourcePlan, why: str) -> None:
        self.given_back.append((plan, why))


def driver(policy: Policy | None = None, warmup_s: float = 4.0, budget: Budget = BUDGET) -> PolicyDriver:
    return PolicyDriver(policy or StaticPolicy(), budget=budget, requested=A, batch_size=512, signature="m", warmup_s=warmup_s)


def worker(name: str, step_s: float, at_s: float, rss_mb: float = 100.0) -> ActorMetrics:
    return ActorMetrics(name, "worker", 2.0, 2048, rss_mb=rss_mb, step_time_s=step_s, at_s=at_s)


# -- windows -----------------------------------------------------------------------------


def test_window_counts_from_the_end_of_its_warm_up_interpolating_the_count_there():
    d = driver(warmup_s=4.0)
    d.open(A, 10.0)
    for t, samples in [(11.0, 100), (13.0, 300), (15.0, 500), (19.0, 900)]:  # 100 samples/s
        d.observe(t, samples)
    m = d.current()
    assert m is not None and m.config == A
    assert m.duration_s == pytest.approx(5.0)  # from 14 s (10 + warm-up), not from the first report after it
    assert m.throughput == pytest.approx(100.0) and m.at_s == 19.0


def test_a_window_shorter_than_the_minimum_is_neither_shown_nor_kept():
    d = driver(warmup_s=0.0)
    d.open(A, 0.0)
    d.observe(0.0, 0)
    d.observe(1.5, 150)
    assert d.window_s() == pytest.approx(1.5) and d.current() is None
    assert d.close() is None
    assert d.measurements == [] and d.model.n_points == 0


def test_closing_a_window_refits_the_model_on_what_it_measured():
    d = driver(warmup_s=0.0)
    before = d.model.predict(A)
    d.open(A, 0.0)
    d.observe(0.0, 0)
    d.observe(10.0, 12_345)
    m = d.close()
    assert m is not None and d.measurements == [m] and d.window is None
    assert d.model.n_points == 1
    assert d.model.predict(A) == pytest.approx(1234.5, rel=1e-6) != pytest.approx(before)


def test_a_window_records_how_unsure_the_model_was_of_its_configuration():
    d = driver(warmup_s=0.0)
    d.open(A, 0.0)
    d.observe(0.0, 0)
    d.observe(10.0, 12_345)
    first = d.close()
    d.open(A, 10.0)  # measured once now: the model is surer of A
    d.observe(10.0, 12_345)
    d.observe(20.0, 24_690)
    second = d.close()
    assert first.predicted_sd > 2 * second.predicted_sd > 0
    assert first.row()["predicted_sd"] == first.predicted_sd  # shown in the summary's configurations


def test_a_window_says_which_stage_chose_its_configuration_until_the_configuration_changes():
    d = driver(warmup_s=0.0)
    d.open(A, 0.0, ResourcePlan(A, "start", stage="request"))
    d.observe(0.0, 0)
    d.observe(10.0, 1000)
    assert d.close().row()["stage"] == "request"  # the user's start, predicted by the prior alone
    d.open(B, 10.0, ResourcePlan(B, "grow", stage="model", predicted_throughput=2000.0))
    d.rolled_back(B, 12.0)
    d.open(B, 13.0, ResourcePlan(B, "replace a straggler", stage="correction", replace=["w-1"]))
    d.open(B, 14.0)  # a rescale that failed: the configuration it left runs on
    d.observe(14.0, 1000)
    d.observe(20.0, 2600)
    m = d.close()
    assert (m.stage, m.row()["stage"]) == ("model", "model")  # B is still the model's choice
    d.open(A, 20.0)
    assert d.window.stage == ""  # a new configuration no plan chose


def test_the_last_change_moves_when_the_configuration_does_not_on_a_rollback():
    d = driver()
    d.open(A, 5.0)
    d.rolled_back(A, 50.0)
    assert d.last_change_s == 5.0 and d.window is not None and d.window.opened_s == 50.0
    d.open(B, 100.0)
    assert d.last_change_s == 100.0


def test_a_rollback_voids_the_running_window_and_the_actors_samples():
    d = driver(warmup_s=0.0)
    d.open(A, 0.0)
    d.observe(0.0, 0)
    d.observe(30.0, 3000)
    for t in range(0, 60, 5):
        d.rss("ps-0", float(t), 100.0 + t)
    d.rolled_back(A, 30.0)
    assert d.current() is None and d.close() is None
    assert d.watch.trend("ps-0") == 0.0


# -- decisions ---------------------------------------------------------------------------


def test_no_plan_or_an_unchanged_one_is_no_decision():
    for plan in (None, ResourcePlan(A, "keep")):
        d = driver(Planned(plan))
        assert d.decide(d.view(0.0, A, Progress(0, 100))).kind is DecisionKind.NONE


def test_a_plan_within_the_budget_is_applied_with_the_view_it_was_made_on():
    policy = Planned(ResourcePlan(B, "grow"))
    d = driver(policy)
    decision = d.decide(d.view(7.0, A, Progress(25, 100)))
    assert decision.kind is DecisionKind.APPLY and decision.plan is policy.plan
    assert decision.view.now_s == 7.0 and decision.view.progress == 0.25 and not policy.given_back


def test_a_plan_over_the_budget_is_rejected_and_given_back_to_the_policy():
    big = ResourcePlan(Config(8, 2, 2.0, 2.0), "too big")
    policy = Planned(big)
    d = driver(policy)
    decision = d.decide(d.view(0.0, A, Progress(0, 100)))
    assert decision.kind is DecisionKind.REJECTED and decision.plan is big and decision.why == "over budget"
    assert policy.given_back == [(big, "over budget")]
    smaller = d.decide(d.view(0.0, A, Progress(0, 100), budget=Budget(cpu=6.0, memory_mb=16384)))  # what is free now
    assert smaller.kind is DecisionKind.REJECTED


def test_an_initial_plan_beyond_the_budget_is_an_error():
    with pytest.raises(ValueError, match="beyond the budget"):
        driver(Planned(ResourcePlan(Config(8, 2, 2.0, 2.0), "too big"))).initial(0.0)
    assert driver().initial(0.0).config == A


def test_the_view_shows_progress_the_remaining_time_and_the_running_window():
    d = driver(warmup_s=0.0)
    d.open(A, 0.0)
    d.observe(0.0, 0)
    d.observe(10.0, 1000)  # 100 samples/s
    view = d.view(10.0, A, Progress(1000, 5000))
    assert view.progress == 0.2 and view.remaining_s == pytest.approx(40.0)
    assert view.current is not None and view.last_change_s == 0.0 and view.requested == A


def test_memory_after_an_oom_kill_is_half_as_much_again_within_the_budget():
    d = driver(budget=Budget(cpu=16.0, memory_mb=5000))
    assert d.memory_after_oom(2000) == 3000
    assert d.memory_after_oom(4000) == 5000


# -- stragglers and memory trends ----------------------------------------------------------


def test_a_worker_is_slow_from_the_first_report_over_the_median_bar_until_one_is_not():
    w = ActorWatch(factor=1.5)
    w.note_steps([worker("w0", 0.1, 10.0), worker("w1", 0.1, 10.0), worker("w2", 0.2, 10.0)])
    w.note_steps([worker("w0", 0.1, 20.0), worker("w1", 0.1, 20.0), worker("w2", 0.2, 20.0)])
    assert w.slow_since("w2") == 10.0 and w.slow_since("w0") is None
    w.note_steps([worker("w0", 0.1, 30.0), worker("w1", 0.1, 30.0), worker("w2", 0.1, 30.0)])
    assert w.slow_since("w2") is None and w.slow_since("w2", 30.0) == 30.0


def test_a_ps_is_slow_while_its_time_per_id_is_over_the_bar_of_the_ps_median():
    def ps(name: str, us_per_id: float, at_s: float) -> ActorMetrics:
        return ActorMetrics(name, "ps", 1.0, 1024, us_per_id=us_per_id, at_s=at_s)

    w = ActorWatch(factor=1.5)
    w.note_steps([ps("ps-0", 0.2, 10.0), ps("ps-1", 4.0, 10.0), worker("w0", 0.1, 10.0)])
    assert w.slow_since("ps-1") == 10.0 and w.slow_since("ps-0") is None and w.slow_since("w0") is None
    assert w.metrics([ps("ps-0", 0.2, 11.0), ps("ps-1", 4.0, 11.0)])["ps-1"].slow_since_s == 10.0
    w.note_steps([ps("ps-0", 0.0, 15.0), ps("ps-1", 0.0, 15.0)])  # a window without calls (parked): no news
    assert w.slow_since("ps-1") == 10.0
    w.note_steps([ps("ps-0", 0.2, 20.0), ps("ps-1", 0.25, 20.0)])
    assert w.slow_since("ps-1") is None


def test_no_straggler_without_two_reports_or_under_the_policys_own_bar():
    alone = ActorWatch()
    alone.note_steps([worker("w0", 9.0, 1.0)])
    assert alone.slow_since("w0") is None
    from dlrover.resource.dlrover_rm import DLRoverRMPolicy
    from dlrover.resource.policy_config import DLRoverRMKnobs

    lenient = driver(DLRoverRMPolicy(DLRoverRMKnobs(straggler_factor=3.0)))
    view = lenient.view(5.0, A, Progress(0, 1), [worker("w0", 0.1, 5.0), worker("w1", 0.1, 5.0), worker("w2", 0.25, 5.0)])
    assert view.actors["w2"].slow_since_s is None
    strict = driver()
    view = strict.view(5.0, A, Progress(0, 1), [worker("w0", 0.1, 5.0), worker("w1", 0.1, 5.0), worker("w2", 0.25, 5.0)])
    assert view.actors["w2"].slow_since_s == 5.0


def test_the_rss_trend_is_the_least_squares_slope_of_the_last_minute_after_the_warm_up():
    w = ActorWatch(trend=TrendParams(warmup_s=15.0, every_s=1.0, span_s=60.0, min_points=5, min_span_s=10.0))
    for t in range(0, 15):  # warming up: fast growth that is no leak
        w.rss("ps-0", float(t), 100.0 + 50.0 * t)
    assert w.trend("ps-0") == 0.0
    for t in range(15, 19):  # four samples are not enough
        w.rss("ps-0", float(t), 1000.0 + 2.0 * t)
    assert w.trend("ps-0") == 0.0
    for t in range(19, 200):
        w.rss("ps-0", float(t), 1000.0 + 2.0 * t + (5.0 if t % 2 else -5.0))
    assert w.trend("ps-0") == pytest.approx(2.0, rel=0.01)
    for t in range(200, 300):  # flat for over a minute: what came before no longer counts
        w.rss("ps-0", float(t), 1400.0)
    assert w.trend("ps-0") == pytest.approx(0.0, abs=1e-9)
    w.forget("ps-0")
    assert w.trend("ps-0") == 0.0


def test_the_view_fills_in_straggler_marks_and_trends_of_the_reports():
    d = driver()
    for t in range(20, 60):
        d.rss("w0", float(t), 100.0 + t)
    reports = [worker("w0", 0.1, 60.0, rss_mb=160.0), worker("w1", 0.3, 60.0), worker("w2", 0.1, 60.0)]
    actors = d.view(60.0, A, Progress(0, 1), reports).actors
    assert actors["w0"].rss_trend_mb_per_s == pytest.approx(1.0) and actors["w0"].slow_since_s is None
    assert actors["w1"].slow_since_s == 60.0 and actors["w1"].rss_trend_mb_per_s == 0.0
    assert reports[1].slow_since_s is None  # the caller's reports are left as they were
