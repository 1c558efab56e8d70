"""``dlrover submit`` / ``dlrover status``: jobs through Ray Jobs (``JobSubmissionClient``).

The spec is validated here first, so a bad spec fails on the user's terminal and not
minutes later in a cluster log. The entrypoint runs ``<this python> -m dlrover run``:
Ray Jobs runs entrypoints with the PATH ``ray start`` saw, so a bare ``python`` may be
another interpreter. The job id doubles as the Ray Jobs submission id, so the Ray
dashboard, ``dlrover status`` and ``runs/<job_id>/`` all use the same name.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

from dlrover.errors import DLRoverError
from dlrover.driver.rayauth import auth_headers

WORKING_DIR_EXCLUDES = [".venv", ".git", "runs", "data", "**/__pycache__", "*.egg-info", ".pytest_cache"]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
POLL_S = 1.0
AGENT_WAIT_S = 60.0  # how long a submit waits for a freshly started head's job agent


def client(address: str):
    """A Ray Jobs client that sends the token (a cluster without auth ignores it)."""
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address, headers=auth_headers())
    except Exception as e:  # connection refused, bad URL, auth: one line for the user
        raise DLRoverError(f"cannot reach Ray Jobs at {address}: {str(e).splitlines()[0]}") from None


def submit(spec_path: str, address: str, overrides: list[str], wait: bool = False, runs_dir: str = "runs") -> int:
    """``dlrover submit``: submit, then follow the logs to the end when ``wait``."""
    job_id = submit_job(spec_path, address, overrides, runs_dir)
    print(f"submitted {job_id} to {address}")
    if not wait:
        print(f"follow with: ray job logs -f {job_id} --address {address}")
        print(f"status with: dlrover status {job_id} --address {address}")
        return 0
    return follow(client(address), job_id)


def submit_job(spec_path: str, address: str, overrides: list[str], runs_dir: str = "runs") -> str:
    """Validate the spec here and submit it to Ray Jobs; returns the job id."""
    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)  # not a line per packaged file
    from dlrover.driver.runner import new_job_id
    from dlrover.spec import load_spec, parse_overrides

    spec = load_spec(spec_path, parse_overrides(overrides))
    workdir = Path.cwd()
    spec_abs = Path(spec_path).resolve()
    try:
        spec_rel = spec_abs.relative_to(workdir)
    except ValueError:
        raise DLRoverError(f"{spec_path}: the spec must be inside the working directory {workdir} (it is uploaded)") from None
    job_id = new_job_id(spec.name)
    cmd = [sys.executable, "-m", "dlrover", "run", str(spec_rel), "--quiet", "--job-id", job_id, "--runs-dir", str(Path(runs_dir).resolve())]
    for item in overrides:
        cmd += ["--set", item]
    jobs = client(address)
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            jobs.submit_job(
                entrypoint=shlex.join(cmd),
                submission_id=job_id,
                runtime_env={"working_dir": str(workdir), "excludes": WORKING_DIR_EXCLUDES},
                metadata=job_metadata(spec, job_id, runs_dir),
            )
            break
        except (RuntimeError, ValueError, OSError) as e:  # upload too large, HTTP errors, ...
            # A head that has just started answers HTTP before its job agent is up.
            if "No available agent" in str(e) and time.monotonic() < deadline:
                time.sleep(POLL_S)
                continue
            raise DLRoverError(f"submit to {address} failed: {str(e).strip().splitlines()[0]}") from None
    return job_id


def job_metadata(spec, job_id: str, runs_dir: str) -> dict[str, str]:
    """Ray Jobs metadata (strings only), shown in the Ray dashboard and by ``dlrover status``."""
    from dlrover.resource.configs import Config

    return {
        "dlrover_job": job_id,
        "name": spec.name,
        "model": spec.model_short(),
        "policy": spec.policy.name,
        "requested": Config.from_resources(spec.resources).short(),
        "runs_dir": str(Path(runs_dir).resolve()),
    }


def follow(client, job_id: str, out=sys.stdout, timeout_s: float | None = None) -> int:
    """Print the job's log as it grows (to ``out``; None: silently) until it ends; 0 if it
    succeeded. After ``timeout_s`` the job is stopped and this returns 1."""
    printed = 0
    deadline = time.monotonic() + timeout_s if timeout_s is not None else None
    while True:
        if deadline is not None and time.monotonic() > deadline:
            client.stop_job(job_id)
            print(f"job {job_id}: still running after {timeout_s:.0f}s, stopped", file=sys.stderr)
            return 1
        status = str(client.get_job_status(job_id)).split(".")[-1]
        logs = client.get_job_logs(job_id)
        if len(logs) > printed and out is not None:
            out.write(logs[printed:])
            out.flush()
            printed = len(logs)
        if status in TERMINAL:
            if out is not None:
                print(f"job {job_id}: {status}", file=out)
            return 0 if status == "SUCCEEDED" else 1
        time.sleep(POLL_S)
