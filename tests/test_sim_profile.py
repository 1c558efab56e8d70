"""Measured profiles (dlrover.sim.profile) and the simulator using one as ground truth. No Ray."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from dlrover.errors import DataError
from dlrover.resource.perf_model import PerfParams, throughput
from dlrover.resource.configs import Config
from dlrover.sim import ClusterSpec, SimSettings, simulate
from dlrover.sim.profile import FILE_COLUMNS, Profile, load_profile, profile_from_runs, save_profile
from dlrover.sim.trace import validate_trace

TRUE = PerfParams(t0=0.003, t1=2.5e-5, t2=0.006, t3=0.002, t4=0.003)
B = 2048
CONFIGS = [(1, 1, 1.0, 1.0), (2, 1, 1.0, 1.0), (2, 2, 1.0, 1.0), (1, 2, 1.0, 1.0), (1, 1, 2.0, 1.0), (3, 1, 1.0, 1.0), (2, 1, 1.0, 2.0), (1, 1, 2.0, 2.0)]


def synthetic_profile(params: PerfParams = TRUE, configs=CONFIGS, name: str = "synthetic") -> Profile:
    w, p, cw, cp = (np.array(c, dtype=np.float64) for c in zip(*configs))
    thr = throughput(params, w, p, cw, cp, B)
    pts = pd.DataFrame({"workers": w.astype(int), "ps": p.astype(int), "worker_cpu": cw, "ps_cpu": cp, "throughput": thr,
                        "duration_s": np.linspace(10.0, 14.0, len(w)), "source": "run-a"})  # fmt: skip
    return Profile(name, B, pts)


def test_save_load_round_trip(tmp_path):
    prof = synthetic_profile()
    path = save_profile(prof, tmp_path / "sub" / "mine.csv")
    assert path.read_text().splitlines()[0] == ",".join(FILE_COLUMNS)
    back = load_profile(str(path))
    assert back.name == "mine" and back.batch_size == B and len(back) == len(prof)
    pd.testing.assert_frame_equal(back.points, prof.points, check_exact=False, rtol=1e-9)
    assert back.truth() == pytest.approx(prof.truth(), rel=1e-8)


def test_truth_recovers_known_params_from_noise_free_points():
    grid = list(itertools.product([1, 2, 4, 6], [1, 2, 3], [0.5, 1.0, 2.0], [0.5, 1.0, 2.0]))
    prof = synthetic_profile(configs=grid)
    params, identified = prof.fit()
    assert identified == (True,) * 5 + (False, False)  # no host terms: the simulator puts over-commit back itself
    np.testing.assert_allclose(np.array(params), np.array(TRUE), rtol=0.02)
    # The bench's 8-configuration sweep identifies all five terms too.
    small = synthetic_profile()
    np.testing.assert_allclose(np.array(small.truth()), np.array(TRUE), rtol=0.02)
    c = Config(5, 2, 1.5, 0.5)
    expect = float(throughput(TRUE, 5, 2, 1.5, 0.5, B)[0])
    assert small.predict(c) == pytest.approx(expect, rel=0.02)
    assert small.predict(5, 2, 1.5, 0.5) == pytest.approx(small.predict(c), rel=1e-12)
    assert small.predict(np.array([1, 5]), 2, 1.5, 0.5).shape == (2,)


def test_unidentifiable_terms_are_pinned():
    prof = synthetic_profile(configs=[(1, 1, 1.0, 1.0), (2, 1, 1.0, 1.0), (3, 1, 1.0, 1.0)])
    _, identified = prof.fit()
    assert not all(identified)
    for c in prof.points.itertuples():  # the measured points still come back
        assert prof.predict(c.workers, c.ps, c.worker_cpu, c.ps_cpu) == pytest.approx(c.throughput, rel=1e-6)


@pytest.mark.parametrize("restart_s", [0.0, 37.5])
def test_trace_row_with_profile_runs_at_profile_rate(tmp_path, restart_s):
    prof = synthetic_profile()
    path = str(save_profile(prof, tmp_path / "p.csv"))
    c = Config(2, 1, 1.0, 2.0)
    samples, epochs = 5_000_000, 2
    row = {
        "job_id": "j", "submit_s": 0.0, "signature": "s", "batch_size": B, "samples": samples, "epochs": epochs,
        "req_workers": c.workers, "req_ps": c.ps, "req_worker_cpu": c.worker_cpu, "req_ps_cpu": c.ps_cpu,
        "req_worker_memory_mb": 2048, "req_ps_memory_mb": 2048, "profile": path,
        "worker_memory_need_mb": 512, "ps_memory_need_mb": 256,
    }  # fmt: skip
    trace = validate_trace(pd.DataFrame([row]), source="test")
    cluster = ClusterSpec(nodes=1, node_cpu=8.0, perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)
    settings = SimSettings(restart_s=restart_s, rescale_s=0.0, rescale_pause_s=0.0, measure_noise=0.0)
    r = simulate(trace, "static", cluster=cluster, settings=settings)
    job = r.jobs.iloc[0]
    assert job["status"] == "completed"
    expect = samples * epochs / prof.predict(c) + restart_s
    assert float(job["jct_s"]) == pytest.approx(expect, rel=1e-6)


def _write(tmp_path, text: str, name: str = "bad.csv") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


HEADER = "workers,ps,worker_cpu,ps_cpu,batch_size,throughput,duration_s,source\n"


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("", ":1:", ["empty"]),
        ("\n\n", ":1:", ["empty"]),
        (HEADER, ":2:", ["no points"]),
        ("workers,ps,worker_cpu,batch_size,throughput\n1,1,1,2048,100\n", ":1:", ["missing", "ps_cpu"]),
        ("workers,ps,worker_cpu,ps_cpu,batch_size,throughput,colour\n", ":1:", ["unknown", "colour"]),
        (HEADER + "1,1,1,1,2048,100,10,a\n1,1,2,1,2048,fast,10,a\n", ":3:", ["throughput", "not a number"]),
        (HEADER + "1,1,1,1,2048,100,10,a\n\n1,0,2,1,2048,100,10,a\n", ":4:", ["ps", "positive"]),
        (HEADER + "1.5,1,1,1,2048,100,10,a\n", ":2:", ["workers", "integer"]),
        (HEADER + "1,1,1,1,2048,100,10\n", ":2:", ["fields"]),
        (HEADER + "1,1,1,1,2048,100,10,a\n1,1,2,1,1024,100,10,a\n", ":3:", ["batch_size", "differs"]),
    ],
)
def test_bad_profile_files(tmp_path, text, where, words):
    path = _write(tmp_path, text)
    with pytest.raises(DataError) as e:
        load_profile(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"{path}{where}" in msg, msg
    for w in words:
        assert w in msg, msg


def test_optional_columns_and_lookup_errors(tmp_path):
    p = _write(tmp_path, "workers,ps,worker_cpu,ps_cpu,batch_size,throughput\n1,1,1,1,2048,100\n2,1,1,1,2048,180\n", "min.csv")
    prof = load_profile(p)
    assert prof.name == "min" and np.isnan(prof.points["duration_s"]).all() and (prof.points["source"] == "").all()
    assert prof.predict(1, 1, 1.0, 1.0) == pytest.approx(100.0, rel=0.02)
    with pytest.raises(DataError, match="no such profile"):
        load_profile("no_such_profile_name")
    with pytest.raises(DataError, match="not found"):
        load_profile(str(tmp_path / "nope" / "x.csv"))


def _run_dir(root, name: str, batch: int, measurements: list[tuple], last: tuple | None = None):
    """A run directory like ``runner.run_job`` writes: spec.json, events.jsonl, summary.json."""
    d = root / name
    d.mkdir()
    (d / "spec.json").write_text(json.dumps({"name": "x", "data": {"batch_size": batch, "epochs": 1}, "resources": {"workers": 1}}))
    events = [{"at_s": 0.5, "kind": "job_start", "job_id": name, "samples_expected": 10}]
    configs = []
    for i, (w, p, cw, cp, thr, dur) in enumerate([*measurements, *([last] if last else [])]):
        cfg = {"workers": w, "ps": p, "worker_cpu": cw, "ps_cpu": cp, "worker_memory_mb": 2048, "ps_memory_mb": 2048}
        if i < len(measurements):
            events.append({"at_s": 10.0 * (i + 1), "kind": "measurement", "config": cfg, "throughput": thr, "predicted": None, "duration_s": dur})
        configs.append({"config": cfg, "summary": "", "predicted_throughput": None, "measured_throughput": thr, "error": None, "duration_s": dur, "at_s": 10.0 * (i + 1)})
    events.append({"at_s": 99.0, "kind": "job_end", "status": "stopped"})
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (d / "summary.json").write_text(json.dumps({"job_id": name, "status": "stopped", "config": {"batch_size": batch}, "configurations": configs}))
    return d


def test_profile_from_runs(tmp_path):
    a = _run_dir(tmp_path, "run-a", B, [(1, 1, 1.0, 1.0, 1000.0, 12.0), (2, 1, 1.0, 1.0, 1800.0, 11.5)], last=(2, 2, 1.0, 1.0, 2100.0, 12.2))
    b = _run_dir(tmp_path, "run-b", B, [(1, 1, 2.0, 1.0, 1500.0, 3.0), (1, 2, 1.0, 1.0, 1100.0, 12.0)])
    prof = profile_from_runs([str(a), str(b)], "two")
    assert prof.name == "two" and prof.batch_size == B
    # The last window (only in summary.json's configurations) is kept, nothing is doubled.
    assert len(prof) == 5
    assert list(prof.points["source"]) == ["run-a"] * 3 + ["run-b"] * 2
    assert list(prof.points["throughput"]) == [1000.0, 1800.0, 2100.0, 1500.0, 1100.0]
    assert len(profile_from_runs([a, b], "long", min_duration_s=6.0)) == 4
    prof.truth()  # fits

    empty = _run_dir(tmp_path, "run-empty", B, [])
    with pytest.raises(DataError, match="no measurements") as e:
        profile_from_runs([a, empty], "x")
    assert "run-empty" in str(e.value) and "\n" not in str(e.value)
    other = _run_dir(tmp_path, "run-other", 1024, [(1, 1, 1.0, 1.0, 1000.0, 12.0)])
    with pytest.raises(DataError, match="batch_size 1024 differs"):
        profile_from_runs([a, other], "x")
    with pytest.raises(DataError, match="not a run directory"):
        profile_from_runs([tmp_path / "missing"], "x")


def test_profile_from_runs_reports_bad_event_line(tmp_path):
    d = _run_dir(tmp_path, "run-bad", B, [(1, 1, 1.0, 1.0, 1000.0, 12.0)])
    with open(d / "events.jsonl", "a") as f:
        f.write(json.dumps({"at_s": 9.0, "kind": "measurement", "config": {"workers": 1, "ps": 1, "worker_cpu": 1.0}, "throughput": 5.0, "duration_s": 1.0}) + "\n")
    with pytest.raises(DataError) as e:
        profile_from_runs([d], "x")
    assert f"{d / 'events.jsonl'}:4:" in str(e.value) and "ps_cpu" in str(e.value)


def test_calibration_of_a_noise_free_profile_is_exact(tmp_path):
    from dlrover.bench.sim_calibration import calibrate_profile, print_sim_calibration

    prof = synthetic_profile()
    path = str(save_profile(prof, tmp_path / "synthetic.csv"))
    r = calibrate_profile(prof, path, budget_cpu=6.0)
    assert r["in_sample"]["max_error"] < 1e-6
    assert r["loo"]["max_error"] < 1e-3  # the model's own form: LOO recovers it too
    assert r["within_goal"] and len(r["points"]) == len(CONFIGS)
    print_sim_calibration(r)


def test_overcommitted_machine_profile_fits_the_job_on_its_own_cores_and_the_sim_puts_the_overcommit_back(tmp_path):
    """Points measured on 2 physical cores (each configuration's CPUs / 2 slower when
    above 1): the fit recovers the uncontended truth, the file keeps node_cores, and the
    calibration (simulated on a node with node_cores=2) reproduces the points exactly."""
    from dlrover.bench.sim_calibration import calibrate_profile

    w, p, cw, cp = (np.array(c, dtype=np.float64) for c in zip(*CONFIGS))
    slow = np.maximum(1.0, (w * cw + p * cp) / 2.0)
    pts = pd.DataFrame({"workers": w.astype(int), "ps": p.astype(int), "worker_cpu": cw, "ps_cpu": cp,
                        "throughput": throughput(TRUE, w, p, cw, cp, B) / slow, "duration_s": 12.0, "source": "r"})  # fmt: skip
    prof = Profile("two-cores", B, pts, cores=2.0)
    np.testing.assert_allclose(np.array(prof.truth()), np.array(TRUE), rtol=0.02)
    assert prof.predict(2, 1, 1.0, 1.0) == pytest.approx(float(throughput(TRUE, 2, 1, 1.0, 1.0, B)[0]) / 1.5, rel=0.02)
    path = save_profile(prof, tmp_path / "two-cores.csv")
    back = load_profile(path)
    assert back.cores == 2.0 and back.without(0).cores == 2.0
    r = calibrate_profile(back, str(path), budget_cpu=6.0)
    assert r["in_sample"]["max_error"] < 1e-3 and r["within_goal"]
    # Without node_cores the same points need a different (contended) truth.
    assert Profile("x", B, pts).truth() != pytest.approx(prof.truth(), rel=0.02)
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit(",", 1)[0] + ",4"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"two-cores.csv:3: node_cores: 4 differs"):
        load_profile(path)


def test_cluster_overcommit_slows_a_job_by_cpus_over_cores():
    from dlrover.sim.cluster import Cluster

    c = Cluster(ClusterSpec(nodes=1, node_cpu=16, perf_sigma=0.0, node_cores=2.0), np.random.default_rng(0))
    wn, pn = np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.int64)
    assert c.job_speed(wn, pn, 1.0, 1.0) == pytest.approx(0.5)  # 4 CPUs on 2 cores
    assert c.job_speed(wn[:1], pn, 1.0, 1.0) == pytest.approx(1.0)
    free = Cluster(ClusterSpec(nodes=1, node_cpu=16, perf_sigma=0.0), np.random.default_rng(0))
    assert free.job_speed(wn, pn, 1.0, 1.0) == pytest.approx(1.0)
