"""``dlrover bench scaling``: the grid parser and default grids (pure), the CLI's one-line
error for a bad ``--grid``, and one real 1 worker + 1 PS point."""

from __future__ import annotations

import json

import pytest

from dlrover.bench.scaling import default_grid, parse_grid, run_scaling_bench
from dlrover.cli.main import main


def test_parse_grid_reads_pairs_in_order() -> None:
    assert parse_grid("1x1") == [(1, 1)]
    assert parse_grid("1x1, 2X1,2x2 ,8x4") == [(1, 1), (2, 1), (2, 2), (8, 4)]


@pytest.mark.parametrize("bad", ["", "1x", "x1", "0x1", "1x0", "axb", "1-1", "1x1,", "1x1,,2x2", "1x1x1", "-1x2", "1.5x1", "1x1,1x1"])
def test_parse_grid_rejects_malformed_input(bad: str) -> None:
    with pytest.raises(ValueError, match="WORKERSxPS|twice"):
        parse_grid(bad)


def test_default_grid_fits_the_cores() -> None:
    assert default_grid(2) == [(1, 1), (2, 1), (1, 2), (2, 2)]
    assert default_grid(16) == [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4)]
    assert default_grid(1) == default_grid(2)
    for cores in (4, 8, 16, 64):
        assert all(w <= cores // 2 and w + p <= cores for w, p in default_grid(cores))


def test_bad_grid_on_the_command_line_is_one_error_line(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "scaling", "--grid", "2x"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--grid" in err[0] and "'2x'" in err[0]


def test_one_real_point_gives_a_row_with_its_breakdown(ray_local, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DLROVER_BENCH_DATA", str(tmp_path / "data"))
    r = json.loads(json.dumps(run_scaling_bench(grid=[(1, 1)], steps=6, batch_size=512)))  # what --json prints
    assert r["rows_per_run"] == 6 * 512 and r["ratio_2w2p_vs_1w1p"] is None
    (row,) = r["rows"]
    assert (row["workers"], row["ps"]) == (1, 1)
    assert row["samples_per_s"] > 0 and row["efficiency"] == pytest.approx(1.0)
    assert row["samples"] == 6 * 512 and row["steps"] >= 6
    for key in ("compute_ms", "wait_pull_ms", "push_ms", "wait_dense_ms", "route_ms", "step_ms"):
        assert row[key] is not None and row[key] >= 0, key
    assert row["compute_ms"] > 0
