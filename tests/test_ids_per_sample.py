"""A job's ids per sample (``k``) in the performance model, the simulator's profiles and
traces, and where a real job's ``k`` comes from. PS terms are per Criteo-equivalent
sample: at 26 ids nothing changes, at 214 the PS part of a step is 214/26 as long. No Ray."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from dlrover.data.criteo import FileIndex
from dlrover.data.plan import DataPlan
from dlrover.errors import DataError
from dlrover.resource.configs import Config
from dlrover.resource.perf_model import REFERENCE_IDS, PerfModel, PerfParams, at_ids, features, step_time, throughput, throughput_rows
from dlrover.resource.policies import policy_factory
from dlrover.sim import ClusterSpec, SimSettings, simulate
from dlrover.sim.engine import Simulator
from dlrover.sim.profile import Profile, load_profile, profile_from_runs, save_profile
from dlrover.sim.profile_truth import make_truth
from dlrover.sim.trace import validate_trace
from dlrover.spec import spec_from_dict

TRUE = PerfParams(t0=0.003, t1=2.5e-5, t2=0.006, t3=0.002, t4=0.003, t5=1.5e-5, t6=4e-6)
B = 2048
DCN = 214.0  # MLPerf DLRM-DCNv2's ids a sample
GRID = list(itertools.product([1, 2, 4, 6], [1, 2, 3], [0.5, 1.0, 2.0], [0.5, 1.0, 2.0]))
W, P, CW, CP = (np.array(c, dtype=np.float64) for c in zip(*GRID))


def k_free_step_time(t: PerfParams, w, p, cw, cp, b, cores):
    """``T_iter`` as it was before ``k``: the reference a 26-id job must match exactly."""
    o = np.maximum(0.0, w * cw + p * cp - cores)
    return t.t0 + t.t1 * b / cw + t.t2 * w / (p * cp) + t.t3 * w / p + t.t4 * w + (t.t5 + t.t6 * o) * b * o


def ps_part(t: PerfParams, w, p, cp):
    return t.t2 * w / (p * cp) + t.t3 * w / p


# ------------------------------------------------------------------ the model


def test_at_26_ids_a_sample_every_step_time_and_throughput_is_the_k_free_models_exactly():
    want = k_free_step_time(TRUE, W, P, CW, CP, B, 6.0)
    assert REFERENCE_IDS == 26.0
    assert np.array_equal(step_time(TRUE, W, P, CW, CP, B, cores=6.0, ids_per_sample=26), want)
    assert np.array_equal(step_time(TRUE, W, P, CW, CP, B, cores=6.0), want)  # the default is Criteo's
    assert np.array_equal(throughput(TRUE, W, P, CW, CP, B, cores=6.0, ids_per_sample=26), W * B / want)
    rows = np.stack([W, P, CW, CP], axis=1)
    assert np.array_equal(throughput_rows(TRUE, rows, B, 6.0, ids_per_sample=26), W * B / want)
    assert np.array_equal(features(W, P, CW, CP, B, 6.0, ids_per_sample=26) @ np.array(TRUE), features(W, P, CW, CP, B, 6.0) @ np.array(TRUE))


def test_doubling_the_ids_doubles_exactly_the_ps_part_of_a_step():
    at_26, at_52 = (step_time(TRUE, W, P, CW, CP, B, cores=6.0, ids_per_sample=k) for k in (26, 52))
    np.testing.assert_allclose(at_52 - at_26, ps_part(TRUE, W, P, CP), rtol=1e-12)
    no_ps = TRUE._replace(t2=0.0, t3=0.0)
    assert np.array_equal(step_time(no_ps, W, P, CW, CP, B, cores=6.0, ids_per_sample=52), step_time(no_ps, W, P, CW, CP, B, cores=6.0))
    at_dcn = step_time(TRUE, W, P, CW, CP, B, cores=6.0, ids_per_sample=DCN)
    np.testing.assert_allclose(at_dcn - at_26, (DCN / 26 - 1) * ps_part(TRUE, W, P, CP), rtol=1e-12)


def test_params_scaled_to_k_give_at_26_ids_the_step_times_of_k():
    np.testing.assert_allclose(
        step_time(at_ids(TRUE, DCN), W, P, CW, CP, B, cores=6.0), step_time(TRUE, W, P, CW, CP, B, cores=6.0, ids_per_sample=DCN), rtol=1e-12
    )
    assert at_ids(TRUE, 26) == TRUE
    assert at_ids(TRUE, 52, reference=104) == TRUE._replace(t2=TRUE.t2 / 2, t3=TRUE.t3 / 2)


def test_a_model_of_a_214_id_job_recovers_the_per_criteo_sample_coefficients():
    model, as_criteo = PerfModel(B, ids_per_sample=DCN), PerfModel(B)
    for w, p, cw, cp in GRID:
        thr = float(throughput(TRUE, w, p, cw, cp, B, ids_per_sample=DCN)[0])
        for m in (model, as_criteo):
            m.observe(Config(w, p, cw, cp), thr)
    assert model.identified == (True,) * 5 + (False, False)  # no cores given: the host terms stay pinned
    np.testing.assert_allclose(np.array(model.params)[:5], np.array(TRUE)[:5], rtol=1e-6)
    # Fitted as if it read Criteo's 26 ids, the same job's PS terms come out 214/26 as heavy.
    np.testing.assert_allclose(np.array(as_criteo.params)[2:4], np.array(TRUE)[2:4] * DCN / 26, rtol=1e-6)
    probe = [Config(8, 4, 2.0, 1.0), Config(3, 1, 0.5, 2.0)]
    truth = np.array([float(throughput(TRUE, c.workers, c.ps, c.worker_cpu, c.ps_cpu, B, ids_per_sample=DCN)[0]) for c in probe])
    np.testing.assert_allclose(model.predict_many(probe), truth, rtol=1e-6)


def test_the_prior_of_a_214_id_job_predicts_ps_work_214_over_26_as_long():
    c = Config(4, 2, 1.0, 1.0)
    criteo, dcn = PerfModel(B, prior=TRUE), PerfModel(B, prior=TRUE, ids_per_sample=DCN)
    step = lambda m: c.workers * B / m.predict(c)  # noqa: E731
    assert step(dcn) - step(criteo) == pytest.approx((DCN / 26 - 1) * ps_part(TRUE, 4, 2, 1.0), rel=1e-9)


def test_dict_round_trip_keeps_the_ids_and_an_old_record_means_criteo():
    model = PerfModel(512, prior=TRUE, ids_per_sample=DCN)
    for c, thr in ((Config(2, 1, 1.0, 1.0), 900.0), (Config(4, 2, 0.5, 1.0), 1500.0), (Config(6, 2, 2.0, 0.5), 2100.0)):
        model.observe(c, thr, weight=2.0)
    d = json.loads(json.dumps(model.to_dict()))
    clone = PerfModel.from_dict(d)
    assert clone.ids_per_sample == DCN and clone.params == model.params and "k=214" in repr(clone)
    probe = [Config(3, 2, 1.0, 1.0), Config(8, 1, 2.0, 2.0)]
    assert np.array_equal(clone.predict_many(probe), model.predict_many(probe))
    del d["ids_per_sample"]
    assert PerfModel.from_dict(d).ids_per_sample == REFERENCE_IDS


@pytest.mark.parametrize("bad", [0, -26.0, math.nan, math.inf, "many"])
def test_ids_per_sample_must_be_positive_and_finite(bad):
    for call in (
        lambda: PerfModel(B, ids_per_sample=bad),
        lambda: step_time(TRUE, 1, 1, 1.0, 1.0, B, ids_per_sample=bad),
        lambda: features(1, 1, 1.0, 1.0, B, ids_per_sample=bad),
        lambda: throughput_rows(TRUE, np.ones((1, 4)), B, ids_per_sample=bad),
    ):
        with pytest.raises(ValueError, match="ids_per_sample must be positive and finite"):
            call()


# ------------------------------------------------------------------ profiles


def dcn_profile(k: float = DCN) -> Profile:
    """Noise-free points of a ``k``-id job whose coefficients are ``TRUE``'s (no host terms)."""
    t = TRUE._replace(t5=0.0, t6=0.0)
    pts = pd.DataFrame({"workers": W.astype(int), "ps": P.astype(int), "worker_cpu": CW, "ps_cpu": CP,
                        "throughput": throughput(t, W, P, CW, CP, B, ids_per_sample=k), "duration_s": 12.0, "source": "r"})  # fmt: skip
    return Profile("dcn", B, pts, ids_per_sample=k)


def test_a_profile_csv_with_ids_per_sample_fits_per_criteo_sample_and_predicts_its_points(tmp_path):
    path = save_profile(dcn_profile(), tmp_path / "dcn.csv")
    assert "ids_per_sample" in path.read_text().splitlines()[0] and ",214," in path.read_text().splitlines()[1]
    back = load_profile(path)
    assert back.ids_per_sample == DCN and back.without(0).ids_per_sample == DCN
    np.testing.assert_allclose(np.array(back.truth())[:5], np.array(TRUE)[:5], rtol=0.02)
    first = back.points.iloc[0]
    assert back.predict(first.workers, first.ps, first.worker_cpu, first.ps_cpu) == pytest.approx(first.throughput, rel=0.02)
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    without = [",".join(x for i, x in enumerate(line.split(",")) if header[i] != "ids_per_sample") for line in lines]
    (tmp_path / "old.csv").write_text("\n".join(without) + "\n")
    assert load_profile(tmp_path / "old.csv").ids_per_sample == REFERENCE_IDS  # a file of before: Criteo's


@pytest.mark.parametrize(
    "second, words",
    [("many", "ids_per_sample: not a number: 'many'"), ("0", "ids_per_sample: must be a positive number, got '0'"),
     ("26", "ids_per_sample: 26 differs from the first point's 214 (one profile, one data layout)")],
)  # fmt: skip
def test_a_bad_ids_per_sample_in_a_profile_is_one_line_naming_file_line_and_column(tmp_path, second, words):
    head = "workers,ps,worker_cpu,ps_cpu,batch_size,throughput,ids_per_sample\n"
    path = tmp_path / "bad.csv"
    path.write_text(head + "1,1,1,1,2048,100,214\n" + f"2,1,1,1,2048,180,{second}\n")
    with pytest.raises(DataError) as e:
        load_profile(path)
    assert str(e.value) == f"{path}:3: {words}"


def test_a_profile_from_runs_takes_the_ids_from_the_summary(tmp_path):
    def run(name: str, summary_ids) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "spec.json").write_text(json.dumps({"data": {"batch_size": B}}))
        cfg = {"workers": 1, "ps": 1, "worker_cpu": 1.0, "ps_cpu": 1.0}
        doc = {"job_id": name, "configurations": [{"config": cfg, "measured_throughput": 1000.0, "duration_s": 12.0}]}
        (d / "summary.json").write_text(json.dumps(doc if summary_ids is None else {**doc, "ids_per_sample": summary_ids}))
        (d / "events.jsonl").write_text("")
        return str(d)

    assert profile_from_runs([run("a", DCN), run("b", DCN)], "p").ids_per_sample == DCN
    assert profile_from_runs([run("old", None)], "p").ids_per_sample == REFERENCE_IDS
    with pytest.raises(DataError, match="ids_per_sample 26 differs from .*'s 214 .one profile, one data layout"):
        profile_from_runs([str(tmp_path / "a"), str(tmp_path / "old")], "p")
    with pytest.raises(DataError, match="summary.json: ids_per_sample: expected a positive number, got -1"):
        profile_from_runs([run("bad", -1)], "p")


# ------------------------------------------------------------------ traces and the simulator

PS_BOUND = PerfParams(t0=0.001, t1=1e-6, t2=0.02, t3=0.01, t4=1e-4)


def row(**more) -> dict:
    base = {
        "job_id": "j", "submit_s": 0.0, "signature": "s", "batch_size": 512, "samples": 2_000_000, "epochs": 1,
        "req_workers": 4, "req_ps": 1, "req_worker_cpu": 2.0, "req_ps_cpu": 1.0, "req_worker_memory_mb": 2048, "req_ps_memory_mb": 2048,
        "worker_memory_need_mb": 512, "ps_memory_need_mb": 256, **dict(zip(("t0", "t1", "t2", "t3", "t4"), PS_BOUND)),
    }  # fmt: skip
    return {**base, **more}


@pytest.mark.parametrize("kind", ["model", "saturating", "profile"])
def test_a_214_id_trace_row_runs_its_ps_terms_214_over_26_as_long(tmp_path, kind):
    c = Config(4, 1, 2.0, 1.0)
    if kind == "profile":  # a Criteo profile borrowed by a DCN-like row
        path = str(save_profile(dcn_profile(26.0), tmp_path / "criteo.csv"))
        rows = [row(profile=path, t0=None, t1=None, t2=None, t3=None, t4=None, ids_per_sample=k) for k in (None, 26.0, DCN)]
    else:
        rows = [row(ids_per_sample=k) for k in (None, 26.0, DCN)]
    default, criteo, dcn = (make_truth(kind, validate_trace(pd.DataFrame([r])).to_dict("records")[0]).step_time(c, 512) for r in rows)
    assert default == criteo < dcn
    if kind == "model":
        assert dcn - criteo == pytest.approx((DCN / 26 - 1) * ps_part(PS_BOUND, 4, 1, 1.0), rel=1e-9)


def test_a_row_without_ids_per_sample_runs_at_its_profiles_own(tmp_path):
    path = str(save_profile(dcn_profile(), tmp_path / "dcn.csv"))
    rows = [row(profile=path, t0=None, t1=None, t2=None, t3=None, t4=None, ids_per_sample=k) for k in (None, DCN, 26.0)]
    own, dcn, criteo = (make_truth("profile", r).throughput(Config(2, 1, 1.0, 1.0), B) for r in rows)
    assert own == dcn and criteo > dcn
    assert own == pytest.approx(float(dcn_profile().points.query("workers == 2 and ps == 1 and worker_cpu == 1 and ps_cpu == 1").throughput.iloc[0]), rel=1e-6)


def test_in_simulation_a_ps_bound_214_id_job_takes_longer_and_its_policy_knows_k():
    trace = validate_trace(pd.DataFrame([row(job_id="criteo", ids_per_sample=26.0), row(job_id="dcn", ids_per_sample=DCN, submit_s=1.0)]))
    cluster = ClusterSpec(nodes=2, node_cpu=16.0, perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)
    settings = SimSettings(truth="model", measure_noise=0.0)
    jct = simulate(trace, "static", cluster=cluster, settings=settings).jobs.set_index("job_id")["jct_s"]
    assert jct["dcn"] > 3 * jct["criteo"]
    sim = Simulator(trace, policy_factory("static"), cluster, settings)
    assert [j.driver.model.ids_per_sample for j in sim.jobs] == [26.0, DCN]


@pytest.mark.parametrize("bad", ["many", 0, -3, math.inf])
def test_a_bad_ids_per_sample_in_a_trace_names_the_line_and_the_column(bad):
    with pytest.raises(DataError) as e:
        validate_trace(pd.DataFrame([row(), row(job_id="k", ids_per_sample=bad)]), source="t.csv")
    assert str(e.value).startswith("t.csv:3: ids_per_sample: ") and "\n" not in str(e.value)


# ------------------------------------------------------------------ a real job's k


def test_a_jobs_ids_per_sample_is_the_mean_ids_of_its_first_training_rows(tmp_path):
    (tmp_path / "clicks.csv").write_text(
        "click,price,site,genres\n1,3.5,abc,Comedy|Drama\n0,,xyz,\n1,2,abc,Drama|Horror|Romance\n0,1,q,Comedy\n"
    )
    features = {"label": "click", "dense": ["price"], "sparse": ["site", {"column": "genres", "separator": "|", "max_len": 4}]}
    spec = spec_from_dict({"features": features, "data": {"paths": [str(tmp_path / "clicks.csv")], "eval_fraction": 0.0}})
    plan = DataPlan.build(spec)
    assert plan.ids_per_sample(spec.layout()) == (3 + 1 + 4 + 2) / 4  # one site and a bag of 2, 0, 3, 1 genres
    assert plan.ids_per_sample(spec.layout(), rows=2) == (3 + 1) / 2


def test_criteos_own_layout_has_26_ids_a_sample_without_reading():
    spec = spec_from_dict({"data": {"paths": ["nowhere/*.tsv"]}})
    plan = DataPlan({"nowhere/day_0.tsv": FileIndex("nowhere/day_0.tsv", "tsv", 1000, None)}, {"nowhere/day_0.tsv": 900})
    assert plan.ids_per_sample(spec.layout()) == 26.0
