"""Readers of named-column files (CSV and TSV with a header or ``data.columns``, Parquet
by column name): rows come out as the schema says, bad rows are named ``file:line``."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrover.data.columns import hash_ids
from dlrover.data.batch import Batch
from dlrover.data.criteo import index_file
from dlrover.data.reader import FileReader
from dlrover.errors import DataError
from dlrover.spec import spec_from_dict

FEATURES = {
    "label": "click",
    "dense": ["price"],
    "sparse": ["site", {"column": "genres", "separator": "|", "max_len": 2}, {"column": "user", "ids": "int"}],
}
CSV = (
    "click,price,site,genres,user,unused\n"
    "1,3.5,abc,Comedy|Drama,7,x\n"
    "0,,xyz,,8,x\n"
    "1,2,abc,Drama|Horror|Romance,-3,x\n"
    "\n"
    "0,1e3,q,Comedy,9,x\n"
)


def _layout(features=FEATURES, **data):
    return spec_from_dict({"features": features, "data": {"paths": ["x"], **data}}).layout()


def _read(path, layout=None, start=0, stop=None, on_bad_line="fail", stride=None):
    layout = layout or _layout()
    idx = index_file(str(path), stride=stride, layout=layout)
    return FileReader(on_bad_line, layout=layout).read(idx, start, idx.rows if stop is None else stop)


def _text(values) -> np.ndarray:
    return hash_ids(pa.array(values))


def test_string_ids_are_a_stable_hash_of_the_value_text():
    ids = _text(["abc", "xyz", "abc"])
    assert ids[0] == ids[2] != ids[1] and (ids >= 0).all()
    expected = pd.util.hash_array(np.array(["abc"], dtype=object), categorize=False).astype(np.uint64) & np.uint64(2**63 - 1)
    assert ids[0] == int(expected[0])


def test_a_csv_with_a_header_reads_by_column_name(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text(CSV)
    batch, bad = _read(path)
    assert bad == 0 and len(batch) == 4 and batch.labels.tolist() == [1, 0, 1, 0]
    np.testing.assert_allclose(batch.dense[:, 0], np.log1p([3.5, 0, 2, 1000]), rtol=1e-6)
    values, lengths = batch.jagged()
    assert lengths.tolist() == [[1, 1, 1, 1], [2, 0, 2, 1], [1, 1, 1, 1]]  # a missing value is an empty bag
    site, genres, user = np.split(values, np.cumsum(lengths.sum(axis=1))[:-1])
    assert site.tolist() == _text(["abc", "xyz", "abc", "q"]).tolist()
    assert genres.tolist() == _text(["Comedy", "Drama", "Drama", "Horror", "Comedy"]).tolist()
    assert user.tolist() == [7, 8, -3, 9] and batch.long_bags == 1  # Romance cut by max_len 2


def test_any_row_range_reads_the_same_rows_as_the_whole_file(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text(CSV)
    whole, _ = _read(path)
    for a, b in [(0, 1), (1, 3), (2, 4), (3, 4)]:
        part, _ = _read(path, start=a, stop=b, stride=2)
        want = whole.slice(a, b)
        assert part.labels.tolist() == want.labels.tolist()
        assert [x.tolist() for x in part.jagged()] == [x.tolist() for x in want.jagged()]
    halves = Batch.concat([whole.slice(0, 2), whole.slice(2, 4)])
    assert [x.tolist() for x in halves.jagged()] == [x.tolist() for x in whole.jagged()] and halves.long_bags == 1


def test_gzip_tsv_and_a_headerless_file_with_named_columns(tmp_path):
    gz = tmp_path / "clicks.tsv.gz"
    gz.write_bytes(gzip.compress(CSV.replace(",", "\t").encode()))
    headerless = tmp_path / "clicks.txt"
    headerless.write_text(CSV.split("\n", 1)[1].replace(",", ";"))
    (tmp_path / "clicks.csv").write_text(CSV)
    want, _ = _read(tmp_path / "clicks.csv")
    columns = ["click", "price", "site", "genres", "user", "unused"]
    for path, layout in [(gz, _layout()), (headerless, _layout(header=False, columns=columns, delimiter=";"))]:
        got, _ = _read(path, layout)
        assert got.labels.tolist() == want.labels.tolist(), path
        assert [x.tolist() for x in got.jagged()] == [x.tolist() for x in want.jagged()], path


def test_a_rating_label_with_a_threshold_and_no_dense_column(tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text("user,item,rating\nu1,i1,5\nu2,i1,3.5\nu1,i2,4\n")
    batch, _ = _read(path, _layout({"label": {"column": "rating", "threshold": 4}, "sparse": ["user", "item"]}))
    assert batch.labels.tolist() == [1, 0, 1]
    assert batch.dense.tolist() == [[1.0]] * 3  # the constant input of a schema without dense columns
    assert batch.lengths is None and batch.sparse.shape == (3, 2)  # one id each: the single-hot layout


def test_a_schema_column_missing_from_the_header_names_the_column_and_the_file(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text(CSV.replace("genres", "genre"))
    with pytest.raises(DataError, match=rf"{path}: column 'genres' of the schema is not in the file's header"):
        _read(path)


@pytest.mark.parametrize(
    "line,problem",
    [
        ("1,abc,s,g,1,x", "price: not a number, got 'abc'"),
        ("2,1,s,g,1,x", "click: label must be 0 or 1"),
        ("1,1,s,g,1.5,x", "user: not an integer, got '1.5'"),
        ("1,1,s", "expected 6 comma-separated fields"),
    ],
)
def test_a_bad_row_names_file_line_and_column_and_skip_drops_it(tmp_path, line, problem):
    path = tmp_path / "clicks.csv"
    path.write_text(CSV.replace("0,,xyz,,8,x", line))
    with pytest.raises(DataError) as e:
        _read(path)
    assert str(e.value).startswith(f"{path}:3: {problem}"), str(e.value)
    batch, skipped = _read(path, on_bad_line="skip")
    assert skipped == 1 and batch.labels.tolist() == [1, 1, 0]


def test_a_bag_over_max_len_fails_with_on_long_bag_fail(tmp_path):
    path = tmp_path / "clicks.csv"
    path.write_text(CSV)
    with pytest.raises(DataError, match=rf"{path}:4: genres: more than max_len \(2\) ids"):
        _read(path, _layout(on_long_bag="fail"))


def test_parquet_by_column_name_with_a_list_column(tmp_path):
    path = tmp_path / "clicks.parquet"
    table = pa.table({
        "y": pa.array([1, 0, 1, 0], pa.int8()),
        "age": pa.array([3.0, None, 1.0, 2.0]),
        "user": pa.array([5, 6, None, 7], pa.int64()),
        "items": pa.array([[1, 2, 3], [], None, [4]], pa.list_(pa.int64())),
        "city": pa.array(["a", "b", "a", ""]),
    })  # fmt: skip
    pq.write_table(table, path, row_group_size=3)
    layout = _layout({"label": "y", "dense": ["age"], "sparse": ["user", {"column": "items", "max_len": 2}, "city"]})
    batch, _ = _read(path, layout)
    values, lengths = batch.jagged()
    assert lengths.tolist() == [[1, 1, 0, 1], [2, 0, 0, 1], [1, 1, 1, 0]] and batch.long_bags == 1
    assert values[:5].tolist() == [5, 6, 7, 1, 2] and values[5] == 4
    assert values[6:].tolist() == _text(["a", "b", "a"]).tolist()
    np.testing.assert_allclose(batch.dense[:, 0], np.log1p([3, 0, 1, 2]), rtol=1e-6)
    second, _ = _read(path, layout, start=3, stop=4)  # the second row group alone
    assert second.labels.tolist() == [0] and second.jagged()[0].tolist() == [7, 4]


def test_a_parquet_list_column_without_max_len_is_refused(tmp_path):
    path = tmp_path / "clicks.parquet"
    pq.write_table(pa.table({"y": [1], "items": pa.array([[1, 2]], pa.list_(pa.int64()))}), path)
    with pytest.raises(DataError, match="column items holds lists: give it max_len"):
        _read(path, _layout({"label": "y", "sparse": ["items"]}))


def test_synth_for_a_schema_writes_learnable_rows_the_readers_read(tmp_path, capsys):
    """``dlrover data synth --schema``: the spec's columns and layout, variable-length
    bags of 0..max_len ids, a missing single value as an empty field, the best AUC."""
    import json

    from dlrover.cli.main import main

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "features: {label: click, dense: [price], sparse: [site, {column: genres, separator: '|', max_len: 4}, {column: uid, ids: int}]}\n"
        f"data: {{paths: ['{tmp_path}/out/*.csv']}}\n"
    )
    assert main(["data", "synth", "--schema", str(spec), "--out", str(tmp_path / "out"), "--rows", "2000", "--files", "2"]) == 0
    meta = json.loads((tmp_path / "out" / "synth.json").read_text())
    assert meta["rows"] == 2000 and 0.6 < meta["best_auc"] < 1.0 and "best possible auc" in capsys.readouterr().out
    layout = spec_from_dict({"features": {"label": "click", "dense": ["price"], "sparse": ["site", {"column": "genres", "separator": "|", "max_len": 4}, {"column": "uid", "ids": "int"}]}, "data": {"paths": ["x"]}}).layout()
    batch, bad = _read(tmp_path / "out" / "part-00000.csv", layout)
    assert bad == 0 and len(batch) == 1000
    lengths = batch.jagged()[1]
    assert set(lengths[1].tolist()) == {0, 1, 2, 3, 4} and 0 < int((lengths[2] == 0).sum()) < 100  # uid: ~2% missing
