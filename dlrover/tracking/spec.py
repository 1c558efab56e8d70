"""``tracking:`` of a job spec: where the driver records the job for experiment tracking.

Validated with the rest of the spec, without touching the network or the disk (a spec is
also validated where it is only submitted); whether the server answers and the directory
can be written is checked by :func:`dlrover.tracking.trackers` as the job starts.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from dlrover.paths import is_url
from dlrover.spec_base import SpecSection


class TrackingSpec(SpecSection):
    """Off unless set: ``mlflow`` a tracking URI, ``tensorboard`` a log directory (each
    job writes ``<tensorboard>/<job_id>/``), ``experiment`` the MLflow experiment."""

    mlflow: str | None = Field(None, min_length=1, description="an MLflow tracking URI: http(s)://host:port of a tracking server, or what MLflow's client takes (file:./mlruns)")
    tensorboard: str | None = Field(None, min_length=1, description="a local directory: the job's event files go to <tensorboard>/<job_id>/")
    experiment: str | None = Field(None, min_length=1, max_length=500, description="the MLflow experiment the run goes to (default: the job's name); made if missing")

    @field_validator("tensorboard")
    @classmethod
    def _local(cls, v: str | None) -> str | None:
        if v is not None and is_url(v):
            raise ValueError(f"{v}: expected a local directory (the driver writes the event files)")
        return v
