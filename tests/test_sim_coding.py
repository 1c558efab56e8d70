"""Gradient coding in the simulator (dlrover/sim/coding.py, coding_sim.py): assignments,
decoding, the dense PS's wait rules, the straggler chain, the sweep and its CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from dlrover.errors import DLRoverError
from dlrover.sim.coding import Assignment, Scheme, assignment, decode, stop_times
from dlrover.sim.coding_sim import SchemeResult, StragglerModel, run_scheme, slow_states, sweep

JSON_FIELDS = ["scheme", "rate", "load", "step_time_mean", "step_time_p95", "error_mean", "grad_error_mean", "exact_fraction"]


def subsets(n: int):
    for bits in itertools.product([False, True], repeat=n):
        yield np.array(bits)


def test_cyclic_worker_holds_d_consecutive_partitions_and_each_partition_is_held_d_times() -> None:
    a = assignment("cyclic", 7, 1, d=3)
    assert a.B[5].nonzero()[0].tolist() == [0, 5, 6]
    assert (a.load == 3).all() and (a.B.sum(axis=0) == 3).all()


@pytest.mark.parametrize("n,s", [(6, 1), (7, 2), (8, 3), (5, 0)])
def test_frc_decodes_exactly_iff_one_worker_of_every_group_arrived(n: int, s: int) -> None:
    a = assignment(Scheme.FRC, n, s)
    assert all(len(g) >= s + 1 for g in a.groups) and np.concatenate(a.groups).tolist() == list(range(n))
    for arrived in subsets(n):
        every_group = all(arrived[g].any() for g in a.groups)
        assert decode(a, arrived).exact == every_group, arrived


@pytest.mark.parametrize("n,s", [(4, 0), (6, 1), (9, 2), (12, 3), (5, 4)])
def test_least_squares_decoding_is_exact_when_every_worker_arrived_and_every_partition_is_covered(n: int, s: int) -> None:
    everyone = np.ones(n, dtype=bool)
    for a in [assignment(x, n, s) for x in Scheme] + [assignment("cyclic", n, s, d) for d in range(1, n + 1)]:
        got = decode(a, everyone)
        assert got.error < 1e-20 and np.allclose(got.coefficients, 1.0), (a.scheme, a.load)
    uncovered = np.eye(n)
    uncovered[0, 0] = 0.0  # partition 0 is held by nobody: no weights can give it weight 1
    assert decode(Assignment(Scheme.CYCLIC, uncovered, s), everyone).error == pytest.approx(1 / n)


@pytest.mark.parametrize("scheme,d", [("ignore", None), ("cyclic", 2), ("cyclic", 3), ("frc", None), ("sync", None)])
def test_decoding_error_never_falls_as_more_workers_straggle(scheme: str, d: int | None) -> None:
    n, rng = 9, np.random.default_rng(3)
    a = assignment(scheme, n, 2, d)
    for _ in range(20):
        arrived, errors = np.ones(n, dtype=bool), []
        for w in rng.permutation(n)[:-1]:
            arrived[w] = False
            errors.append(decode(a, arrived).error)
        assert np.all(np.diff(errors) >= -1e-12), errors
        assert errors[-1] > 0


def test_ignore_rescales_the_partial_sum_by_workers_over_arrivals() -> None:
    a, g = assignment("ignore", 5, 2), np.arange(10.0).reshape(5, 2)
    got = decode(a, np.array([1, 1, 0, 1, 0], dtype=bool))
    assert np.allclose(got.gradient(g), 5 / 3 * (g[0] + g[1] + g[3]))
    assert got.error == pytest.approx((3 * (5 / 3 - 1) ** 2 + 2) / 5)


def test_cyclic_decoded_gradient_is_weights_times_the_coded_messages() -> None:
    a, g = assignment("cyclic", 7, 2, d=2), np.random.default_rng(0).standard_normal((7, 3))
    arrived = np.array([1, 0, 1, 1, 0, 1, 1], dtype=bool)
    got = decode(a, arrived)
    assert np.allclose(got.gradient(g), got.weights[arrived] @ (a.B[arrived] @ g))
    assert not got.exact and np.all(got.weights[~arrived] == 0)


def test_sync_step_time_is_the_slowest_workers_and_it_is_always_exact() -> None:
    rng = np.random.default_rng(1)
    speeds = rng.uniform(0.2, 1.0, (50, 6))
    finish = 1.0 / speeds
    assert np.array_equal(stop_times(assignment("sync", 6, 2), finish), finish.max(axis=1))
    r = run_scheme(Scheme.SYNC, 2, speeds, rng.standard_normal((50, 6, 4)), rate=0.0)
    assert r.step_time_mean == pytest.approx(finish.max(axis=1).mean()) and r.exact_fraction == 1.0


def test_wait_rules_first_of_every_frc_group_and_first_n_minus_s_with_ties() -> None:
    finish = np.array([[1.0, 5.0, 2.0, 2.0, 9.0, 3.0]])
    assert stop_times(assignment("frc", 6, 1), finish)[0] == 3.0  # groups {0,1} {2,3} {4,5}
    assert stop_times(assignment("ignore", 6, 2), finish)[0] == 3.0  # 4th arrival
    tied = np.array([[1.0, 1.0, 2.5, 2.5, 2.5, 1.0]])  # three slow workers, two tolerated: wait for them
    stop = stop_times(assignment("cyclic", 6, 2), tied)
    assert stop[0] == 2.5 and (tied <= stop[:, None]).all()


def test_with_no_stragglers_every_scheme_gives_the_true_sum_at_its_own_load() -> None:
    g = np.random.default_rng(2).standard_normal((8, 5))
    for scheme in Scheme:
        assert np.allclose(decode(assignment(scheme, 8, 3), np.ones(8, dtype=bool)).gradient(g), g.sum(axis=0)), scheme
    for r in sweep(8, 3, [0.0], 30, np.random.default_rng(0)):
        assert r.exact_fraction == 1.0 and r.grad_error_mean < 1e-12 and r.error_mean < 1e-20, r
        assert r.step_time_mean == r.step_time_p95 == (1.0 if r.scheme in ("ignore", "sync") else 4.0), r


def test_slow_nodes_follow_the_two_class_chain_with_persistence() -> None:
    m = StragglerModel(p_slow=0.05)
    assert (StragglerModel().p_slow, StragglerModel().p_stay, StragglerModel().slow_factor) == (0.01, 0.8, 0.4)
    slow = slow_states(m, 200, 400, np.random.default_rng(4))
    assert slow.mean() == pytest.approx(m.slow_fraction, abs=0.01) and m.slow_fraction == pytest.approx(0.2)
    stay = (slow[1:] & slow[:-1]).sum() / slow[:-1].sum()
    turn = (slow[1:] & ~slow[:-1]).sum() / (~slow[:-1]).sum()
    assert stay == pytest.approx(0.8, abs=0.02) and turn == pytest.approx(0.05, abs=0.005)


def test_more_stragglers_slow_sync_down_and_frc_never_decodes_inexactly() -> None:
    results = sweep(12, 2, [0.01, 0.2], 400, np.random.default_rng(5))
    by = {(r.scheme, r.rate): r for r in results}
    assert [(r.scheme, r.rate) for r in results] == [(s.value, x) for x in (0.01, 0.2) for s in Scheme]
    assert by["sync", 0.2].step_time_mean > by["sync", 0.01].step_time_mean
    assert by["frc", 0.01].exact_fraction == by["frc", 0.2].exact_fraction == 1.0
    assert by["ignore", 0.01].exact_fraction < 1.0 and by["ignore", 0.01].step_time_mean < by["sync", 0.01].step_time_mean


def test_frc_beats_sync_only_when_a_slow_node_is_slower_than_one_over_its_load() -> None:
    def times(slow_factor: float) -> dict[str, float]:
        rs = sweep(12, 2, [0.05], 500, np.random.default_rng(6), StragglerModel(slow_factor=slow_factor))
        return {r.scheme: r.step_time_mean for r in rs}

    mild, severe = times(0.4), times(0.1)  # FRC's load is 3: it pays when slow nodes run under 1/3 speed
    assert mild["sync"] < mild["frc"] and severe["frc"] < severe["sync"] and severe["frc"] < severe["ignore"]


def test_sweep_is_reproducible_for_a_fixed_seed() -> None:
    def run(seed: int) -> list[SchemeResult]:
        return sweep(10, 2, [0.05, 0.1], 200, np.random.default_rng(seed), d=2)

    assert run(7) == run(7) and run(7) != run(8)


def test_bad_sizes_are_user_errors() -> None:
    for call in (lambda: assignment("frc", 4, 4), lambda: assignment("cyclic", 4, 1, d=5), lambda: sweep(4, 1, [1.5], 10, np.random.default_rng())):
        with pytest.raises(DLRoverError):
            call()


def exit_code(main, argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's one-line errors exit
        return int(e.code)


def test_cli_json_lists_every_scheme_at_every_rate_with_the_documented_fields(capsys) -> None:
    from dlrover.cli.main import main

    assert main(["simulate-coding", "--workers", "6", "--stragglers", "1", "--rates", "0.05,0.2", "--steps", "50", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["scheme"], r["rate"]) for r in rows] == [(s.value, x) for x in (0.05, 0.2) for s in Scheme]
    assert all(list(r) == JSON_FIELDS for r in rows) and all(0.0 <= r["exact_fraction"] <= 1.0 for r in rows)
    assert main(["simulate-coding", "--steps", "20", "--rates", "0.1"]) == 0
    table = capsys.readouterr().out
    assert "cyclic d=3, slow factor 0.4" in table and all(s.value in table for s in Scheme)


@pytest.mark.parametrize(
    "bad,says",
    [
        (["--workers", "4", "--stragglers", "5"], "--stragglers 5"),
        (["--stragglers", "-1"], "--stragglers"),
        (["--rates", "0.1,x"], "--rates"),
        (["--rates", "1.5"], "--rates"),
        (["--d", "13"], "--d 13"),
        (["--steps", "0"], "--steps"),
        (["--slow-factor", "1.5"], "--slow-factor 1.5"),
    ],
)
def test_cli_bad_argument_exits_non_zero_with_one_clear_line(capsys, bad: list[str], says: str) -> None:
    from dlrover.cli.main import main

    assert exit_code(main, ["simulate-coding", "--steps", "5", *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1 and says in err, err
