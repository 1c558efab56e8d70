"""Cluster simulator: exact JCTs on a hand-computable trace, failure rates, memory, placement,
trace validation and the CLI. (Live and simulated decisions are compared in test_driver.py
and test_elastic.py.)"""

import json
import math

import numpy as np
import pandas as pd
import pytest

from dlrover.errors import DataError
from dlrover.resource.perf_model import PerfParams, step_time, throughput
from dlrover.resource.configs import Config
from dlrover.sim import ClusterSpec, SimSettings, Simulator, read_trace, simulate, synthetic_trace, write_trace
from dlrover.sim.cluster import Cluster
from dlrover.sim.job import t_iter
from dlrover.sim.report import JSON_KEYS, metrics
from dlrover.sim.truth import TRUTH_TERMS

TRUTH = PerfParams(t0=0.01, t1=6e-4, t2=0.03, t3=0.004, t4=3e-4)
QUIET = dict(perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)  # no variability, stragglers or failures


def job(job_id, submit_s, samples, w, p, cw, cp, **more):
    row = {
        "job_id": job_id, "submit_s": submit_s, "signature": "m", "batch_size": 512, "samples": samples, "epochs": 1,
        "req_workers": w, "req_ps": p, "req_worker_cpu": cw, "req_ps_cpu": cp,
        "req_worker_memory_mb": 4096, "req_ps_memory_mb": 8192, **dict(zip(TRUTH_TERMS, TRUTH)),
        "worker_memory_need_mb": 1000, "ps_memory_need_mb": 2000,
    }  # fmt: skip
    row.update(more)
    return row


def thr(w, p, cw, cp):
    return float(throughput(TRUTH, w, p, cw, cp, 512)[0])


def test_tiny_trace_gives_exact_jcts():
    """One 16-CPU node. A (12 CPU) runs at once; B (12 CPU) waits for A; C (4 CPU) fits
    next to A and starts on arrival (backfill). JCT = wait + restart_s + samples / throughput."""
    trace = pd.DataFrame([
        job("a", 0.0, 3_000_000, 2, 1, 4.0, 4.0),
        job("b", 100.0, 2_000_000, 2, 1, 4.0, 4.0),
        job("c", 200.0, 1_000_000, 1, 1, 2.0, 2.0),
    ])  # fmt: skip
    s = SimSettings(restart_s=60.0, measure_noise=0.0)
    r = simulate(trace, "static", cluster=ClusterSpec(nodes=1, node_cpu=16, node_memory_mb=64 * 1024, **QUIET), settings=s)
    jct = r.jobs.set_index("job_id")["jct_s"]
    a_end = 60.0 + 3_000_000 / thr(2, 1, 4.0, 4.0)
    assert jct["a"] == pytest.approx(a_end, rel=1e-9)
    assert jct["b"] == pytest.approx(a_end - 100.0 + 60.0 + 2_000_000 / thr(2, 1, 4.0, 4.0), rel=1e-9)
    assert jct["c"] == pytest.approx(60.0 + 1_000_000 / thr(1, 1, 2.0, 2.0), rel=1e-9)
    m = metrics(r)
    assert m["completion_rate"] == 1.0 and m["jct_mean_s"] == pytest.approx(jct.mean())
    assert m["makespan_s"] == pytest.approx(max(a_end, a_end + 60 + 2_000_000 / thr(2, 1, 4.0, 4.0)), rel=1e-9)


def test_a_job_that_can_never_fit_fails_as_unschedulable():
    """3 workers of 40 CPU on 2 nodes of 64: the totals fit, the actors never do."""
    trace = pd.DataFrame([job("big", 0.0, 10**6, 3, 1, 40.0, 4.0), job("ok", 1.0, 10**6, 1, 1, 4.0, 4.0)])
    r = simulate(trace, "static", cluster=ClusterSpec(nodes=2, node_cpu=64, **QUIET))
    status = r.jobs.set_index("job_id")["status"]
    assert status["big"] == "failed" and status["ok"] == "completed"
    assert (r.events["kind"] == "unschedulable").sum() == 1


def test_t_iter_equals_the_perf_model():
    for c in [Config(1, 1, 1.0, 1.0), Config(7, 3, 2.0, 8.0), Config(32, 12, 8.0, 4.0)]:
        assert t_iter(TRUTH, c, 512) == pytest.approx(float(step_time(TRUTH, c.workers, c.ps, c.worker_cpu, c.ps_cpu, 512)[0]), rel=1e-12)


def test_node_failures_at_a_known_rate_give_the_expected_mttf():
    """1,000 nodes failing at 0.05 per node-day: cluster MTTF = 1 / (N r) = 1.73 min."""
    nodes, rate, days = 1000, 0.05, 10.0
    trace = pd.DataFrame([job("long", 0.0, 10**15, 1, 1, 1.0, 1.0, max_failures=10**6)])
    spec = ClusterSpec(nodes=nodes, perf_sigma=0.0, p_slow=0.0, failure_rate=rate, repair_s=60.0)
    r = simulate(trace, "static", cluster=spec, settings=SimSettings(horizon_s=days * 86400), seed=3)
    expected_mttf = 86400.0 / (nodes * rate)
    observed = days * 86400 / r.node_failures
    assert observed == pytest.approx(expected_mttf, rel=0.1), (observed, expected_mttf, r.node_failures)
    assert r.jobs.loc[0, "status"] == "unfinished"


def test_lost_ps_rolls_back_and_too_many_failures_fail_the_job():
    trace = pd.DataFrame([job("j", 0.0, 5 * 10**9, 2, 2, 4.0, 4.0, max_failures=2)])
    spec = ClusterSpec(nodes=4, perf_sigma=0.0, p_slow=0.0, failure_rate=20.0, repair_s=600.0)  # a failure every ~20 min
    r = simulate(trace, "static", cluster=spec, seed=1)
    row = r.jobs.iloc[0]
    assert row["status"] == "failed" and row["failures"] == 3
    assert metrics(r)["completion_rate"] == 0.0


def test_under_sized_memory_is_oom_killed_under_static_and_avoided_by_dlrover_rm():
    """PS memory below the tables' peak: static's PS is killed and restarted with 1.5x (as the
    live master does); dlrover_rm reads the RSS trend and raises it first."""
    row = job("j", 0.0, 2 * 10**8, 2, 1, 4.0, 4.0, req_ps_memory_mb=9000, ps_memory_need_mb=12000, budget_memory_mb=64 * 1024)
    spec = ClusterSpec(nodes=2, node_cpu=32, **QUIET)
    static = simulate(pd.DataFrame([row]), "static", cluster=spec).jobs.iloc[0]
    assert static["status"] == "completed" and static["oom_kills"] >= 1
    rm = simulate(pd.DataFrame([row]), "dlrover_rm", cluster=spec, knobs={"max_changes": 0}).jobs.iloc[0]
    assert rm["status"] == "completed" and rm["oom_kills"] == 0, rm.to_dict()


def test_stragglers_slow_jobs_and_dlrover_rm_moves_workers_off_slow_nodes():
    """Two workers per node, so a slow node slows a minority of a job's six workers: those
    are stragglers against the median (as live) and dlrover_rm moves them."""
    rows = [job(f"j{i}", 0.0, 3 * 10**8, 6, 1, 4.0, 4.0) for i in range(4)]
    spec = ClusterSpec(nodes=16, node_cpu=8, perf_sigma=0.0, failure_rate=0.0, p_slow=0.05, p_stay=0.8, straggle_step_s=300)
    fast = simulate(pd.DataFrame(rows), "static", cluster=ClusterSpec(nodes=16, node_cpu=8, **QUIET))
    slow = simulate(pd.DataFrame(rows), "static", cluster=spec, seed=2)
    assert metrics(slow)["jct_mean_s"] > metrics(fast)["jct_mean_s"] * 1.05
    rm = simulate(pd.DataFrame(rows), "dlrover_rm", cluster=spec, seed=2, knobs={"max_changes": 0})
    assert (rm.events["kind"] == "replace").any()
    assert metrics(rm)["jct_mean_s"] < metrics(slow)["jct_mean_s"]


def test_pal_classes_and_placement_prefer_fast_nodes():
    c = Cluster(ClusterSpec(nodes=30, perf_sigma=0.3, perf_classes=3), np.random.default_rng(0))
    assert c.cls_score[0] > c.cls_score[-1]  # numbered fastest first
    assert c.perf[c.cls == 0].min() > c.perf[c.cls == 2].max()
    got = c.place(2, 4.0, 1000, 1, 4.0, 1000, pal=True)
    assert got is not None and all(c.cls[n] == 0 for n in np.concatenate(got))
    c2 = Cluster(ClusterSpec(nodes=30, perf_sigma=0.3, perf_classes=3), np.random.default_rng(0))
    packed = c2.place(2, 4.0, 1000, 1, 4.0, 1000, pal=False)
    assert c.job_speed(*got) >= c2.job_speed(*packed)
    assert c.free_cpu.sum() == pytest.approx(30 * 64 - 12)


def test_synthetic_trace_is_production_like_and_round_trips(tmp_path):
    tr = synthetic_trace(300, seed=4)
    assert len(tr) == 300 and tr["job_id"].is_unique and (tr["submit_s"].diff().dropna() >= 0).all()
    hours = tr["samples"] * tr["epochs"] / [thr_(r) for r in tr.itertuples()] / 3600
    assert hours.median() < 2.5 and hours.max() > 5 and (hours > 3).mean() < 0.4  # many small jobs, a few large ones
    assert tr["signature"].value_counts().iloc[0] >= 10  # recurring models (history for warm starts)
    cpu = tr["req_workers"] * tr["req_worker_cpu"] + tr["req_ps"] * tr["req_ps_cpu"]
    assert (tr["budget_cpu"] >= cpu).all()
    ps_share = tr["ps_memory_need_mb"] / tr["req_ps"] + 512
    assert (tr["req_ps_memory_mb"] > ps_share).mean() > 0.7  # most users over-request memory
    for name in ("t.csv", "t.parquet"):
        p = write_trace(tr, tmp_path / name)
        back = read_trace(p)
        pd.testing.assert_frame_equal(back, tr, check_dtype=False)


def thr_(r):
    return float(throughput(PerfParams(r.t0, r.t1, r.t2, r.t3, r.t4), r.req_workers, r.req_ps, r.req_worker_cpu, r.req_ps_cpu, r.batch_size)[0])


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda df: df.drop(columns=["req_ps"]), "missing column(s) req_ps"),
        (lambda df: df.assign(extra=1), "unknown column(s) extra"),
        (lambda df: df.assign(req_workers=[2, -1]), "t.csv:3: req_workers: must be a positive number"),
        (lambda df: df.assign(req_workers=[2, 1.5]), "t.csv:3: req_workers: must be an integer"),
        (lambda df: df.assign(samples=["100", "lots"]), "t.csv:3: samples: not a number: 'lots'"),
        (lambda df: df.assign(job_id=["x", "x"]), "t.csv:3: job_id: duplicate 'x'"),
        (lambda df: df.assign(t2=[0.03, None]), "t.csv:3: t2: t0..t4 must all be given"),
        (lambda df: df.assign(budget_cpu=[100, 1]), "t.csv:3: budget_cpu: 1 is below the request (12)"),
    ],
)
def test_bad_traces_are_one_line_errors_naming_line_and_column(tmp_path, edit, message):
    df = pd.DataFrame([job("a", 0.0, 1000, 2, 1, 4.0, 4.0), job("b", 1.0, 1000, 2, 1, 4.0, 4.0)])
    path = tmp_path / "t.csv"
    edit(df).to_csv(path, index=False)
    with pytest.raises(DataError) as e:
        read_trace(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="trace file not found"):
        read_trace(tmp_path / "nope.csv")


def test_same_trace_same_seed_is_deterministic():
    tr = synthetic_trace(40, seed=1, nodes=8)
    a = metrics(simulate(tr, "dlrover_rm", cluster=ClusterSpec(nodes=8), seed=5))
    b = metrics(simulate(tr, "dlrover_rm", cluster=ClusterSpec(nodes=8), seed=5))
    assert a == b


def test_simulator_calls_the_policy_objects_it_is_given():
    """The simulator runs whatever Policy objects the factory makes (the live master's
    factory by default): it asks initial() once per job and decide() every tick."""
    from dlrover.resource.static import StaticPolicy

    calls = {"initial": 0, "decide": 0}

    class Spy(StaticPolicy):
        def initial(self, view):
            calls["initial"] += 1
            assert view.requested is not None and view.budget.cpu >= view.requested.cpu
            return super().initial(view)

        def decide(self, view):
            calls["decide"] += 1
            assert 0.0 <= view.progress <= 1.0 and view.config.fits(view.budget)
            return super().decide(view)

    tr = synthetic_trace(20, seed=2, nodes=6)
    Simulator(tr, Spy, ClusterSpec(nodes=6)).run()
    assert calls["initial"] == 20 and calls["decide"] > 20


def test_a_simulated_jobs_first_window_records_the_plan_that_chose_its_start():
    """As live: the first window carries the initial plan's stage and prediction."""
    from dlrover.resource.policies import policy_factory
    from dlrover.sim import cluster_policy_config

    trace = pd.DataFrame([job("a", 0.0, 2_000_000, 2, 1, 2.0, 2.0)])
    make = policy_factory("dlrover_rm", cluster_policy_config("dlrover_rm", None), None, overrides_source="test")
    sim = Simulator(trace, make, ClusterSpec(nodes=1, node_cpu=16, node_memory_mb=64 * 1024, **QUIET), SimSettings(measure_noise=0.0))
    sim.run()
    (j,) = sim.jobs
    first = j.driver.measurements[0]
    assert j.initial_plan is not None and j.initial_plan.stage in ("request", "default")
    assert first.config == j.initial_plan.config and first.stage == j.initial_plan.stage
    assert first.predicted is not None and first.predicted > 0


def exit_code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's one-line errors exit
        return int(e.code)


def test_simulate_cli_json_table_and_files(tmp_path, capsys):
    from dlrover.cli.main import main

    out = tmp_path / "sim"
    assert main(["simulate", "--jobs", "30", "--nodes", "6", "--policies", "static,dlrover_rm+pal", "--json", "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["static", "dlrover_rm+pal"]
    for r in rows:
        assert list(r) == JSON_KEYS and 0 < r["completion_rate"] <= 1 and math.isfinite(r["jct_mean_s"])
    for name in ("summary.csv", "jobs_static.csv", "timeline_dlrover_rm+pal.csv", "jct_cdf.png", "utilisation.png"):
        assert (out / name).stat().st_size > 0, name
    assert main(["simulate", "--jobs", "30", "--nodes", "6", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "DLRover-RM paper" in text and "vs static" in text and "-31%" in text
    assert main(["simulate", "--policies", "static,nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    for bad in (["--seed", "-1"], ["--failure-rate", "nan"], ["--tick", "0.001"], ["--out", str(out / "summary.csv" / "x")]):
        assert exit_code(main, ["simulate", "--jobs", "5", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("error:") and err.count("\n") == 1, err
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s\nx,1\n")
    assert main(["simulate", "--trace", str(bad)]) == 2
    assert "missing column(s)" in capsys.readouterr().err


def failing_job_under(settings: SimSettings) -> pd.Series:
    """One long job on nodes that fail about every 20 minutes (every failure survived)."""
    trace = pd.DataFrame([job("j", 0.0, 2 * 10**9, 2, 2, 4.0, 4.0, max_failures=10**6)])
    spec = ClusterSpec(nodes=4, perf_sigma=0.0, p_slow=0.0, failure_rate=20.0, repair_s=600.0)
    return simulate(trace, "static", cluster=spec, seed=1, settings=settings).jobs.iloc[0]


def test_the_live_failure_policy_decides_what_a_simulated_failure_costs():
    """The same FailurePolicy as the live master: a partially recovered PS keeps the trained
    samples, a rollback replays them, and ``restart`` rolls back on every failure."""
    partial, rollback, restart = (
        failing_job_under(SimSettings(ps_recovery="partial")),
        failing_job_under(SimSettings(ps_recovery="rollback")),
        failing_job_under(SimSettings(on_failure="restart")),
    )
    assert partial["failures"] > 0 and all(r["status"] == "completed" for r in (partial, rollback, restart))
    assert partial["jct_s"] < rollback["jct_s"] <= restart["jct_s"]  # (here every failure takes a PS with it)
