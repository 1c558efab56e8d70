"""``features:``: a job's columns, resolved into the schema every part of the job follows."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from dlrover.data.schema import IdKind, Transform
from dlrover.errors import SpecError
from dlrover.spec import spec_from_dict
from dlrover.table_spec import Pooling, TableKind

CLICKS = {
    "label": "click",
    "dense": ["price", {"column": "age_days", "transform": "none"}],
    "sparse": [
        "site_id",
        {"column": "genres", "separator": "|", "max_len": 8},
        {"column": "device_model", "table": "device", "ids": "string"},
        {"column": "app_device", "table": "device", "ids": "string"},
    ],
}


def _spec(features=CLICKS, tables=None, **data):
    doc = {"features": features, "data": {"paths": ["x.csv"], **data}, "model": {"num_embeddings": 1000, "tables": tables or {}}}
    return spec_from_dict(doc, "job.yaml")


def test_without_features_the_schema_is_criteos_layout():
    s = spec_from_dict({"data": {"paths": ["x"]}, "model": {"num_embeddings": 500}}).schema
    assert s.criteo and s.label.column == "label"
    assert s.dense_columns == [f"I{i}" for i in range(1, 14)] and s.feature_names == [f"C{i}" for i in range(1, 27)]
    assert all(f.ids is IdKind.HEX and not f.multi for f in s.sparse) and s.table_sizes() == [500] * 26


def test_a_criteo_table_is_keyed_by_index_or_by_name():
    by_index = spec_from_dict({"data": {"paths": ["x"]}, "model": {"tables": {3: {"kind": "dynamic", "capacity_rows": 64}}}}).schema
    by_name = spec_from_dict({"data": {"paths": ["x"]}, "model": {"tables": {"C4": {"kind": "dynamic", "capacity_rows": 64}}}}).schema
    assert list(by_index.dynamic()) == list(by_name.dynamic()) == [3]
    assert by_index.table_sizes() == by_name.table_sizes() and by_index.table_sizes()[3] == 64


def test_each_feature_gets_a_table_named_after_its_column_unless_it_names_a_shared_one():
    s = _spec().schema
    assert [t.name for t in s.tables] == ["site_id", "genres", "device"]
    assert s.tables[2].features == ("device_model", "app_device")
    assert s.feature_names == ["site_id", "genres", "device_model", "app_device"] and s.feature_tables() == [0, 1, 2, 2]
    genres = s.sparse[1]
    assert genres.multi and genres.max_len == 8 and genres.separator == "|"
    assert not s.sparse[0].multi and s.sparse[0].max_len == 1 and s.max_ids_per_sample() == 11


def test_features_sharing_a_table_are_laid_out_next_to_each_other():
    features = {"label": "y", "sparse": ["a", {"column": "b", "table": "t"}, "c", {"column": "d", "table": "t"}]}
    s = _spec(features).schema
    assert s.feature_names == ["a", "b", "d", "c"] and s.feature_tables() == [0, 1, 1, 2]


def test_dense_columns_are_log1p_by_default_and_none_for_torchrec_npy():
    s = _spec().schema
    assert [d.transform for d in s.dense] == [Transform.LOG1P, Transform.NONE]
    npy = spec_from_dict({"features": {"label": "label", "dense": ["I1"], "sparse": ["C1"]}, "data": {"paths": ["x"], "format": "torchrec_npy"}}).schema
    assert npy.dense[0].transform is Transform.NONE


def test_table_settings_are_keyed_by_table_name():
    s = _spec(tables={"device": {"num_embeddings": 50_000, "pooling": "mean"}, "genres": {"kind": "dynamic", "capacity_rows": 1024}}).schema
    assert s.table_sizes() == [1000, 1024, 50_000]
    assert s.tables[2].spec.pooling is Pooling.MEAN and s.tables[1].spec.kind is TableKind.DYNAMIC
    assert s.mean_features() == [2, 3] and list(s.dynamic()) == [1]


def test_a_label_with_a_threshold_and_a_schema_with_no_dense_column():
    s = _spec({"label": {"column": "rating", "threshold": 4}, "sparse": ["user", "item"]}).schema
    assert s.label.threshold == 4 and s.dense == () and s.dense_width == 1


@pytest.mark.parametrize(
    "features,tables,needle",
    [
        ({"label": "y", "sparse": []}, None, "features.sparse: List should have at least 1 item"),
        ({"label": "y", "dense": ["d"]}, None, "features.sparse: Field required"),
        ({"label": "y", "sparse": [{"column": "g", "separator": "|"}]}, None, "max_len: required for a multi-valued column"),
        ({"label": "y", "sparse": ["a", "a"]}, None, "sparse.1: column 'a' is used twice"),
        ({"label": "y", "sparse": ["s"]}, {3: {"pooling": "mean"}}, "model.tables.3: tables are named by features:"),
        ({"label": "y", "sparse": ["s"]}, {"nope": {"pooling": "mean"}}, "model.tables.nope: no feature uses a table of that name"),
        ({"label": "y", "sparse": [{"column": "a", "table": "t"}, {"column": "b", "table": "t", "separator": ",", "max_len": 3}]}, None,
         "a and b share table t with different ids/separator/max_len"),
        ({"label": "y", "sparse": ["s"]}, {"s": {"kind": "dynamic", "capacity_rows": 64, "num_embeddings": 5}}, "num_embeddings: only for kind: hashed"),
    ],
)  # fmt: skip
def test_a_bad_schema_is_one_line_naming_the_field(features, tables, needle):
    with pytest.raises(SpecError) as e:
        _spec(features, tables)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_csv_and_npy_formats_need_features_and_criteo_refuses_them():
    with pytest.raises(SpecError, match="data.format: csv needs features:"):
        spec_from_dict({"data": {"paths": ["x"], "format": "csv"}})
    with pytest.raises(SpecError, match="data.format: criteo is Criteo's own layout"):
        _spec(format="criteo")


def test_a_spec_round_trips_through_json_with_its_schema():
    from dlrover.spec import JobSpec

    spec = _spec(tables={"device": {"pooling": "mean"}})
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again.schema == spec.schema


def test_num_dense_and_num_sparse_appear_only_in_criteos_own_layout_modules():
    """The schema is real, not Criteo padded: the spec, the model, the worker, the PS,
    the export and the benches take widths from the schema. Only the modules of Criteo's
    file layout (its schema, TSV parser, Parquet converter and generators) know them."""
    root = Path(__file__).resolve().parents[1] / "dlrover"
    allowed = {"data/schema.py", "data/criteo.py", "data/tsv.py", "data/parquet.py", "data/synth.py", "data/synth_highcard.py", "data/__init__.py"}
    users = set()
    for path in root.rglob("*.py"):
        if re.search(r"\bNUM_(DENSE|SPARSE)\b", path.read_text()):
            users.add(str(path.relative_to(root)))
    assert users <= allowed, sorted(users - allowed)
    out = subprocess.run(["git", "grep", "-l", "-E", r"\bNUM_(DENSE|SPARSE)\b", "--", "dlrover/"], cwd=root.parent, capture_output=True, text=True)
    assert set(out.stdout.split()) - {f"dlrover/{a}" for a in allowed} == set()
