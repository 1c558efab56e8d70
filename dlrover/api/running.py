"""``dlrover.run``: train a spec from Python, as ``dlrover run`` does from a shell."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from dlrover.api.result import JobResult
from dlrover.driver.observers import Observer
from dlrover.spec import JobSpec


def as_spec(spec: JobSpec | str | Path) -> JobSpec:
    """A spec given as itself or as the path of its YAML."""
    return spec if isinstance(spec, JobSpec) else JobSpec.from_yaml(spec)


def run(
    spec: JobSpec | str | Path,
    *,
    address: str | None = None,
    runs_dir: str | Path = "runs",
    progress: str = "bar",
    job_id: str | None = None,
    dashboard: bool = False,
    observers: Sequence[Observer] = (),
    dataset: Any = None,
) -> JobResult:
    """Train ``spec`` (a ``JobSpec`` or a YAML path) to the end and return its result.

    Ray: the cluster this process already joined (``ray.init`` was called), else the one
    at ``address``, else an embedded local Ray on 127.0.0.1, shut down at the end.
    ``progress``: "bar" (a ``tqdm.auto`` bar), "lines" (log
    lines) or "none". ``observers`` are told of the job as it runs
    (:class:`dlrover.driver.observers.Observer`). ``dataset``: a ``ray.data.Dataset``
    whose columns follow the spec's features, trained from instead of the spec's files
    (streamed, never materialised; docs/DATA.md). The run's files go to
    ``runs_dir/<job_id>/``. Bad input raises a one-line ``DLRoverError`` subclass before
    anything is written; a job that fails returns a result whose ``status`` says so.
    """
    from dlrover.driver.runner import run_job

    _, path = run_job(
        as_spec(spec), runs_dir=str(runs_dir), address=address, progress=progress, dashboard=dashboard, job_id=job_id, observers=observers,
        dataset=dataset,
    )
    return JobResult.load(path.parent)
