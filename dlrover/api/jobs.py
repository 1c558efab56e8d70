"""``dlrover.submit``: a spec to a Ray cluster through Ray Jobs, and a handle on the job."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dlrover.api.result import JobResult
from dlrover.api.running import as_spec
from dlrover.spec import JobSpec

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
POLL_S = 1.0


@dataclass
class SubmittedJob:
    """A job submitted to Ray Jobs; its id is also its Ray Jobs submission id and its run
    directory's name (``runs_dir/<job_id>``, where the cluster writes its files)."""

    job_id: str
    address: str
    runs_dir: Path

    def _client(self) -> Any:
        from dlrover.driver.submit import client

        return client(self.address)

    def status(self) -> str:
        """Ray Jobs' status: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
        return self._client().get_job_status(self.job_id).value

    def logs(self) -> str:
        """The entrypoint's output so far: ``[dlrover]`` progress, event and result lines."""
        return self._client().get_job_logs(self.job_id)

    def wait(self, timeout_s: float | None = None, out: TextIO | None = None) -> str:
        """Until the job ends; its final status. ``out``: the log is written there as it
        grows. Past ``timeout_s`` a ``TimeoutError`` (the job goes on: ``stop()`` ends it)."""
        jobs, printed = self._client(), 0
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = jobs.get_job_status(self.job_id).value
            if out is not None:
                logs = jobs.get_job_logs(self.job_id)
                out.write(logs[printed:])
                out.flush()
                printed = len(logs)
            if status in TERMINAL:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id}: still {status} after {timeout_s:.0f}s")
            time.sleep(POLL_S)

    def stop(self) -> bool:
        """Ask Ray Jobs to stop the job (the master stops its actors); False if it had ended."""
        return bool(self._client().stop_job(self.job_id))

    def result(self) -> JobResult:
        """The finished job's result, read from ``runs_dir/<job_id>`` (a local head, or a
        runs directory the cluster and this machine share)."""
        return JobResult.load(self.runs_dir / self.job_id)


def submit(spec: JobSpec | str | Path, address: str = "http://127.0.0.1:8265", *, runs_dir: str | Path = "runs") -> SubmittedJob:
    """Submit ``spec`` (a ``JobSpec`` or a YAML path), validated here first, to the Ray
    cluster whose dashboard is at ``address``; the current directory is uploaded as the
    job's working directory. Returns at once with a handle on the job."""
    from dlrover.driver.submit import submit_job

    job_id = submit_job(as_spec(spec), address, str(runs_dir))
    return SubmittedJob(job_id, address, Path(runs_dir).resolve())
