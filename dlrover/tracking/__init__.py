"""Experiment tracking of a job from the driver: MLflow and TensorBoard, as observers of
``dlrover.driver.runner.run_job`` (``tracking:`` in the spec, :class:`TrackingSpec`).

Nothing here is imported by ``dlrover.spec`` but :mod:`dlrover.tracking.spec`, and the
sinks import their client libraries only when the spec asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrover.tracking.spec import TrackingSpec

if TYPE_CHECKING:
    from dlrover.driver.observers import Observer
    from dlrover.spec import JobSpec

__all__ = ["TrackingSpec", "trackers"]


def trackers(spec: JobSpec, job_id: str) -> list[Observer]:
    """The observers ``spec.tracking`` asks for (none by default), each with its run made:
    a server that does not answer, a directory that cannot be written or a missing client
    package is a one-line ``DLRoverError`` here, before the job starts. ``spec``: the
    resolved spec, whose every field is logged as a param."""
    from dlrover.tracking.mapping import flat_params
    from dlrover.tracking.tracker import Sink, Tracker

    t = spec.tracking
    sinks: list[Sink] = []
    if t.tensorboard is not None:  # first: it only checks, the MLflow run is made last
        from dlrover.tracking.tensorboard_tracker import TensorBoardSink

        sinks.append(TensorBoardSink(t.tensorboard, job_id))
    if t.mlflow is not None:
        from dlrover.tracking.mlflow_tracker import MlflowSink

        sinks.append(MlflowSink(t.mlflow, t.experiment or spec.name, job_id))
    params = flat_params(spec.model_dump(mode="json"))
    return [Tracker(s, job_id, params, spec.train.log_every_s) for s in sinks]
