"""The MLflow sink: one MLflow run per job (named after the job id), written through
MLflow's client (``mlflow-skinny``) to a tracking server or anything its URI names.

The run is made before the job starts, so that a URI that does not answer, an experiment
that cannot be used or a missing client is a one-line error while nothing has trained
yet. After that every call runs on the tracker's thread (``dlrover.tracking.tracker``),
where a failure turns the tracker off instead of ending the job.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

from dlrover.errors import DLRoverError
from dlrover.runlogs.records import Event, JobSummary

# MLflow's defaults (7 retries with exponential backoff, 120 s timeouts) would keep a dead
# server's tracker busy for minutes after the job; set only where the user set nothing.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
PROBE_TIMEOUT_S = 5.0
BATCH = 100  # MLflow's most params (and tags) a log_batch call takes
MAX_PARAM_CHARS, MAX_TAG_CHARS = 6000, 8000  # MLflow's longest param and tag values
RUN_FILES = ("spec.json", "summary.json", "events.jsonl", "report.html")  # uploaded when present, with model/
RUN_STATUS = {"succeeded": "FINISHED", "stopped": "KILLED"}  # any other end: FAILED


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [e.__class__.__name__])[0][:300]


def check_reachable(uri: str) -> None:
    """A one-line DLRoverError unless something answers HTTP at an ``http(s)://`` URI
    (any status counts: an auth layer's refusal is for the client to word). Other URIs
    (``file:``, ``databricks``) are left to the client."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or first_line(e)
        raise DLRoverError(f"tracking.mlflow: {uri}: cannot reach the MLflow server ({reason}); start it, fix the URI or set tracking.mlflow: null") from None


def truncated(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MlflowSink:
    """Params, metrics (step: samples trained), one tag per tagged event
    (``event.007.scale``), and at the end the run's files as artifacts and the run's
    status (``FINISHED``, ``KILLED`` when stopped, ``FAILED``)."""

    name = "mlflow"

    def __init__(self, uri: str, experiment: str, job_id: str) -> None:
        for key, value in CLIENT_ENV.items():
            os.environ.setdefault(key, value)
        check_reachable(uri)
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise DLRoverError("tracking.mlflow: needs MLflow's client: pip install 'dlrover-ray[tracking]' (mlflow-skinny)") from None
        self.Metric, self.Param = Metric, Param
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = self._experiment(uri, experiment)
        try:
            run = self.client.create_run(experiment_id, run_name=job_id, tags={"dlrover.job_id": job_id})
        except Exception as e:  # noqa: BLE001 - the client's errors (MlflowException, requests') as one line
            raise DLRoverError(f"tracking.mlflow: {uri}: cannot start a run: {first_line(e)}") from None
        self.run_id: str = run.info.run_id
        self.tagged = 0

    def _experiment(self, uri: str, name: str) -> str:
        """The experiment's id, made if missing (or by another job meanwhile)."""
        try:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                try:
                    return self.client.create_experiment(name)
                except Exception:  # noqa: BLE001 - made meanwhile? else the lookup below says why
                    found = self.client.get_experiment_by_name(name)
        except Exception as e:  # noqa: BLE001
            raise DLRoverError(f"tracking.mlflow: {uri}: experiment {name!r}: {first_line(e)}") from None
        if found is None:
            raise DLRoverError(f"tracking.mlflow: {uri}: cannot make experiment {name!r}")
        if found.lifecycle_stage == "deleted":
            raise DLRoverError(f"tracking.experiment: {name!r} is deleted on {uri}: restore it or name another")
        return found.experiment_id

    def params(self, params: Mapping[str, str]) -> None:
        items = [self.Param(k, truncated(v, MAX_PARAM_CHARS)) for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + BATCH], synchronous=True)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.Metric(k, v, now_ms, step) for k, v in values.items()], synchronous=True)

    def event(self, step: int, e: Event, text: str) -> None:
        self.tagged += 1
        self.client.set_tag(self.run_id, f"event.{self.tagged:03d}.{e.kind}", truncated(f"samples={step:,} {text}", MAX_TAG_CHARS), synchronous=True)

    def end(self, summary: JobSummary | None, run_dir: Path | None) -> None:
        if summary is None or run_dir is None:
            self.client.set_terminated(self.run_id, "FAILED")
            return
        self.client.set_tag(self.run_id, "dlrover.status", summary.status, synchronous=True)
        if summary.reason:
            self.client.set_tag(self.run_id, "dlrover.reason", truncated(summary.reason, MAX_TAG_CHARS), synchronous=True)
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(run_dir / name))
        if (run_dir / "model").is_dir():
            self.client.log_artifacts(self.run_id, str(run_dir / "model"), "model")
        self.client.set_terminated(self.run_id, RUN_STATUS.get(summary.status, "FAILED"))
