"""The TensorBoard sink: the job's event files in ``<tracking.tensorboard>/<job_id>/``
(one directory per run, as TensorBoard lists runs), written by torch's ``SummaryWriter``
(which needs the ``tensorboard`` package)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dlrover.errors import DLRoverError
from dlrover.paths import check_creatable_dir
from dlrover.runlogs.records import Event, JobSummary


def params_table(params: Mapping[str, str]) -> str:
    """The params as a markdown table (TensorBoard's text tab renders markdown)."""
    rows = "\n".join(f"| {k} | {v.replace('|', '/')} |" for k, v in params.items())
    return f"| param | value |\n|---|---|\n{rows}"


class TensorBoardSink:
    """Scalars by the mapping's names (step: samples trained); the params as a text
    table; each tagged event as text under ``events/<kind>``; the job's end status as
    text under ``status``."""

    name = "tensorboard"
    writer: Any  # the SummaryWriter, made by params()

    def __init__(self, log_dir: str, job_id: str) -> None:
        check_creatable_dir(log_dir, "tracking.tensorboard")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise DLRoverError("tracking.tensorboard: needs the tensorboard package: pip install 'dlrover-ray[tracking]'") from None
        self.log_dir = Path(log_dir).expanduser() / job_id
        self.make_writer = SummaryWriter

    def params(self, params: Mapping[str, str]) -> None:
        """The tracker's first call makes the event file, not ``__init__``: a setup that
        fails after it (the MLflow run) leaves no empty TensorBoard run behind."""
        self.writer = self.make_writer(log_dir=str(self.log_dir))
        self.writer.add_text("params", params_table(params), global_step=0)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)

    def event(self, step: int, e: Event, text: str) -> None:
        self.writer.add_text(f"events/{e.kind}", text, global_step=step)

    def end(self, summary: JobSummary | None, run_dir: Path | None) -> None:
        if summary is not None:
            reason = f": {summary.reason}" if summary.reason else ""
            self.writer.add_text("status", f"{summary.status}{reason}", global_step=summary.samples_trained)
        self.writer.close()
