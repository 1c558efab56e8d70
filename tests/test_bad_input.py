"""Bad input to ``dlrover run`` is one line on stderr naming the field or file, a non-zero
exit, no traceback, and nothing written: no job directory under the runs dir, no
checkpoint directory. Each case goes through the real CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import small_spec
from dlrover.data.plan import DataPlan
from dlrover.errors import DataError, DLRoverError
from dlrover.paths import check_creatable_dir

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}


@pytest.fixture
def job(tmp_path, synth_dir):
    """A small valid job under ``tmp_path``: its spec file, an empty runs dir and a
    checkpoint dir that does not exist yet."""
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    runs.mkdir()
    body = (
        f"data: {{paths: ['{synth_dir}/*.tsv'], shard_rows: 4096}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        f"checkpoint: {{dir: '{ckpt}'}}\n"
    )
    return {"spec": tmp_path / "job.yaml", "body": body, "runs": runs, "ckpt": ckpt}


def run_bad(job, extra: str, *args: str) -> str:
    """``dlrover run`` of the job's spec plus ``extra`` YAML; asserts that it failed the
    way bad input must, and returns its one stderr line."""
    job["spec"].write_text(job["body"] + extra)
    cmd = [sys.executable, "-m", "dlrover", "run", str(job["spec"]), "--runs-dir", str(job["runs"]), "--quiet", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert list(job["runs"].iterdir()) == [], "a job directory was written"
    assert not job["ckpt"].exists(), "the checkpoint directory was created"
    return lines[0]


@pytest.mark.parametrize(
    "target,resources",
    [
        ("worker:7", "resources: {workers: 2, ps: 2}"),
        ("ps:5", "resources: {workers: 2, ps: 2}"),
        ("worker:9", "resources: {workers: 2, ps: 2, budget_cpu: 8}\npolicy: {name: dlrover_rm}"),
    ],
)
def test_chaos_target_the_job_never_has_is_rejected_naming_the_entry(job, target, resources):
    line = run_bad(job, f"{resources}\nchaos: [{{at_s: 1, action: kill, target: '{target}'}}]\n")
    assert f"{job['spec']}: chaos.0.target: {target}" in line


def test_checkpoint_dir_under_a_regular_file_is_rejected_before_anything_is_written(job, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    line = run_bad(job, "", "--set", f"checkpoint.dir={blocker}/ckpt")
    assert "checkpoint.dir" in line and str(blocker) in line


def test_data_that_holds_no_rows_is_rejected_naming_data_paths(job, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "part-0.tsv").write_text("")
    line = run_bad(job, "", "--set", f"data.paths=['{empty}/*.tsv']")
    assert "data.paths" in line and f"{empty}/*.tsv" in line and "no training rows" in line


def test_data_plan_of_files_without_rows_raises_data_error(tmp_path):
    (tmp_path / "blank.tsv").write_text("\n\n")
    with pytest.raises(DataError, match=r"^data\.paths: .*blank\.tsv: no training rows \(0 rows in 1 file"):
        DataPlan.build(small_spec(tmp_path, data__paths=[str(tmp_path / "blank.tsv")]))


def test_data_plan_keeps_training_rows_of_a_one_row_file(tmp_path, synth_dir):
    one = tmp_path / "one.tsv"
    one.write_text(sorted(Path(synth_dir).glob("*.tsv"))[0].read_text().splitlines(keepends=True)[0])
    plan = DataPlan.build(small_spec(tmp_path, data__paths=[str(one)], data__eval_fraction=0.9))
    assert plan.train_rows == {str(one): 1}


def test_creatable_dir_check_leaves_nothing_behind(tmp_path):
    check_creatable_dir(str(tmp_path / "a" / "b"), "checkpoint.dir")
    check_creatable_dir(str(tmp_path), "checkpoint.dir")
    assert list(tmp_path.iterdir()) == []


def test_creatable_dir_check_names_the_field_and_the_blocking_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(DLRoverError, match=rf"^checkpoint\.dir: {tmp_path}/f/x/y: {tmp_path}/f is not a directory$"):
        check_creatable_dir(str(tmp_path / "f" / "x" / "y"), "checkpoint.dir")


def test_simulate_output_dir_under_a_file_is_one_line_error(tmp_path):
    (tmp_path / "f").write_text("")
    cmd = [sys.executable, "-m", "dlrover", "simulate", "--jobs", "5", "--nodes", "2", "--out", str(tmp_path / "f" / "sim")]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [f"error: {tmp_path / 'f' / 'sim'}: cannot create output directory: Not a directory"]
