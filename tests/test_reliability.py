"""Reliability metrics (Kokolis et al., arXiv 2410.21680): pure functions, no Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dlrover.faults.records import Failure, FailureKind
from dlrover.metrics.reliability import (
    ReliabilityReport,
    expected_ettr,
    failure_rate_per_s,
    observed_mttf_s,
    reliability_report,
    young_daly_interval_s,
)


def test_young_daly_hand_computation_and_clipping() -> None:
    # sqrt(2 * 2 / (1/3600)) = sqrt(14400) = 120
    assert young_daly_interval_s(2.0, 1 / 3600, 1.0, 1e6) == pytest.approx(120.0)
    assert young_daly_interval_s(2.0, 1 / 3600, 300.0, 1e6) == 300.0  # clipped up
    assert young_daly_interval_s(2.0, 1 / 3600, 1.0, 60.0) == 60.0  # clipped down
    assert young_daly_interval_s(2.0, 0.0, 10.0, 900.0) == 900.0  # no failures -> hi
    assert young_daly_interval_s(0.0, 1 / 3600, 10.0, 900.0) == 10.0  # free writes -> lo
    with pytest.raises(ValueError):
        young_daly_interval_s(2.0, 1 / 3600, 100.0, 10.0)


def test_failure_rate_prior_blending() -> None:
    # no data yet: the prior alone
    assert failure_rate_per_s(0, 0.0, 7200.0, 3600.0) == pytest.approx(1 / 7200)
    # prior worth 3600 s at 1/7200 (= 0.5 pseudo-failures) + 3 failures in 3600 s
    assert failure_rate_per_s(3, 3600.0, 7200.0, 3600.0) == pytest.approx(3.5 / 7200)
    # long observation dominates the prior
    assert failure_rate_per_s(100, 1e6, 7200.0, 3600.0) == pytest.approx(1e-4, rel=0.01)
    # no prior weight -> plain MLE
    assert failure_rate_per_s(4, 400.0, 7200.0, 0.0) == pytest.approx(0.01)
    with pytest.raises(ValueError):
        failure_rate_per_s(0, 0.0, 7200.0, 0.0)


def test_observed_mttf() -> None:
    assert observed_mttf_s([], 1000.0) is None
    assert observed_mttf_s([10.0, 500.0, 900.0, 950.0], 1000.0) == pytest.approx(250.0)


def test_expected_ettr_hand_computation() -> None:
    # N=8, r_f=1/(8*3600) -> job rate 1/3600; u0=300, dt=120, w=2
    # (1 - (300 + 60)/3600) / (1 + 2/120) = 0.9 / (61/60) = 54/61
    value = expected_ettr(8, 1 / (8 * 3600), 300.0, 120.0, 2.0)
    assert value == pytest.approx(54 / 61)
    assert expected_ettr(8, 0.0, 300.0, 120.0, 0.0) == 1.0
    assert expected_ettr(1000, 1 / 3600, 300.0, 120.0, 2.0) == 0.0  # clipped, not negative
    rng = np.random.default_rng(1)
    for _ in range(200):
        v = expected_ettr(
            int(rng.integers(1, 512)), 10 ** rng.uniform(-8, -3), rng.uniform(0, 3600), rng.uniform(1, 1e4), rng.uniform(0, 600)
        )
        assert 0.0 <= v <= 1.0


def test_expected_ettr_matches_simulated_timeline() -> None:
    """Simulate Poisson failures over a checkpoint/restart timeline and check the paper's
    first-order formula against the simulated productive fraction."""
    rng = np.random.default_rng(0)
    job_rate, u0, dt, w = 1 / 3600, 300.0, 120.0, 2.0
    t = committed = 0.0
    draws = iter(rng.exponential(1 / job_rate, size=200_000))
    while t < 2e7:
        x = next(draws)  # memoryless: a fresh draw per attempted segment is exact
        if x >= dt + w:
            t += dt + w
            committed += dt
        else:
            t += x + u0  # lose the uncommitted work, pay the restart
    simulated = committed / t
    assert simulated == pytest.approx(expected_ettr(1, job_rate, u0, dt, w), abs=0.015)


def test_young_daly_close_to_grid_optimum_of_expected_ettr() -> None:
    """Monte-Carlo over random cluster sizes, failure rates and write/restart costs: within
    the formula's regime (w_cp << dt*, N r_f u0 << 1), Young-Daly lands within 10% of the
    interval that maximises expected_ettr on a fine grid."""
    rng = np.random.default_rng(42)
    checked = 0
    for _ in range(300):
        n = int(rng.integers(1, 257))
        rate = 1 / 10 ** rng.uniform(5, 7)  # per-node MTTF 1 day .. ~4 months
        write = 10 ** rng.uniform(-0.5, 1.5)
        u0 = rng.uniform(0, 300)
        yd = young_daly_interval_s(write, n * rate, 1e-3, 1e9)
        if write / yd > 0.05 or n * rate * u0 > 0.05:
            continue
        grid = np.geomspace(yd / 4, yd * 4, 801)
        values = [expected_ettr(n, rate, u0, float(g), write) for g in grid]
        best = float(grid[int(np.argmax(values))])
        assert best == pytest.approx(yd, rel=0.10), (n, rate, write, u0)
        checked += 1
        if checked >= 60:
            break
    assert checked >= 30


def test_reliability_report_overlapping_failures() -> None:
    failures = [
        Failure(FailureKind.WORKER_DEATH, "j/worker-0", at_s=100.0, detected_s=105.0, recovered_s=160.0),
        Failure(FailureKind.NODE_LOSS, "j/worker-1", at_s=140.0, detected_s=150.0, recovered_s=200.0),  # overlaps
        Failure(FailureKind.WORKER_DEATH, "j/worker-2", at_s=500.0, detected_s=503.0, recovered_s=530.0),
    ]
    rep = reliability_report(failures, wall_s=1000.0, train_s=950.0, samples_replayed=20_000, throughput=1000.0)
    assert isinstance(rep, ReliabilityReport)
    # union of [100,160] and [140,200] is 100 s (not 60 + 60), plus [500,530]
    assert rep.downtime_s == pytest.approx(130.0)
    assert rep.replay_s == pytest.approx(20.0)
    assert rep.productive_s == pytest.approx(950.0 - 130.0 - 20.0)
    assert rep.ettr == pytest.approx(0.8)
    assert rep.mttf_s == pytest.approx(1000.0 / 3)
    assert rep.failures == 3
    wd = rep.by_kind["worker_death"]
    assert wd["count"] == 2
    assert wd["detect_s_mean"] == pytest.approx((5.0 + 3.0) / 2)
    assert wd["recover_s_mean"] == pytest.approx((55.0 + 27.0) / 2)
    assert rep.by_kind["node_loss"] == {"count": 1, "detect_s_mean": 10.0, "recover_s_mean": 50.0}
    d = rep.to_dict()
    assert d["ettr"] == pytest.approx(0.8) and d["by_kind"]["node_loss"]["count"] == 1


def test_reliability_report_unrecovered_and_edge_cases() -> None:
    failures = [Failure(FailureKind.NODE_LOSS, "j/worker-0", at_s=900.0, detected_s=910.0, recovered_s=None)]
    rep = reliability_report(failures, wall_s=1000.0, train_s=1000.0, samples_replayed=500, throughput=0.0)
    assert rep.downtime_s == pytest.approx(100.0)  # runs to the end of the wall clock
    assert rep.replay_s == 0.0  # no throughput -> no replay estimate
    assert rep.ettr == pytest.approx(0.9)
    assert rep.by_kind["node_loss"]["recover_s_mean"] is None
    empty = reliability_report([], wall_s=0.0, train_s=0.0, samples_replayed=0, throughput=100.0)
    assert empty.ettr == 0.0 and empty.mttf_s is None and empty.by_kind == {}
    # replay larger than training never yields negative productive time
    big = reliability_report([], wall_s=100.0, train_s=50.0, samples_replayed=10_000, throughput=1.0)
    assert big.productive_s == 0.0 and math.isclose(big.ettr, 0.0)
