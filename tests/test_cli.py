"""The command line: bad input gives one ``error:`` line and a non-zero exit, no traceback;
``dlrover submit`` goes through Ray Jobs on a head this test starts."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR", "RAY_IGNORE_UNHANDLED_ERRORS": "1"}


def dlrover(*args, cwd=ROOT, timeout=600):
    return subprocess.run([sys.executable, "-m", "dlrover", *map(str, args)], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc, needle: str):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert needle in errors[0], errors[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "body,needle",
    [
        ("data: {paths: [x.tsv]}\nresources: {workers: 0}\n", "resources.workers"),
        ("data: {paths: [x.tsv]}\nmodel: {embedding_dim: 16, dense_arch: [32, 8]}\n", "must equal embedding_dim"),
        ("data: {paths: [x.tsv]}\nbatch_size: 12\n", "batch_size: unknown field"),
        ("data: {paths: [x.tsv]\n", "bad.yaml:"),
        ("data: {paths: [/nonexistent/dir/*.tsv]}\n", "/nonexistent/dir/*.tsv"),
    ],
)
def test_bad_spec_is_one_line_error(tmp_path, body, needle):
    spec = write_spec(tmp_path / "bad.yaml", body)
    assert_one_line_error(dlrover("run", spec, "--runs-dir", tmp_path / "runs"), needle)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run"], "run: a job spec (YAML path) is required"),
        (["run", "missing.yaml"], "missing.yaml: spec file not found"),
        (["run", "jobs/quickstart.yaml", "--set", "data.epochs"], "expected key=value"),
        (["run", "jobs/quickstart.yaml", "--set", "data.epochs=-1"], "data.epochs"),
        (["data", "synth", "--out", "x", "--rows", "-5"], "expected a positive integer"),
        (["bogus"], "invalid choice"),
        (["status", "--address", "http://127.0.0.1:9"], "cannot reach Ray Jobs at http://127.0.0.1:9"),
        (["submit", "jobs/quickstart.yaml", "--address", "http://127.0.0.1:9"], "cannot reach Ray Jobs"),
    ],
)
def test_bad_cli_arguments_are_one_line_errors(args, needle):
    assert_one_line_error(dlrover(*args), needle)


def test_bad_data_line_names_file_and_line(ray_head, tmp_path, synth_dir):
    data = tmp_path / "data"
    data.mkdir()
    src = sorted(Path(synth_dir).glob("*.tsv"))[0]
    lines = src.read_text().splitlines(keepends=True)[:3000]
    lines[1234] = "1\t2\tnot-a-row\n"  # physical line 1235
    (data / "bad.tsv").write_text("".join(lines))
    spec = write_spec(
        tmp_path / "job.yaml",
        f"data: {{paths: ['{data}/*.tsv'], batch_size: 512, shard_rows: 1024, eval_fraction: 0.1}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        "resources: {workers: 1, ps: 1}\n",
    )
    # Both runs join the module's head (``--address``): no Ray of their own to start and stop.
    proc = dlrover("run", spec, "--runs-dir", tmp_path / "runs", "--quiet", "--address", ray_head.gcs)
    assert_one_line_error(proc, f"{data / 'bad.tsv'}:1235")
    # on_bad_line: skip trains the rest and reports the skipped line. Without --quiet, but
    # into a pipe, progress comes as lines on stdout, not as a bar's redraws on stderr.
    proc = dlrover("run", spec, "--runs-dir", tmp_path / "runs", "--set", "data.on_bad_line=skip", "--address", ray_head.gcs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr, proc.stderr[-500:]
    assert any(ln.startswith("[dlrover]") and "status=succeeded" in ln for ln in proc.stdout.splitlines()), proc.stdout[-2000:]
    summary = json.loads(Path(proc.stdout.strip().splitlines()[-1].removeprefix("summary: ")).read_text())
    assert summary["bad_lines_skipped"] == 1
    assert summary["samples_lost"] == 0


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head with the dashboard (Ray Jobs) on loopback, stopped when the module's tests end."""
    from dlrover.driver.localhead import LocalHead

    with LocalHead(num_cpus=5) as head:  # the job's 4 CPUs + its dense PS's 0.25
        yield head


def test_submit_through_ray_jobs_from_the_cli_and_from_python(ray_head, tmp_path, synth_dir):
    """``dlrover submit --wait`` follows a job to its end and ``dlrover status`` lists it; a
    ``SubmittedJob`` on it gives Ray Jobs' status and logs and the run directory's result;
    ``dlrover.submit`` of a spec built in Python runs on Ray Jobs until ``stop``."""
    import io

    import dlrover as api

    runs, address = tmp_path / "runs", ray_head.address
    args = ["--set", f"data.paths=['{synth_dir}/*.tsv']", "--set", "data.synth=null", "--set", "model.num_embeddings=5000",
            "--set", "model.dense_arch=[32,16]", "--set", "model.over_arch=[32,1]", "--set", "data.epochs=1"]
    proc = dlrover("submit", "jobs/quickstart.yaml", "--address", address, "--wait", "--runs-dir", runs, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = re.search(r"submitted (\S+)", proc.stdout).group(1)
    summary = json.loads((runs / job_id / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["samples_lost"] == 0
    status = dlrover("status", "--address", address)
    assert status.returncode == 0 and job_id in status.stdout and "SUCCEEDED" in status.stdout

    job = api.SubmittedJob(job_id, address, runs.resolve())
    log = io.StringIO()
    assert job.wait(timeout_s=60, out=log) == "SUCCEEDED" == job.status()
    assert f"[dlrover] {job_id} result" in log.getvalue() and log.getvalue() in job.logs()
    result = job.result()
    assert result.status == "succeeded" and result.samples_trained == result.samples_expected and result.config.workers == 2

    spec = api.JobSpec.from_yaml(ROOT / "jobs" / "quickstart.yaml").with_overrides(
        {"name": "py", "data.paths": [f"{synth_dir}/*.tsv"], "data.synth": None, "data.epochs": 1000, "model.num_embeddings": 5000,
         "model.dense_arch": [32, 16], "model.over_arch": [32, 1], "resources.workers": 1, "resources.ps": 1}
    )  # fmt: skip
    forever = api.submit(spec, address, runs_dir=runs)
    assert forever.job_id.startswith("py-")
    with pytest.raises(TimeoutError, match="still"):
        forever.wait(timeout_s=1)  # the job goes on
    for _ in range(300):
        if "progress=" in forever.logs():
            break  # training: its first progress line
        time.sleep(1)
    assert forever.status() == "RUNNING" and forever.stop()
    assert forever.wait(timeout_s=120) == "STOPPED"
    assert "[dlrover] py-" in forever.logs()


def test_run_joins_a_token_auth_head_by_address_without_ray_auth_mode(tmp_path, synth_dir, monkeypatch):
    """A head from a plain ``ray start --head`` turns token auth on by itself when
    ``~/.ray/auth_token`` exists; ``dlrover run --address`` must send that token although
    RAY_AUTH_MODE is not set where it runs."""
    import urllib.error
    import urllib.request

    from dlrover.driver.localhead import LocalHead

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(16))
    monkeypatch.setenv("HOME", str(home))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    env = {k: v for k, v in ENV.items() if not k.startswith(("RAY_AUTH_", "RAY_ADDRESS"))} | {"HOME": str(home)}
    spec = write_spec(
        tmp_path / "job.yaml",
        f"data: {{paths: ['{sorted(Path(synth_dir).glob('*.tsv'))[0]}'], batch_size: 1024, shard_rows: 4096}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        "resources: {workers: 1, ps: 1}\n",
    )
    with LocalHead(num_cpus=3) as head:  # the job's 2 CPUs + its dense PS's 0.25
        with pytest.raises(urllib.error.HTTPError) as denied:  # the head does check tokens
            urllib.request.urlopen(f"{head.address}/api/jobs/", timeout=30)
        assert denied.value.code in (401, 403)
        proc = subprocess.run(
            [sys.executable, "-m", "dlrover", "run", str(spec), "--address", head.gcs, "--quiet", "--runs-dir", str(tmp_path / "runs")],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    own = "\n".join(line for line in proc.stderr.splitlines() if "(raylet)" not in line and "[state-dump]" not in line)
    assert proc.returncode == 0, proc.stdout[-3000:] + own[-3000:]  # the job's own errors, not Ray's log dump
    summary = json.loads(Path(proc.stdout.strip().splitlines()[-1].removeprefix("summary: ")).read_text())
    assert summary["status"] == "succeeded" and summary["samples_lost"] == 0 and summary["samples_trained"] > 0
