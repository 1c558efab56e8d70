"""``dlrover bench data``: every reader produces exactly what pandas code reading the same
file produces (the bench refuses to time two readers that disagree), and a day of
TorchRec's ``.npy`` layout drops a bad row wherever its bag lies."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlrover.bench.readers import CASES, Arrays, check_same, layout_for, read_ours, run_data_bench
from dlrover.cli.main import main
from dlrover.data.batch import Batch
from dlrover.errors import DLRoverError


def test_each_reader_gives_the_arrays_pandas_gives_for_the_same_file():
    r = run_data_bench(rows=3000, repeats=1, shard_rows=1024)  # shards cut bags and files as a worker's reads do
    assert [x["format"] for x in r["formats"]] == [c.name for c in CASES]
    per_row = {x["format"]: x["ids"] / x["rows"] for x in r["formats"]}
    assert all(x["rows"] == 3000 and x["dlrover_rows_per_s"] > 0 and x["reference_rows_per_s"] > 0 for x in r["formats"])
    assert per_row["mlperf_npz"] == 214 and per_row["torchrec_npy"] == 26
    assert 26 < per_row["parquet_lists"] < 214  # 0..max_len ids in each multi-valued bag
    assert r["min_ratio"] == min(x["ratio"] for x in r["formats"])


def test_readers_that_disagree_are_not_timed_against_each_other():
    ok = Arrays(np.zeros(2, np.float32), np.zeros((2, 1), np.float32), [(np.array([5, 6]), np.array([1, 1], np.int32))])
    other = Arrays(ok.labels, ok.dense, [(np.array([5, 7]), np.array([1, 1], np.int32))])
    schema = layout_for({"label": "y", "sparse": ["c"]}, "csv").schema
    check_same("x", ok, ok, schema)
    with pytest.raises(DLRoverError, match="x: dlrover and the reference disagree on c"):
        check_same("x", ok, other, schema)


def test_an_unknown_format_is_one_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "data", "--formats", "criteo_tsv,excel"])
    assert e.value.code == 2 and "got 'criteo_tsv,excel'" in capsys.readouterr().err


def test_a_bad_label_in_a_multi_hot_day_drops_its_row_and_its_bags(tmp_path):
    case = next(c for c in CASES if c.name == "mlperf_npz")
    path, layout = case.make(str(tmp_path), 50)
    good = read_ours(path, layout, 50)[0]
    labels = np.load(f"{path}_labels.npy")
    labels[7] = 3
    np.save(f"{path}_labels.npy", labels)
    from dlrover.data.criteo import index_file
    from dlrover.data.reader import FileReader

    batch, skipped = FileReader(on_bad_line="skip", layout=layout).read(index_file(path, layout=layout), 0, 50)
    assert skipped == 1 and len(batch) == 49
    keep = np.arange(50) != 7
    ids, lengths = good.jagged()
    expect = Batch(good.labels[keep], good.dense[keep], ids[np.repeat(np.tile(keep, len(lengths)), lengths.reshape(-1))], lengths[:, keep])
    assert np.array_equal(batch.sparse, expect.sparse) and np.array_equal(batch.lengths, expect.lengths)
    assert np.array_equal(batch.dense, expect.dense)


def test_json_keeps_each_formats_rows_per_second(capsys):
    assert main(["bench", "data", "--json", "--rows", "500", "--repeats", "1", "--formats", "csv_header,torchrec_npy"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [x["format"] for x in r["formats"]] == ["csv_header", "torchrec_npy"]
    assert all({"dlrover_rows_per_s", "reference_rows_per_s", "ratio"} <= set(x) for x in r["formats"])
