"""Jobs through Ray Jobs (``JobSubmissionClient``): ``dlrover.submit``, ``dlrover status``.

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
from dlrover.spec import JobSpec

WORKING_DIR_EXCLUDES = [".venv", ".git", "runs", "data", "**/__pycache__", "*.egg-info", ".pytest_cache"]
POLL_S = 1.0
AGENT_WAIT_S = 60.0  # how long a submit waits for a freshly started head's job agent


def client(address: str):
    """A Ray Jobs client that sends the token (a cluster without auth ignores it)."""
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address, headers=auth_headers())
    except Exception as e:  # connection refused, bad URL, auth: one line for the user
        raise DLRoverError(f"cannot reach Ray Jobs at {address}: {str(e).splitlines()[0]}") from None


SPEC_ENV = "DLROVER_SPEC"  # the submitted spec's JSON, in the entrypoint's environment


def submit_job(spec: JobSpec, address: str, runs_dir: str = "runs") -> str:
    """Submit a validated spec to Ray Jobs; returns the job id. The working directory is
    uploaded (the data and code paths the spec names resolve there, as they would here)
    and the spec travels as JSON in the entrypoint's environment."""
    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)  # not a line per packaged file
    from dlrover.driver.runner import new_job_id

    job_id = new_job_id(spec.name)
    cmd = [sys.executable, "-m", "dlrover", "run", "--spec-env", SPEC_ENV, "--quiet", "--job-id", job_id, "--runs-dir", str(Path(runs_dir).resolve())]
    env = {SPEC_ENV: spec.model_dump_json(exclude_unset=True)}
    jobs = client(address)
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            jobs.submit_job(
                entrypoint=shlex.join(cmd),
                submission_id=job_id,
                runtime_env={"working_dir": str(Path.cwd()), "excludes": WORKING_DIR_EXCLUDES, "env_vars": env},
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


def job_metadata(spec: JobSpec, job_id: str, runs_dir: str) -> dict[str, str]:
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
