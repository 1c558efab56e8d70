"""The job loop both runtimes share (``dlrover.resource.driver``), on a fake clock: windows,
decisions, the budget check, memory after an OOM kill, straggler marks, RSS trends; and
the real ``dlrover_rm`` policy deciding the same live (the Controller, Ray-free) as in the
simulator when both are fed the same job."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import small_spec
from dlrover.master.scaler import ScaleOp, ScalePhase, ScalePlan, ScaleResult
from dlrover.resource.driver import ActorWatch, DecisionKind, PolicyDriver, Progress, TrendParams
from dlrover.resource.perf_model import PerfParams, throughput
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import ActorMetrics, JobView, Policy, ResourcePlan
from dlrover.resource.policies import load_policy
from dlrover.resource.static import StaticPolicy
from dlrover.sim.truth import TRUTH_TERMS

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


# -- one loop: dlrover_rm live and simulated ------------------------------------------------

TRUTH = PerfParams(t0=0.01, t1=1.2e-3, t2=0.01, t3=0.004, t4=3e-4)
NEEDS_MB = {"worker": 1000.0, "ps": 3300.0}  # the PS's share of the tables + 512 MB runs at 93% of its 4096 MB
REPORT_S = 10.0  # workers report this often
TICK_S = 300.0


class FakeLauncher:
    """The job's actors by name with their (CPUs, memory MB), as the real Launcher keeps them."""

    def __init__(self, job: str) -> None:
        self.job, self.workers, self.ps, self.resources, self.vmap = job, {}, {}, {}, "routing"
        self.next_worker = self.next_ps = 0

    def ps_name(self, k: int) -> str:
        return f"{self.job}/ps-{k}"

    def launch(self, c: Config) -> None:
        for _ in range(c.workers):
            self.add_worker(c.worker_cpu, c.worker_memory_mb)
        for _ in range(c.ps):
            self.add_ps(c.ps_cpu, c.ps_memory_mb)

    def add_worker(self, cpu: float, mem: int) -> str:
        name = f"{self.job}/worker-{self.next_worker}"
        self.next_worker += 1
        self.workers[name], self.resources[name] = name, (cpu, mem)
        return name

    def add_ps(self, cpu: float, mem: int) -> int:
        k = self.next_ps
        self.next_ps += 1
        self.ps[k], self.resources[self.ps_name(k)] = FakePS(self), (cpu, mem)
        return k

    def config(self, exclude: frozenset = frozenset()) -> Config:
        w = [self.resources[n] for n in self.workers if n not in exclude]
        p = [self.resources[self.ps_name(k)] for k in self.ps]
        return Config(len(w), len(p), w[0][0], p[0][0], w[0][1], p[0][1])


class FakePS:
    """A PS whose stats say what the simulator's truth says: RSS = its share of the tables + 512 MB."""

    def __init__(self, launcher: FakeLauncher) -> None:
        self.stats = SimpleNamespace(remote=lambda: {"uptime_s": 1.0, "busy_s": 0.0, "rss_mb": NEEDS_MB["ps"] / len(launcher.ps) + 512.0})


class FakeScaler:
    """Carries out a ScalePlan at once: new actors run as soon as they are asked for."""

    launch_timeout_s = 1.0

    def __init__(self, launcher: FakeLauncher) -> None:
        self.lz = launcher

    def begin(self, sp: ScalePlan) -> ScaleOp:
        new_workers = [self.lz.add_worker(*size) for size in sp.add_workers]
        new_ps = [self.lz.add_ps(*size) for size in sp.add_ps]
        return ScaleOp(sp, new_ps, new_workers, [], 0.0, float("inf"))

    def ready(self, op) -> bool:
        return True

    def start_new_workers(self, op) -> dict:
        return {}

    def start_migration(self, op: ScaleOp, ps_load: dict | None = None) -> None:
        op.phase = ScalePhase.DONE  # no vshard to move here: straight to the switch

    def finish(self, op: ScaleOp) -> ScaleResult:
        for k in op.plan.retire_ps:
            self.lz.resources.pop(self.lz.ps_name(k))
            del self.lz.ps[k]
        return ScaleResult(op.new_workers, list(op.plan.drain_workers), [])


class FakeMaster:
    """What the Controller reads of its JobMaster, on a fake clock."""

    def __init__(self, spec, total: float) -> None:
        self.spec, self.job_id, self.t0, self.now = spec, "t", 0.0, 0.0
        self.launcher = FakeLauncher("t")
        self.events = SimpleNamespace(add=lambda kind, **fields: None)
        self.scale_events: list = []
        self.books = FakeBooks(self.launcher, total)
        self.evaluator = SimpleNamespace(busy=lambda: False)
        self.recovery = SimpleNamespace(corrected=lambda *a: None)
        self.runs = SimpleNamespace(soon=lambda timeout_s: None)

    def clock(self) -> float:
        return self.now


class FakeBooks:
    """The books' calls the Controller makes; a drained worker leaves at once."""

    def __init__(self, launcher: FakeLauncher, total: float) -> None:
        self.launcher = launcher
        self.queue = SimpleNamespace(samples_done=0, samples_expected=int(total), finished=False)
        self.metrics: dict[str, dict] = {}

    def worker_reports(self) -> dict[str, dict]:
        return {n: dict(r) for n, r in self.metrics.items()}

    def draining(self) -> frozenset[str]:
        return frozenset()

    def settled(self) -> bool:
        return True

    def drain(self, names: list[str]) -> None:
        for n in names:
            del self.launcher.workers[n]
            self.launcher.resources.pop(n)
            self.metrics.pop(n, None)


def job_spec(tmp_path):
    return small_spec(
        tmp_path,
        data__batch_size=512,
        resources={"workers": 2, "ps": 1, "worker_cpu": 2, "ps_cpu": 2, "worker_memory_mb": 4096, "ps_memory_mb": 4096, "budget_cpu": 32, "budget_memory_mb": 65536},
        policy={"name": "dlrover_rm", "config": "policies/cluster/dlrover_rm.yaml", "interval_s": TICK_S, "warmup_s": 60.0, "history_dir": str(tmp_path / "history")},
    )


def live_decisions(spec, total: float) -> list[tuple[float, dict]]:
    """When the live Controller moved the job, and to what: its workers report every
    ``REPORT_S`` at the truth's throughput, it ticks every ``TICK_S`` once they run."""
    from dlrover.master.control import Controller

    m = FakeMaster(spec, total)
    p = spec.policy
    ctl = Controller(m, SimpleNamespace(files={}), load_policy(p.name, p.config, p.knobs))
    config = ctl.initial_config()
    m.launcher.launch(config)
    ctl.scaler = FakeScaler(m.launcher)
    ctl.started(config)
    samples = 0.0
    while samples < total:
        c = m.launcher.config()
        thr = float(throughput(TRUTH, c.workers, c.ps, c.worker_cpu, c.ps_cpu, 512)[0])
        samples = min(total, samples + thr * REPORT_S)
        m.now += REPORT_S
        m.books.queue.samples_done = int(samples)
        for w in m.launcher.workers:
            m.books.metrics[w] = {"step_time_s": c.workers * 512 / thr, "rss_mb": NEEDS_MB["worker"], "at_s": m.now}
            ctl.on_report(w, m.books.metrics[w], m.now, int(samples))
        if m.now % TICK_S == 0:
            ctl.tick({})
    ctl.finish({"status": "running"})
    return [(e.at_s, e.new.to_dict()) for e in m.scale_events]


def simulated_decisions(spec, total: float) -> list[tuple[float, dict]]:
    """When the simulator moved the same job, and to what: one node with room, no
    noise, no start-up or switch costs, ticks and warm-up as live."""
    from dlrover.resource.configs import job_budget
    from dlrover.sim import ClusterSpec, SimSettings, simulate

    r = spec.resources
    budget = job_budget(spec, Config.from_resources(r))
    row = {
        "job_id": "t", "submit_s": 0.0, "signature": "m", "batch_size": spec.data.batch_size, "samples": total, "epochs": 1,
        "req_workers": r.workers, "req_ps": r.ps, "req_worker_cpu": r.worker_cpu, "req_ps_cpu": r.ps_cpu,
        "req_worker_memory_mb": r.worker_memory_mb, "req_ps_memory_mb": r.ps_memory_mb, **dict(zip(TRUTH_TERMS, TRUTH)),
        "budget_cpu": budget.cpu, "budget_memory_mb": budget.memory_mb,
        "worker_memory_need_mb": NEEDS_MB["worker"], "ps_memory_need_mb": NEEDS_MB["ps"],
    }  # fmt: skip
    cluster = ClusterSpec(nodes=1, node_cpu=1000, node_memory_mb=10**7, perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)
    settings = SimSettings(
        control_interval_s=TICK_S, restart_s=0.0, rescale_s=0.0, rescale_pause_s=0.0, warmup_s=spec.policy.warmup_s,
        measure_noise=0.0, mem_start=1.0, max_ps=spec.train.vshards,
    )  # fmt: skip
    res = simulate(pd.DataFrame([row]), spec.policy.name, spec.policy.config, spec.policy.knobs, cluster=cluster, settings=settings)
    return [(e["t_s"], e["config"]) for e in res.events.to_dict("records") if e["kind"] == "scale"]


def test_dlrover_rm_takes_the_same_decisions_live_and_simulated(tmp_path, monkeypatch):
    """The real dlrover_rm policy, fed the same job (reports at the truth's throughput, PS
    RSS over its watermark) by the live Controller and by the simulator, makes the same
    decisions: a memory correction first, then a model-driven rescale once the cooldown
    and the profile window allow it."""
    import ray

    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: list(refs))  # the fake PS answer at once
    spec, total = job_spec(tmp_path), 3e8
    live = live_decisions(spec, total)
    assert [t for t, _ in live] == [TICK_S, 4 * TICK_S]  # the first tick; then the cooldown (900 s) after it
    (_, memory), (_, scaled) = live
    assert memory["ps_memory_mb"] > spec.resources.ps_memory_mb and scaled["workers"] > spec.resources.workers
    assert simulated_decisions(spec, total) == live
