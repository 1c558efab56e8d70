"""The simulator's ground truths (dlrover.sim.truth, dlrover.sim.profile_truth) and the
synthetic trace's CPU over-requests. No Ray."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dlrover.errors import DataError
from dlrover.resource.configs import Config
from dlrover.resource.perf_model import PerfParams, throughput
from dlrover.sim import ClusterSpec, SimSettings, simulate, synthetic_trace
from dlrover.sim.cluster import Cluster, cores_speed
from dlrover.sim.profile import Profile, load_profile, save_profile
from dlrover.sim.profile_truth import ProfileTruth, make_truth
from dlrover.sim.trace import CPU_UTIL_PS, CPU_UTIL_WORKER, OVER_REQUEST_SIGMA, cpu_over_requests, over_request_mu, validate_trace
from dlrover.sim.truth import TRUTH_TERMS, SaturatingParams, SaturatingTruth, amdahl, hot_share, request_for

T = PerfParams(t0=0.01, t1=6e-4, t2=0.03, t3=0.004, t4=3e-4)
B = 512
QUIET = dict(perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)
FREE = SimSettings(restart_s=0.0, rescale_s=0.0, rescale_pause_s=0.0, measure_noise=0.0)


def row(c: Config, samples: int = 2_000_000, **more) -> dict:
    r = {
        "job_id": "j", "submit_s": 0.0, "signature": "m", "batch_size": B, "samples": samples, "epochs": 1,
        "req_workers": c.workers, "req_ps": c.ps, "req_worker_cpu": c.worker_cpu, "req_ps_cpu": c.ps_cpu,
        "req_worker_memory_mb": 4096, "req_ps_memory_mb": 8192, **dict(zip(TRUTH_TERMS, T)),
        "worker_memory_need_mb": 1000, "ps_memory_need_mb": 2000,
    }  # fmt: skip
    r.update(more)
    return r


def jct(r: dict, truth: str, cluster: ClusterSpec | None = None) -> float:
    cl = cluster or ClusterSpec(nodes=1, node_cpu=256, node_memory_mb=10**6, **QUIET)
    res = simulate(validate_trace(pd.DataFrame([r]), source="t"), "static", cluster=cl, settings=SimSettings(**{**FREE.__dict__, "truth": truth}))
    assert res.jobs.iloc[0]["status"] == "completed"
    return float(res.jobs.iloc[0]["jct_s"])


def test_each_truth_is_selectable_and_runs_at_its_own_rate():
    c = Config(4, 2, 4.0, 2.0)
    r = row(c, serial_worker=0.3, serial_ps=0.4, ps_hot_share=0.1)
    sat = SaturatingTruth(SaturatingParams(T, 0.3, 0.4, 0.1))
    model_thr = float(throughput(T, 4, 2, 4.0, 2.0, B)[0])
    assert jct(r, "model") == pytest.approx(2_000_000 / model_thr, rel=1e-9)
    assert jct(r, "saturating") == pytest.approx(2_000_000 / sat.throughput(c, B), rel=1e-9)
    assert jct(r, "profile") == pytest.approx(jct(r, "saturating"), rel=1e-12)  # nothing measured: the saturating truth
    assert sat.throughput(c, B) < 0.8 * model_thr  # a different truth, not a relabelled one
    assert type(make_truth("model", r)).__name__ == "ModelTruth"
    with pytest.raises(ValueError, match="truth: expected one of model, saturating, profile"):
        make_truth("oracle", r)
    # Without the optional columns the saturating truth takes its documented defaults.
    assert make_truth("saturating", row(c)).params == SaturatingParams(T)


def test_saturating_reduces_to_the_model_form_where_it_should():
    """No serial fraction, no hot spot: one worker (any PS, which it reaches in parallel)
    runs exactly at the model's rate; many workers at the busiest queue's, not the sum."""
    flat = SaturatingTruth(SaturatingParams(T, 0.0, 0.0, 0.0))
    for p, cw, cp in ((1, 1.0, 1.0), (4, 4.0, 2.0), (8, 16.0, 8.0)):
        c = Config(1, p, cw, cp)
        assert flat.throughput(c, B) == pytest.approx(float(throughput(T, 1, p, cw, cp, B)[0]), rel=1e-12)
    many = Config(4096, 4, 8.0, 2.0)
    assert flat.throughput(many, B) == pytest.approx(B / ((T.t2 / 2.0 + T.t3) / 4), rel=0.01)
    assert flat.throughput(many, B) > 1.05 * float(throughput(T, 4096, 4, 8.0, 2.0, B)[0])


def test_threads_give_diminishing_returns():
    """Worker compute alone: the speed-up from n threads is Amdahl's 1 / (s + (1 - s)/n),
    not n as in the policy's model; and every doubling gives less than double."""
    compute = PerfParams(0.0, 6e-4, 0.0, 0.0, 0.0)
    for s in (0.1, 0.25, 0.5):
        truth = SaturatingTruth(SaturatingParams(compute, s, 0.3, 0.05))
        one = truth.throughput(Config(1, 1, 1.0, 1.0), B)
        for n in (2.0, 4.0, 16.0):
            got = truth.throughput(Config(1, 1, n, 1.0), B) / one
            assert got == pytest.approx(1.0 / amdahl(n, s), rel=1e-9) and got < n
    sat = SaturatingTruth(SaturatingParams(T))
    for c in (Config(8, 4, 2.0, 2.0), Config(8, 4, 8.0, 2.0), Config(16, 8, 4.0, 4.0)):
        assert sat.throughput(c.replace(worker_cpu=2 * c.worker_cpu), B) < 2 * sat.throughput(c, B)
        assert sat.throughput(c.replace(ps_cpu=2 * c.ps_cpu), B) < 2 * sat.throughput(c, B)


def test_the_busiest_ps_bounds_throughput():
    """Adding PS stops helping once the hot spot dominates; many workers run at the busiest
    queue's rate, 1 / its demand per worker-step, whatever the model's form says."""
    q = 0.1
    truth = SaturatingTruth(SaturatingParams(T, 0.25, 0.3, q))
    c = Config(64, 16, 8.0, 4.0)
    per_step = T.t2 * amdahl(4.0, 0.3) + T.t3
    bound = B / (hot_share(16, q) * per_step)
    assert truth.throughput(c, B) <= bound * (1 + 1e-9)
    assert truth.throughput(Config(512, 16, 8.0, 4.0), B) == pytest.approx(bound, rel=0.02)
    # 4x the PS: at most the busiest PS's share falls (1.37x here), the model gives more
    gain = truth.throughput(c.replace(ps=64), B) / truth.throughput(c, B)
    model_gain = float(throughput(T, 64, 64, 8.0, 4.0, B)[0] / throughput(T, 64, 16, 8.0, 4.0, B)[0])
    assert gain <= hot_share(16, q) / hot_share(64, q) < model_gain
    assert hot_share(1, q) == 1.0 and hot_share(1000, q) == pytest.approx(q, abs=1e-3)


def test_dense_exchange_cost_grows_with_workers():
    """Only the dense PS: per-worker step time grows with the workers (its queue), the
    job's rate flattens at 1 / t4 steps/s."""
    dense = SaturatingTruth(SaturatingParams(PerfParams(0.01, 0.0, 0.0, 0.0, 2e-3), 0.0, 0.0, 0.0))
    steps = [dense.step_time(Config(w, 1, 1.0, 1.0), B) for w in (1, 4, 16, 64)]
    assert steps == sorted(steps) and steps[-1] > 5 * steps[0]
    assert dense.throughput(Config(64, 1, 1.0, 1.0), B) == pytest.approx(B / 2e-3, rel=0.01)


def test_overcommitted_cores_slow_actors_that_share_them():
    assert cores_speed(8.0, 8.0, 0.3) == 1.0
    assert cores_speed(16.0, 8.0, 0.3) == pytest.approx((8 + 0.3 * 8) / 16)
    cl = Cluster(ClusterSpec(nodes=2, node_cpu=32, **QUIET), np.random.default_rng(0))
    one, two = np.zeros(4, dtype=np.int64), np.array([0, 0, 1, 1])
    ps = np.zeros(1, dtype=np.int64)
    assert cl.job_speed(one, ps, 5.0, 2.0, cores=16.0, smt_gain=0.3) == pytest.approx((16 + 0.3 * 6) / 22)
    assert cl.job_speed(two, ps, 5.0, 2.0, cores=16.0, smt_gain=0.3) == pytest.approx(0.95)  # spread: locality only
    # A whole simulation: a lightly over-requested job alone on a node of 10 CPUs. By
    # default the saturating truth's node has 5 physical cores (2 hardware threads each):
    # the job keeps more than 5 CPUs busy and runs at cores_speed of them; given 10
    # physical cores it runs on cores of its own.
    c = Config(8, 2, 1.0, 1.0)
    r = row(c)
    busy = make_truth("saturating", r).used_cpu(c, B)
    assert 5.0 < busy < 10.0
    own = jct(r, "saturating", ClusterSpec(nodes=1, node_cpu=10, node_memory_mb=10**6, node_cores=10.0, **QUIET))
    shared = jct(r, "saturating", ClusterSpec(nodes=1, node_cpu=10, node_memory_mb=10**6, **QUIET))
    assert shared == pytest.approx(own / cores_speed(busy, 5.0, 0.3), rel=1e-9) and shared > 1.1 * own
    # The model truth knows no over-commit unless node_cores says so (today's behaviour).
    assert jct(r, "model", ClusterSpec(nodes=1, node_cpu=10, node_memory_mb=10**6, **QUIET)) == pytest.approx(
        2_000_000 / float(throughput(T, 8, 2, 1.0, 1.0, B)[0]), rel=1e-9
    )


def dev_like_profile(name: str = "p") -> Profile:
    pts = pd.DataFrame({
        "workers": [1, 2, 2, 1, 1, 3, 1], "ps": [1, 1, 2, 2, 1, 1, 1], "worker_cpu": [1.0, 1, 1, 1, 2, 1, 1],
        "ps_cpu": [1.0, 1, 1, 1, 1, 1, 1], "throughput": [33e3, 46e3, 36e3, 24e3, 26e3, 45e3, 31e3],
        "duration_s": [20.0, 18, 12, 22, 30, 19, 10], "source": "r",
    })  # fmt: skip  (the first configuration measured twice)
    return Profile(name, 2048, pts, cores=2.0)


def test_profile_truth_reproduces_its_measured_points_and_fills_in_between(tmp_path):
    prof = dev_like_profile()
    truth = ProfileTruth(prof)
    pts = prof.points
    for (w, p, cw, cp), g in pts.groupby(["workers", "ps", "worker_cpu", "ps_cpu"]):
        c = Config(int(w), int(p), float(cw), float(cp))
        measured = np.exp(np.average(np.log(g["throughput"]), weights=g["duration_s"]))  # repeats: weighted mean
        assert truth.throughput(c, 2048) / float(prof.overcommit(w, p, cw, cp)) == pytest.approx(measured, rel=1e-9)
    far = Config(32, 16, 8.0, 4.0)
    assert truth.throughput(far, 2048) == pytest.approx(truth.base.throughput(far, 2048), rel=1e-6)
    near = Config(2, 1, 2.0, 1.0)  # one doubling from three measured points
    assert truth.correction(near) != pytest.approx(1.0, abs=1e-3)
    # The simulator on the measured machine's cores gives the measured rate back, as the
    # model truth cannot (the calibration bench's check).
    from dlrover.bench.sim_calibration import calibrate_profile

    once = Profile("once", 2048, pts.iloc[:-1], cores=2.0)  # each configuration measured once
    path = str(save_profile(once, tmp_path / "once.csv"))
    r = calibrate_profile(load_profile(path), path, budget_cpu=4.0)
    assert r["profile_truth"]["in_sample"]["max_error"] < 1e-6 < r["in_sample"]["max_error"]


def test_profile_rows_under_each_truth(tmp_path):
    path = str(save_profile(dev_like_profile(), tmp_path / "p.csv"))
    r = row(Config(2, 1, 1.0, 1.0), profile=path, **dict.fromkeys(TRUTH_TERMS, None))
    assert type(make_truth("model", r)).__name__ == "ModelTruth"
    assert isinstance(make_truth("saturating", r), SaturatingTruth)
    assert isinstance(make_truth("profile", r), ProfileTruth)


def test_cpu_over_request_draws_match_their_documented_parameters():
    """Log-normal, log-mean and -sd as documented; mean utilisation (1 / over-request) the
    DLRover-RM Fig. 4 figures: 0.20 for workers, 0.15 for PS."""
    w, p = cpu_over_requests(np.random.default_rng(0), 40_000)
    for x, util in ((w, CPU_UTIL_WORKER), (p, CPU_UTIL_PS)):
        assert np.log(x).mean() == pytest.approx(over_request_mu(util), abs=0.01)
        assert np.log(x).std() == pytest.approx(OVER_REQUEST_SIGMA, abs=0.01)
        assert (1.0 / x).mean() == pytest.approx(util, rel=0.02)
        assert x.min() >= 1.0
    assert (CPU_UTIL_WORKER, CPU_UTIL_PS) == (0.20, 0.15)


def test_synthetic_trace_requests_follow_the_over_requests():
    """At the request, under the saturating truth, actors keep busy about the documented
    share of their CPUs. Over distinct requests (jobs of a model mostly repeat one): CPUs
    in halves, at least half a CPU, at most 32, bend it a little (documented)."""
    tr = synthetic_trace(1500, seed=0)
    distinct = tr.drop_duplicates(["signature", "req_workers", "req_ps", "req_worker_cpu", "req_ps_cpu"])
    assert len(distinct) > 300
    uw, up = [], []
    for r in distinct.to_dict("records"):
        c = Config(r["req_workers"], r["req_ps"], r["req_worker_cpu"], r["req_ps_cpu"])
        s = make_truth("saturating", r).solve(c, r["batch_size"])
        uw.append(s.worker_busy / c.worker_cpu)
        up.append(s.ps_busy / c.ps_cpu)
    assert np.mean(uw) == pytest.approx(CPU_UTIL_WORKER, abs=0.03)
    assert np.mean(up) == pytest.approx(CPU_UTIL_PS, abs=0.025)
    assert np.std(np.log(uw)) == pytest.approx(OVER_REQUEST_SIGMA, abs=0.15)
    assert ((tr["req_worker_cpu"] * 2) % 1 == 0).all() and tr["req_ps_cpu"].min() >= 0.5
    # request_for solves the fixed point: busy CPUs x over-request = the CPUs asked (before rounding)
    sat = SaturatingTruth(SaturatingParams(T))
    cw, cp = request_for(sat, 8, 4, B, 5.0, 7.0, max_cpu=1e9, step=1e-6)
    s = sat.solve(Config(8, 4, cw, cp), B)
    assert cw / s.worker_busy == pytest.approx(5.0, rel=1e-2) and cp / s.ps_busy == pytest.approx(7.0, rel=1e-2)


def test_trace_validates_the_saturating_columns():
    ok = validate_trace(pd.DataFrame([row(Config(1, 1, 1.0, 1.0), serial_worker=0.2)]), source="t")
    assert ok["serial_worker"].iloc[0] == 0.2 and math.isnan(ok["serial_ps"].iloc[0])
    with pytest.raises(DataError, match=r"t.csv:2: serial_worker: must be from 0 to below 1"):
        validate_trace(pd.DataFrame([row(Config(1, 1, 1.0, 1.0), serial_worker=1.5)]), source="t.csv")
    with pytest.raises(DataError, match=r"ps_hot_share: must be from 0 to 1"):
        validate_trace(pd.DataFrame([row(Config(1, 1, 1.0, 1.0), ps_hot_share=-0.1)]), source="t.csv")


def test_cli_truth_and_seeds(tmp_path, capsys):
    from dlrover.cli.main import main

    base = ["simulate", "--jobs", "12", "--nodes", "4", "--no-failures", "--out", str(tmp_path / "o")]
    assert main([*base, "--truth", "oracle"]) == 2
    assert "--truth: expected one or more of model, saturating, profile" in capsys.readouterr().err
    assert main([*base, "--truth", "model,saturating", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    model, sat = (json.loads(x) for x in lines)
    assert model[0]["jct_mean_s"] != sat[0]["jct_mean_s"]
    assert main([*base, "--seeds", "2", "--truth", "profile"]) == 0
    out = capsys.readouterr().out
    assert "truth profile, seeds 0, 1" in out and "dlrover_rm" in out and "JCT" in out and "±" in out
    frame = pd.read_csv(tmp_path / "o" / "summary_seeds.csv")
    assert sorted(set(frame["seed"])) == [0, 1] and set(frame["policy"]) == {"static", "dlrover_rm"}
