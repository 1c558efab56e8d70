from __future__ import annotations

from pathlib import Path

import pytest

from dlrover.errors import SpecError
from dlrover.spec import load_spec, parse_overrides, spec_from_dict

BASE = {"data": {"paths": ["x/*.tsv"]}}


def test_quickstart_spec_is_valid():
    spec = load_spec("jobs/quickstart.yaml")
    assert spec.resources.workers == 2 and spec.resources.ps == 2
    assert spec.schema.table_sizes() == [40000] * 26 and spec.data.epochs == 1


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
        ({"data": {"paths": ["x"]}, "optimizer": {"dense": {"name": "sgd", "initial_accumulator_value": 0.1}}}, "sgd has no accumulator"),
        ({"data": {"paths": ["x"]}, "optimizer": {"dense": {"initial_accumulator_value": -1}}}, "optimizer.dense.initial_accumulator_value"),
        ({}, "data: Field required"),
        ({"data": {"paths": ["x"]}, "train": {"dense_sync": "allreduce"}}, "train.dense_sync"),
        ({"data": {"paths": ["x"]}, "train": {"dense_sync": "coded", "stragglers": -1}}, "train.stragglers"),
        ({"data": {"paths": ["x"]}, "train": {"dense_sync": "sync", "deterministic": True, "staleness": 0}}, "and dense_sync: async"),
        ({"data": {"paths": ["x"]}, "train": {"staleness": 0, "max_staleness": 2}}, "max_staleness: 2 needs staleness: 1"),
        ({"data": {"paths": ["x"]}, "train": {"max_staleness": 9}}, "train.max_staleness"),
        ({"data": {"paths": ["x"]}, "train": {"max_staleness": 0}}, "max_staleness: 0 is below staleness: 1"),
        ({"data": {"paths": ["x"]}, "train": {"dense_sync": "sync"}, "resources": {"dense_ps": 2}}, "needs resources.dense_ps: 1"),
    ],
)
def test_bad_spec_names_the_field(doc, needle):
    with pytest.raises(SpecError) as e:
        spec_from_dict(doc, "job.yaml")
    msg = str(e.value)
    assert needle in msg and msg.startswith("job.yaml: ") and "\n" not in msg


def test_pulls_run_as_far_ahead_as_the_staleness_unless_max_staleness_says_more():
    assert spec_from_dict(dict(BASE), "s").train.pull_ahead_bound == 1
    assert spec_from_dict(dict(BASE, train={"staleness": 0}), "s").train.pull_ahead_bound == 0
    assert spec_from_dict(dict(BASE, train={"max_staleness": 4}), "s").train.pull_ahead_bound == 4


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


def chaos_spec(target: str, **sections) -> dict:
    return {**BASE, **sections, "chaos": [{"at_s": 1, "action": "kill", "target": "worker:0"}, {"at_s": 2, "action": "kill", "target": target}]}


@pytest.mark.parametrize(
    "target,sections",
    [
        ("worker:2", {"resources": {"workers": 2}}),
        ("ps:2", {"resources": {"ps": 2}}),
        ("worker:3", {"resources": {"workers": 2, "budget_cpu": 8}}),  # static never scales out
        ("worker:8", {"resources": {"budget_cpu": 8}, "policy": {"name": "dlrover_rm"}}),
        ("worker:7", {"resources": {"budget_cpu": 8}, "policy": {"name": "dlrover_rm"}}),  # 0.25 CPU of 8 is the dense PS's
        ("worker:4", {"resources": {"worker_cpu": 2, "budget_cpu": 8}, "policy": {"name": "optimus"}}),
        ("ps:4", {"resources": {"budget_cpu": 64}, "train": {"vshards": 4}, "policy": {"name": "dlrover_rm"}}),
    ],
)
def test_chaos_target_beyond_the_most_actors_the_job_can_have_names_the_entry(target, sections):
    with pytest.raises(SpecError) as e:
        spec_from_dict(chaos_spec(target, **sections), "job.yaml")
    assert str(e.value).startswith(f"job.yaml: chaos.1.target: {target} never exists: this job runs at most ")


@pytest.mark.parametrize(
    "target,sections",
    [
        ("worker:1", {"resources": {"workers": 2}}),
        ("ps:1", {"resources": {"ps": 2}}),
        ("worker:6", {"resources": {"budget_cpu": 8}, "policy": {"name": "dlrover_rm"}}),
        ("worker:7", {"resources": {"budget_cpu": 8, "dense_ps_cpu": 0}, "policy": {"name": "dlrover_rm"}}),
        ("worker:2", {"resources": {"workers": 2, "ps": 2}, "policy": {"name": "scripted"}}),  # reshaped within the request's 4 CPUs
        ("ps:3", {"resources": {"budget_cpu": 64}, "train": {"vshards": 4}, "policy": {"name": "dlrover_rm"}}),
        ("node:9", {}),  # the cluster's size is known only when the job runs
    ],
)
def test_chaos_target_a_policy_can_reach_is_accepted(target, sections):
    assert spec_from_dict(chaos_spec(target, **sections), "job.yaml").chaos[1].target == target


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).resolve().parents[1] / "jobs").glob("*.yaml")))
def test_every_shipped_job_spec_is_valid(name):
    assert load_spec(Path(__file__).resolve().parents[1] / "jobs" / name).data.paths


def test_dense_adagrad_starts_its_accumulator_at_the_default_and_a_dumped_spec_may_switch_optimizer():
    spec = spec_from_dict(dict(BASE))
    assert spec.optimizer.dense.name == "adagrad" and spec.optimizer.dense.accumulator_start == 0.001
    doc = spec.model_dump()
    doc["optimizer"]["dense"]["name"] = "sgd"  # the dump leaves the start value unset: not an error
    assert spec_from_dict(doc).optimizer.dense.name == "sgd"
    set_ = spec_from_dict(dict(BASE), "s", parse_overrides(["optimizer.dense.initial_accumulator_value=0"]))
    assert set_.optimizer.dense.accumulator_start == 0.0
