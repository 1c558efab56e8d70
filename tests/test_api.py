"""The Python API: a spec built in Python, ``dlrover.run`` and ``dlrover.submit``, and the
``JobResult`` they give; the CLI is a layer over the same calls."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

import dlrover
from summaries import a_summary
from test_cli import dlrover as dlrover_cli

ROOT = Path(__file__).resolve().parents[1]
API_DOC = ROOT / "docs" / "API.md"

# A deterministic job (one shard at a time, no staleness): two runs learn the same tables.
SMALL_JOB = """\
name: api
seed: 2
model: {{embedding_dim: 8, num_embeddings: 4000, dense_arch: [16, 8], over_arch: [16, 1]}}
data: {{paths: ['{data}/*.tsv'], epochs: 2, batch_size: 1024, eval_fraction: 0.1, shard_rows: 4096}}
resources: {{workers: 2, ps: 2, worker_memory_mb: 2048, ps_memory_mb: 1024, dense_ps_cpu: 0}}
optimizer: {{sparse: {{name: sgd, lr: 0.05}}, dense: {{name: sgd, lr: 0.05}}}}
train: {{deterministic: true, staleness: 0}}
"""
# What differs between two runs of one deterministic job: when, how fast, and the ids.
RUN_SPECIFIC = {
    "job_id", "throughput_samples_per_s", "train_time_s", "wall_time_s", "configurations", "perf_model", "history_record",
    "reliability", "ettr", "mttf_s", "checkpoints", "node_speeds_probed", "initial_plan", "final_config",
}  # fmt: skip


def comparable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in RUN_SPECIFIC}


def test_with_overrides_sets_dotted_fields_and_keeps_the_rest():
    spec = dlrover.JobSpec.from_yaml(ROOT / "jobs" / "quickstart.yaml")
    changed = spec.with_overrides({"data.epochs": 3, "resources.ps": 1, "model.dense_arch": [32, 16]})
    assert (changed.data.epochs, changed.resources.ps, changed.model.dense_arch) == (3, 1, [32, 16])
    assert changed.with_overrides({"data.epochs": 1, "resources.ps": 2, "model.dense_arch": [64, 16]}) == spec
    assert spec.data.epochs == 1  # a copy: the spec itself is frozen


@pytest.mark.parametrize("path", sorted((ROOT / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_spec_survives_a_round_trip_through_its_overrides(path):
    spec = dlrover.JobSpec.from_yaml(path)
    assert spec.with_overrides({}) == spec


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"data.epochs": 0}, "quickstart with overrides: data.epochs: Input should be greater than or equal to 1"),
        ({"data.epochs.x": 1}, "override data.epochs.x: epochs is not a section"),
        ({"data..epochs": 1}, "override 'data..epochs': bad key"),
        ({"resources.workerz": 1}, "resources.workerz: unknown field"),
    ],
)
def test_a_bad_override_is_one_line_naming_the_key(overrides, needle):
    spec = dlrover.JobSpec.from_yaml(ROOT / "jobs" / "quickstart.yaml")
    with pytest.raises(dlrover.DLRoverError) as e:
        spec.with_overrides(overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_result_reads_a_run_directory_with_its_events_as_a_table(tmp_path):
    s = a_summary(job_id="j-1")
    (tmp_path / "summary.json").write_text(json.dumps(s.to_json()))
    rows = [{"at_s": 1.0, "kind": "metrics", "actor": "j-1/worker-0", "loss": 0.6, "samples": 512}, {"at_s": 2.5, "kind": "eval", "auc": 0.7}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = dlrover.JobResult.load(tmp_path)
    assert (r.job_id, r.auc, r.samples_trained, r.run_dir) == ("j-1", 0.77, 10, tmp_path)
    assert list(r.events.kind) == ["metrics", "eval"] and r.events.loss.iloc[0] == 0.6 and r.events.auc.iloc[1] == 0.7
    assert [e.kind for e in r.event_records] == ["metrics", "eval"]
    assert r.summary().to_json() == s.to_json() and [e.to_json() for e in r.summary().events] == rows
    assert r.failures[0].actor == "j/worker-0" and r.scale_events[0].new.worker_memory_mb == 2304  # records, not dicts


def test_a_result_of_a_directory_without_a_summary_is_one_line(tmp_path):
    with pytest.raises(dlrover.DLRoverError, match="summary.json: missing"):
        dlrover.JobResult.load(tmp_path)


def api_doc_names() -> list[str]:
    """The names docs/API.md documents: its ``dlrover.<name>`` headings."""
    return re.findall(r"^### `dlrover\.(\w+)", API_DOC.read_text(), flags=re.M)


def test_every_name_the_api_doc_lists_is_importable_from_the_package_top():
    names = api_doc_names()
    assert {"run", "submit", "JobSpec", "JobResult", "SubmittedJob"} <= set(names)
    assert set(names) <= set(dlrover.__all__), set(names) - set(dlrover.__all__)
    for name in names:
        assert getattr(dlrover, name) is not None
    assert set(dlrover.__all__) <= set(names), f"undocumented top-level names: {set(dlrover.__all__) - set(names)}"


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_spec_built_in_python_trains_like_the_same_yaml_through_the_cli(ray_local, synth_dir, tmp_path):
    """``dlrover run job.yaml --set ...`` and ``dlrover.run(JobSpec.from_yaml(...).with_overrides(...))``
    are one code path: in deterministic mode their summaries are identical, timings and ids aside."""
    base = tmp_path / "job.yaml"
    base.write_text(SMALL_JOB.format(data=synth_dir).replace("epochs: 2", "epochs: 1"))
    proc = dlrover_cli("run", base, "--set", "data.epochs=2", "--set", "resources.ps=1", "--runs-dir", tmp_path / "cli")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary_path = Path(re.search(r"summary: (\S+)", proc.stdout).group(1))
    from_cli = json.loads(summary_path.read_text())

    spec = dlrover.JobSpec.from_yaml(base).with_overrides({"data.epochs": 2, "resources.ps": 1})
    result = dlrover.run(spec, runs_dir=tmp_path / "api", progress="none")
    assert result.status == "succeeded" and result.samples_trained == result.samples_expected > 0
    assert result.ps_ids_updated == result.ids_expected and result.epochs == 2 and result.config.ps == 1
    assert comparable(result.summary().to_json()) == comparable(from_cli)
    assert result.run_dir.parent == tmp_path / "api" and (result.run_dir / "summary.json").is_file()
    metrics = result.events.query("kind == 'metrics'")
    assert len(metrics) > 0 and metrics.loss.notna().all()
