"""``dlrover bench coding``: the gradient-coding schemes on the real DLRM's gradients."""

import pytest

from dlrover.bench.coding import run_coding_bench
from dlrover.cli.main import main

SLOW = "worker:0 4x slow"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DLROVER_BENCH_DATA", str(tmp_path_factory.mktemp("data")))
    try:
        return run_coding_bench(rows=30_000, workers=4, stragglers=1, slow_factor=4.0, rate=0.2)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def bench(result):
    return {(r["scheme"], r["stragglers"]): r for r in result["runs"]}


def test_schemes_that_decode_alike_share_one_training(result):
    assert result["trainings"] < len(result["runs"])


def test_exact_schemes_apply_the_mean_of_every_partition_although_a_worker_is_always_late(bench):
    for scheme in ("frc", "cyclic"):
        run = bench[(scheme, SLOW)]
        assert run["exact_fraction"] == 1.0
        assert run["dropped"] == 0.0
        assert run["grad_error_mean"] < 1e-5


def test_ignoring_the_straggler_drops_its_partition_every_round(bench):
    run = bench[("ignore", SLOW)]
    assert run["dropped"] == 1.0
    assert run["exact_fraction"] == 0.0
    assert run["grad_error_mean"] > 1e-3


def test_every_exact_decoding_trains_the_model_sync_trains(bench):
    sync = bench[("sync", "fault-free")]
    exact = [r for r in bench.values() if r["exact_fraction"] == 1.0]
    assert {r["scheme"] for r in exact} == {"sync", "ignore", "frc", "cyclic"}  # ignore: fault-free only
    for r in exact:
        assert r["auc"] == sync["auc"]
        assert [auc for _, auc in r["curve"]] == [auc for _, auc in sync["curve"]]


def test_an_exact_code_reaches_the_target_after_its_load_times_syncs_fault_free_time(bench):
    sync = bench[("sync", "fault-free")]["target_reached_s"]
    assert sync is not None  # the target is its own last AUC less the slack
    assert bench[("frc", SLOW)]["target_reached_s"] == pytest.approx(2 * sync)
    assert bench[("sync", SLOW)]["target_reached_s"] == pytest.approx(4 * sync)


def test_a_round_lasts_until_the_slowest_worker_the_scheme_needs(bench):
    unit = bench[("sync", "fault-free")]["round_s"]
    assert bench[("sync", SLOW)]["round_s"] == pytest.approx(4 * unit)  # waits for the 4x-slow worker
    assert bench[("frc", SLOW)]["round_s"] == pytest.approx(2 * unit)  # two partitions, first of each group
    assert bench[("cyclic", SLOW)]["round_s"] == pytest.approx(2 * unit)
    assert bench[("ignore", SLOW)]["round_s"] == pytest.approx(unit)


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's errors
        return e.code


@pytest.mark.parametrize(
    "args, field",
    [(["--stragglers", "4"], "--stragglers 4"), (["--rate", "1.5"], "--rate"), (["--d", "5"], "--d 5"), (["--slow-factor", "1"], "--slow-factor")],
)
def test_bad_arguments_are_one_line_naming_the_flag_before_any_work(args, field, capsys, monkeypatch):
    def no_work(*_):
        raise AssertionError("read data before checking the arguments")

    monkeypatch.setattr("dlrover.bench.coding.load_data", no_work)
    assert _exit_code(["bench", "coding", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]
