from __future__ import annotations

import pytest

from dlrover.errors import SpecError
from dlrover.spec import load_spec, parse_overrides, spec_from_dict

BASE = {"data": {"paths": ["x/*.tsv"]}}


def test_quickstart_spec_is_valid():
    spec = load_spec("jobs/quickstart.yaml")
    assert spec.resources.workers == 2 and spec.resources.ps == 2
    assert spec.model.table_sizes() == [40000] * 26 and spec.data.epochs == 1


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({"data": {"paths": ["x"]}, "modle": {}}, "modle: unknown field"),
        ({"data": {"paths": ["x"], "batch_size": 0}}, "data.batch_size"),
        ({"data": {"paths": ["x"], "batch_size": "big"}}, "data.batch_size"),
        ({"data": {"paths": ["x"]}, "model": {"embedding_dim": 8, "dense_arch": [16, 4]}}, "must equal embedding_dim"),
        ({"data": {"paths": ["x"]}, "model": {"num_embeddings": [10, 20]}}, "model.num_embeddings"),
        ({"data": {"paths": ["x"]}, "resources": {"workers": 2, "budget_cpu": 1}}, "budget_cpu"),
        ({"data": {"paths": ["x"]}, "optimizer": {"sparse": {"name": "lamb"}}}, "optimizer.sparse.name"),
        ({}, "data: Field required"),
    ],
)
def test_bad_spec_names_the_field(doc, needle):
    with pytest.raises(SpecError) as e:
        spec_from_dict(doc, "job.yaml")
    msg = str(e.value)
    assert needle in msg and msg.startswith("job.yaml: ") and "\n" not in msg


def test_overrides_set_nested_fields_with_yaml_values():
    spec = spec_from_dict(dict(BASE), "s", parse_overrides(["data.epochs=3", "resources.ps=4", "model.dense_arch=[64, 16]"]))
    assert spec.data.epochs == 3 and spec.resources.ps == 4 and spec.model.dense_arch == [64, 16]
    with pytest.raises(SpecError, match="expected key=value"):
        parse_overrides(["data.epochs"])


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("data:\n  paths: [a\n  epochs: 2\n")
    with pytest.raises(SpecError, match=r"bad.yaml:\d+"):
        load_spec(p)
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "missing.yaml")
