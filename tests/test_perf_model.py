"""The resource-performance model: fit, pinning of unidentifiable terms, online behaviour."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from dlrover.resource.perf_model import (
    DEFAULT_PRIOR,
    PerfModel,
    PerfParams,
    features,
    fit_params,
    step_time,
    throughput,
)
from dlrover.resource.configs import Config

TRUE = PerfParams(t0=0.003, t1=2.5e-5, t2=0.006, t3=0.002, t4=0.003)
B = 2048


def cfg(w: int, p: int, cw: float, cp: float) -> Config:
    return Config(workers=w, ps=p, worker_cpu=cw, ps_cpu=cp)


def true_thr(params: PerfParams, c: Config) -> float:
    return float(throughput(params, c.workers, c.ps, c.worker_cpu, c.ps_cpu, B)[0])


def test_features_terms_and_broadcast():
    x = features(2, 1, 0.5, 2.0, 100)
    np.testing.assert_allclose(x, [[1.0, 200.0, 1.0, 2.0, 2.0, 0.0, 0.0]])  # no cores given: no host terms
    np.testing.assert_allclose(features(2, 1, 0.5, 2.0, 100, cores=2)[0, 5:], [100 * 1.0, 100 * 1.0])  # asks 3 CPUs of 2 cores
    np.testing.assert_allclose(features(2, 1, 2.0, 2.0, 100, cores=3)[0, 5:], [100 * 3.0, 100 * 9.0])  # 6 of 3: o and o**2
    xs = features([1, 2, 4], 2, [1.0, 2.0, 4.0], 0.5, B)
    assert xs.shape == (3, 7)
    np.testing.assert_allclose(xs[:, 2], [1.0, 2.0, 4.0])  # w / (p * cp)
    st = step_time(TRUE, [1, 2, 4], 2, 1.0, 0.5, B)
    np.testing.assert_allclose(throughput(TRUE, [1, 2, 4], 2, 1.0, 0.5, B), np.array([1, 2, 4]) * B / st)


def test_round_trip_recovers_coefficients_and_predicts_held_out():
    grid = [
        cfg(w, p, cw, cp) for w, p, cw, cp in itertools.product(range(1, 9), range(1, 5), [0.5, 1, 2, 4], [0.5, 1, 2])
    ]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(grid))
    train, test = [grid[i] for i in order[:300]], [grid[i] for i in order[300:]]
    model = PerfModel(B, prior=DEFAULT_PRIOR)
    for c in train:
        model.observe(c, true_thr(TRUE, c) * rng.lognormal(0.0, 0.02))

    assert model.n_points == len(train)
    assert model.identified == (True,) * 5 + (False, False)  # no cores given: the host terms stay pinned
    np.testing.assert_allclose(np.array(model.params)[:5], np.array(TRUE)[:5], rtol=0.10)

    measured = np.array([true_thr(TRUE, c) for c in test]) * rng.lognormal(0.0, 0.02, len(test))
    pred = model.predict_many(test)
    assert np.mean(np.abs(pred / measured - 1)) < 0.10
    truth = np.array([true_thr(TRUE, c) for c in test])
    assert np.mean(np.abs(pred / truth - 1)) < 0.02  # the noise averages out


def test_no_points_predicts_from_prior():
    model = PerfModel(B)
    c = cfg(4, 2, 1.0, 1.0)
    assert model.n_points == 0 and model.identified == (False,) * 7
    assert model.params == DEFAULT_PRIOR
    assert model.predict(c) == pytest.approx(true_thr(DEFAULT_PRIOR, c), rel=1e-12)


def test_one_point_matches_measurement_and_scales_prior():
    model = PerfModel(B)
    c = cfg(3, 2, 2.0, 1.0)
    model.observe(c, 1234.5)
    assert model.predict(c) == pytest.approx(1234.5, rel=1e-6)
    # Every other configuration moves by the same factor: the prior is scaled as a whole.
    others = [cfg(1, 1, 0.5, 0.5), cfg(8, 4, 4.0, 2.0), cfg(2, 3, 1.0, 2.0)]
    prior_pred = np.array([true_thr(DEFAULT_PRIOR, o) for o in others])
    scale = 1234.5 / true_thr(DEFAULT_PRIOR, c)
    np.testing.assert_allclose(model.predict_many(others), prior_pred * scale, rtol=1e-6)
    assert model.identified == (True, False, False, False, False, False, False)


def test_pinning_when_p_and_cp_never_vary():
    # p and cp fixed: w/(p*cp), w/p and w are collinear, so only t0, t1, t2 are identified.
    configs = [cfg(w, 2, cw, 1.0) for w in range(1, 7) for cw in (0.5, 1.0, 2.0)]

    # Data from the prior itself: the pinned terms keep exactly the prior's values.
    model = PerfModel(B)
    for c in configs:
        model.observe(c, true_thr(DEFAULT_PRIOR, c))
    assert model.identified == (True, True, True, False, False, False, False)
    assert model.params.t3 == pytest.approx(DEFAULT_PRIOR.t3, rel=1e-9)
    assert model.params.t4 == pytest.approx(DEFAULT_PRIOR.t4, rel=1e-9)

    # Data from other coefficients: pinned terms are the prior under one common scale, the
    # free ones absorb the rest, and the measured configurations are still reproduced.
    model = PerfModel(B)
    for c in configs:
        model.observe(c, true_thr(TRUE, c))
    assert model.identified == (True, True, True, False, False, False, False)
    s3, s4 = model.params.t3 / DEFAULT_PRIOR.t3, model.params.t4 / DEFAULT_PRIOR.t4
    assert s3 == pytest.approx(s4, rel=1e-9) and s3 != pytest.approx(1.0, rel=1e-3)
    assert model.params.t1 == pytest.approx(TRUE.t1, rel=1e-6)  # varied cw identifies t1
    measured = np.array([true_thr(TRUE, c) for c in configs])
    np.testing.assert_allclose(model.predict_many(configs), measured, rtol=1e-6)


def test_host_terms_stay_at_the_prior_while_the_job_terms_scale_to_the_data():
    # A compute-heavy job on a 2-core host, measured once within the cores: the window
    # says nothing about over-commit, and how much a CPU beyond the cores costs a sample
    # is the host's, so the job's terms scale to the window and the host terms stay.
    heavy = DEFAULT_PRIOR._replace(t1=3 * DEFAULT_PRIOR.t1)
    model = PerfModel(B, cores=2)
    start = cfg(1, 1, 1.0, 1.0)
    model.observe(start, float(throughput(heavy, 1, 1, 1.0, 1.0, B, cores=2)[0]))
    assert model.identified == (True, False, False, False, False, False, False)
    assert (model.params.t5, model.params.t6) == (DEFAULT_PRIOR.t5, DEFAULT_PRIOR.t6)
    scale = model.params.t3 / DEFAULT_PRIOR.t3
    assert scale > 1.5 and model.params.t1 == pytest.approx(scale * DEFAULT_PRIOR.t1, rel=1e-9)
    assert model.predict(start) == pytest.approx(float(throughput(heavy, 1, 1, 1.0, 1.0, B, cores=2)[0]), rel=1e-6)
    # Over the cores the prediction adds the prior's host cost, not a scaled-up one.
    over = cfg(2, 1, 1.0, 1.0)
    job_only = step_time(model.params._replace(t5=0.0, t6=0.0), 2, 1, 1.0, 1.0, B, cores=2)[0]
    host = (DEFAULT_PRIOR.t5 + DEFAULT_PRIOR.t6) * B  # o = 1
    assert model.predict(over) == pytest.approx(2 * B / (job_only + host), rel=1e-9)


def test_host_terms_scale_with_the_rest_when_they_alone_exceed_the_measured_step():
    model = PerfModel(B, cores=2)
    over = cfg(4, 2, 2.0, 1.0)  # 10 CPUs on 2 cores: the prior's host terms alone are 0.5 s a step
    prior_step = step_time(DEFAULT_PRIOR, 4, 2, 2.0, 1.0, B, cores=2)[0]
    model.observe(over, 4 * B / (0.01 * prior_step))  # measured 100x faster than that
    assert model.predict(over) == pytest.approx(4 * B / (0.01 * prior_step), rel=1e-6)
    assert model.params.t6 == pytest.approx(model.params.t3 / DEFAULT_PRIOR.t3 * DEFAULT_PRIOR.t6, rel=1e-9)


def test_near_collinear_feature_is_not_identified():
    model = PerfModel(B)
    model.observe(cfg(2, 1, 1.0, 1.0), 5000.0)
    model.observe(cfg(2, 1, 1.001, 1.0), 5100.0)  # 0.1% change of cw: noise, not signal
    assert model.identified == (True, False, False, False, False, False, False)
    assert model.params.t1 / DEFAULT_PRIOR.t1 == pytest.approx(model.params.t2 / DEFAULT_PRIOR.t2, rel=1e-9)


def test_pinned_terms_follow_the_data_scale():
    # A job uniformly twice as slow as the prior: two points that vary only w still give
    # exact predictions in directions they never explored (cw, p, cp).
    slow = PerfParams(*(2 * x for x in DEFAULT_PRIOR))
    model = PerfModel(B)
    for c in (cfg(2, 2, 1.0, 1.0), cfg(4, 2, 1.0, 1.0)):
        model.observe(c, true_thr(slow, c))
    assert model.identified == (True, False, True, False, False, False, False)
    unseen = [cfg(1, 1, 4.0, 0.5), cfg(8, 4, 0.5, 2.0), cfg(3, 1, 2.0, 1.0)]
    truth = np.array([true_thr(slow, c) for c in unseen])
    np.testing.assert_allclose(model.predict_many(unseen), truth, rtol=1e-6)


def test_online_predictions_track_measurements():
    rng = np.random.default_rng(7)
    seq = [cfg(2, 1, 1.0, 1.0), cfg(4, 1, 1.0, 1.0), cfg(4, 2, 1.0, 1.0), cfg(4, 2, 0.5, 1.0)]
    seq += [cfg(4, 2, 0.5, 2.0), cfg(6, 2, 1.0, 0.5), cfg(8, 3, 2.0, 1.0), cfg(3, 4, 1.0, 2.0)]
    model = PerfModel(B)
    for c in seq:
        m = true_thr(TRUE, c) * rng.lognormal(0.0, 0.02)
        model.observe(c, m)
        assert model.predict(c) == pytest.approx(m, rel=0.05)
    assert all(model.identified[:5]) and not model.identified[5]  # no cores given: no host term


def test_repeated_observations_average_and_weights_count():
    c = cfg(4, 2, 1.0, 1.0)
    model = PerfModel(B)
    model.observe(c, 100.0)
    model.observe(c, 120.0)
    assert 100.0 < model.predict(c) < 120.0
    even = model.predict(c)
    model = PerfModel(B)
    model.observe(c, 100.0)
    model.observe(c, 120.0, weight=9.0)
    assert even < model.predict(c) < 120.0
    assert model.identified == (True, False, False, False, False, False, False)
    assert list(model.points()["weight"]) == [1.0, 9.0]


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf"), "fast"])
def test_bad_throughput_raises_and_adds_nothing(bad):
    model = PerfModel(B)
    with pytest.raises(ValueError, match=f"throughput.*{bad}"):
        model.observe(cfg(2, 1, 1.0, 1.0), bad)
    assert model.n_points == 0


def test_other_bad_inputs_raise():
    model = PerfModel(B)
    with pytest.raises(ValueError, match="weight"):
        model.observe(cfg(2, 1, 1.0, 1.0), 100.0, weight=0.0)
    with pytest.raises(ValueError, match="workers"):
        model.observe(cfg(0, 1, 1.0, 1.0), 100.0)
    with pytest.raises(ValueError, match="ps_cpu"):
        features(1, 1, 1.0, 0.0, B)
    with pytest.raises(ValueError, match="batch_size"):
        PerfModel(0)
    with pytest.raises(ValueError, match="step times"):
        fit_params(features([1, 2], 1, 1.0, 1.0, B), np.array([0.1, -0.1]), DEFAULT_PRIOR)
    assert model.n_points == 0


def test_fit_params_without_data_returns_prior():
    params, ident = fit_params(np.zeros((0, len(TRUE))), np.zeros(0), TRUE)
    assert params == TRUE and ident == (False,) * 7


def test_dict_round_trip_is_json_safe_and_identical():
    rng = np.random.default_rng(1)
    model = PerfModel(512, prior=TRUE)
    for c in (cfg(2, 1, 1.0, 1.0), cfg(4, 2, 0.5, 1.0), cfg(6, 2, 2.0, 0.5), cfg(4, 2, 0.5, 1.0)):
        model.observe(c, float(rng.uniform(500, 5000)), weight=float(rng.uniform(0.5, 2)))
    clone = PerfModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert clone.cores == math.inf
    probe = [cfg(w, p, cw, cp) for w, p, cw, cp in itertools.product((1, 3, 8), (1, 4), (0.5, 2.0), (1.0, 2.0))]
    assert np.array_equal(clone.predict_many(probe), model.predict_many(probe))
    assert clone.params == model.params and clone.identified == model.identified
    assert clone.prior == TRUE and clone.batch_size == 512
    assert clone.points().equals(model.points())
    assert list(model.points().columns) == [
        "workers",
        "ps",
        "worker_cpu",
        "ps_cpu",
        "batch_size",
        "throughput",
        "weight",
    ]


HOST = TRUE._replace(t5=1.5e-5, t6=4e-6)


def test_the_host_term_slows_only_configurations_asking_more_cpus_than_cores():
    within, beyond = (2, 1, 1.0, 2.0), (2, 1, 2.0, 2.0)  # 4 and 6 CPUs
    for w, p, cw, cp in (within, beyond):
        plain, host = (float(throughput(t, w, p, cw, cp, B, cores=4)[0]) for t in (TRUE, HOST))
        assert host == plain if w * cw + p * cp <= 4 else host < plain
    # Step time grows by t5 * B per CPU asked beyond the cores, and by t6 * B per pair of them.
    extra = step_time(HOST, 2, 1, 2.0, 2.0, B, cores=4) - step_time(TRUE, 2, 1, 2.0, 2.0, B, cores=4)
    np.testing.assert_allclose(extra, HOST.t5 * B * 2 + HOST.t6 * B * 2**2)
    assert float(throughput(HOST, 2, 1, 2.0, 2.0, B)[0]) == float(throughput(TRUE, 2, 1, 2.0, 2.0, B)[0])  # cores unknown


def test_round_trip_with_an_over_committed_host_identifies_all_seven_terms():
    grid = [cfg(w, p, cw, cp) for w, p, cw, cp in itertools.product(range(1, 7), range(1, 4), [0.5, 1, 2], [0.5, 1, 2])]
    rng = np.random.default_rng(3)
    model = PerfModel(B, cores=6)
    for c in grid:
        model.observe(c, float(throughput(HOST, c.workers, c.ps, c.worker_cpu, c.ps_cpu, B, cores=6)[0]) * rng.lognormal(0.0, 0.02))
    assert model.identified == (True,) * 7
    np.testing.assert_allclose(np.array(model.params), np.array(HOST), rtol=0.15)
    clone = PerfModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert clone.cores == 6 and clone.params == model.params


@pytest.mark.parametrize("bad", [0, -2.0, float("nan"), "two"])
def test_bad_cores_raise(bad):
    with pytest.raises(ValueError, match="cores"):
        PerfModel(B, cores=bad)


def test_the_noise_floor_is_the_spread_of_a_windows_binned_samples_per_s():
    """The perf-model bench reports each configuration's own spread next to the model's
    error: steady reports give none, reports alternating 2x give a large one."""
    from dlrover.bench.perf_model import NOISE_BIN_S, noise_floor
    from dlrover.runlogs.records import Event

    def reports(ends: list[float], rate: float) -> list[Event]:  # one worker at a constant rate
        return [Event(b, "metrics", {"samples": rate * (b - a), "samples_per_s": rate}) for a, b in zip(ends, ends[1:])]

    steady = reports([10.0 + 0.5 * i for i in range(25)], 2000.0)
    assert noise_floor(steady, 10.0, 22.0) == pytest.approx(0.0, abs=1e-9)
    # Reports every 0.52-0.6 s at a constant rate: bins hold 3 or 4 of them, and still no spread.
    jittered = reports(list(np.cumsum([10.0] + [0.52, 0.6, 0.55, 0.58] * 6)), 2000.0)
    assert noise_floor(jittered, 10.0, 22.0) == pytest.approx(0.0, abs=1e-9)
    alternating = [Event(10.0 + NOISE_BIN_S * (i + 1), "metrics", {"samples": 1000.0 * (1 + i % 2), "samples_per_s": 500.0 * (1 + i % 2)})
                   for i in range(6)]  # fmt: skip
    assert noise_floor(alternating, 10.0, 22.0) == pytest.approx(1 / 3)  # 500 and 1000/s: std 250 over mean 750
    assert noise_floor(steady, 10.0, 14.0) is None  # fewer than 3 bins: no spread to speak of
    assert noise_floor([Event(11.0, "ps_metrics")] + steady, 10.0, 22.0) == pytest.approx(0.0, abs=1e-9)


def test_the_bench_scores_a_configuration_measured_twice_as_one_prediction_left_out_whole():
    """Repeated windows of a configuration are predicted once and each scores it;
    leave-one-out leaves all of them out, and their spread is the noise floor."""
    from dlrover.bench.perf_model import fit_and_score

    configs = [cfg(1, 1, 1, 1), cfg(2, 1, 1, 1), cfg(2, 2, 1, 1), cfg(4, 2, 1, 1), cfg(2, 2, 2, 1), cfg(4, 4, 2, 2), cfg(8, 4, 1, 1)]
    odd = configs[3]  # measured twice at 3x what the model form says
    points = [(c, true_thr(TRUE, c) * (3.0 if c == odd else 1.0) * f, 12.0) for f in (1.05, 0.95) for c in configs]
    r = fit_and_score(points, B)
    assert r["configs"] == [c.short() for c in configs] and [len(w) for w in r["windows"]] == [2] * len(configs)
    i = configs.index(odd)
    assert r["measured"][i] == pytest.approx(3.0 * true_thr(TRUE, odd))  # the mean of its two windows
    # Left out whole, it is predicted from the others (the model form), not from its twin window.
    assert r["loo_predicted"][i] == pytest.approx(true_thr(TRUE, odd), rel=0.1)
    assert len(r["split_predicted"]) == len(configs) - len(configs) // 2
    assert r["spread"] == pytest.approx([np.std([1.05, 0.95], ddof=1)] * len(configs))
    assert r["noise_floor"] == pytest.approx(np.std([1.05, 0.95], ddof=1))
    # Each window scores the prediction: a perfect mean is still 5% off each window.
    exact = fit_and_score([(c, true_thr(TRUE, c) * f, 12.0) for f in (1.05, 0.95) for c in configs], B)
    assert exact["loo_mape"] == pytest.approx(np.mean([0.05 / 1.05, 0.05 / 0.95]), rel=0.2)
    single = fit_and_score(points[: len(configs)], B)
    assert single["spread"] == [None] * len(configs) and single["noise_floor"] is None  # one window each


def rows(*configs: Config) -> np.ndarray:
    return np.array([(c.workers, c.ps, c.worker_cpu, c.ps_cpu) for c in configs], dtype=np.float64)


def test_uncertainty_is_the_noise_floor_where_measured_and_the_priors_spread_where_nothing_was():
    from dlrover.resource.perf_model import NOISE_FLOOR

    model = PerfModel(B, prior=DEFAULT_PRIOR)
    here, far = cfg(1, 1, 1, 1), cfg(8, 4, 4, 2)
    before = model.relative_sd(rows(here, far))
    assert np.all(before > 0.15)  # the prior alone: unsure everywhere
    model.observe(here, true_thr(TRUE, here))
    sd_here, sd_far = model.relative_sd(rows(here, far))
    assert sd_here <= 1.05 * NOISE_FLOOR  # one window pins what it measured ...
    assert sd_far > 3 * sd_here  # ... and says little about a configuration far from it


def test_uncertainty_shrinks_as_windows_measure_more_directions():
    rng = np.random.default_rng(1)
    grid = [cfg(w, p, cw, cp) for w, p, cw, cp in itertools.product([1, 2, 4, 8], [1, 2, 4], [1, 2], [1, 2])]
    probe = rows(cfg(6, 3, 2, 1), cfg(3, 1, 1, 2))
    model = PerfModel(B, prior=DEFAULT_PRIOR)
    spreads = [model.relative_sd(probe).max()]
    for n, c in enumerate(rng.permutation(len(grid))):
        model.observe(grid[c], true_thr(TRUE, grid[c]) * rng.lognormal(0.0, 0.03))
        if n + 1 in (1, 4, 12, len(grid)):
            spreads.append(model.relative_sd(probe).max())
    assert all(b < a for a, b in zip(spreads, spreads[1:])), spreads
    assert spreads[-1] < 0.05  # measured all around: about the windows' own noise
    # Noisier windows leave the model less sure of the same configurations.
    noisy = PerfModel(B, prior=DEFAULT_PRIOR)
    for c in grid:
        noisy.observe(c, true_thr(TRUE, c) * rng.lognormal(0.0, 0.3))
    assert noisy.relative_sd(probe).max() > 2 * spreads[-1]
    # The uncertainty is recomputed from the points: a saved model is as sure as the live one.
    np.testing.assert_allclose(PerfModel.from_dict(json.loads(json.dumps(model.to_dict()))).relative_sd(probe), model.relative_sd(probe))


def test_uncertainty_does_not_depend_on_the_unit_of_the_weights_and_stays_finite():
    grid = [cfg(w, p, cw, 1) for w, p, cw in itertools.product([1, 2, 4], [1, 2], [1, 2])]
    probe = rows(cfg(1, 1, 1, 1), cfg(16, 8, 4, 4))
    spreads = []
    for weight in (1.0, 600.0):  # windows weigh their length in seconds online
        model = PerfModel(B, prior=DEFAULT_PRIOR._replace(t5=0.0), cores=2)  # a prior term of 0, as cluster priors have
        for i, c in enumerate(grid):
            model.observe(c, true_thr(TRUE, c) * (1 + 0.02 * (-1) ** i), weight=weight)
        spreads.append(model.relative_sd(probe))
    np.testing.assert_allclose(spreads[0], spreads[1], rtol=1e-9)
    assert np.all(np.isfinite(spreads[0])) and np.all((spreads[0] > 0) & (spreads[0] <= 1.0))
