"""``dlrover bench ps-lookup``: a small real run through the CLI (in process, no Ray)."""

from __future__ import annotations

import json

from dlrover.cli.main import main


def test_every_bag_of_a_batch_is_looked_up_once_however_many_ps(tmp_path, monkeypatch, capsys) -> None:
    """Spread over 1, 3 and 8 PS, the PS look up exactly the batch's rows x tables bags
    (single-hot: none missed, none twice), and the figures are relative to 1 PS."""
    monkeypatch.setenv("DLROVER_BENCH_DATA", str(tmp_path / "data"))
    assert main(["bench", "ps-lookup", "--quick", "--ps", "1,3,8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [x["ps"] for x in r["rows"]] == [1, 3, 8] and r["batches"] == 3
    for x in r["rows"]:
        assert x["bags_per_batch"] == x["rows_x_tables"] == 2048 * 26, x
        assert x["ps_cpu_ms"] > 0 and x["busiest_ps_cpu_ms"] <= x["ps_cpu_ms"] and x["route_ms"] > 0
    assert r["rows"][0]["ps_cpu_vs_1ps"] == 1.0
