"""What watches a job from the driver: the progress display and the experiment trackers.

The driver polls the master's progress snapshot and hands each one, and each notable
event in it, to every observer; at the end it hands them the summary and the run
directory. One loop, so the terminal bar, the log lines and the trackers see the same job.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Protocol

from dlrover.runlogs.driver_log import event_line, progress_line, result_line
from dlrover.runlogs.records import Event, JobSummary

LINE_EVERY_S = 5.0  # progress-line period without a bar
PROGRESS_MODES = ("bar", "lines", "none")


class Observer(Protocol):
    """Told of the job as the driver sees it. ``progress``: the master's snapshot
    (``JobMaster.progress``); ``event``: a notable event, once; ``finished``: the summary
    once it is written (``run_dir`` holds summary.json and events.jsonl)."""

    def progress(self, p: dict) -> None: ...

    def event(self, e: Event) -> None: ...

    def finished(self, summary: JobSummary, run_dir: Path) -> None: ...

    def close(self) -> None: ...


class BarProgress:
    """A tqdm bar of samples seen, with the status, configuration, throughput and loss,
    and the notable events written above it. ``tqdm.auto``: a widget in a notebook, a
    text bar on a terminal."""

    def __init__(self, job_id: str) -> None:
        from tqdm.auto import tqdm

        self.job_id = job_id
        self.bar = tqdm(total=None, unit="samples", unit_scale=True, dynamic_ncols=True, file=sys.stderr, desc=job_id)
        self.shown: tuple[int, str] | None = None

    def progress(self, p: dict) -> None:
        if self.bar.total is None and p["samples_expected"]:
            self.bar.total = p["samples_expected"]
        loss = f"{p['loss']:.4f}" if p["loss"] is not None else "-"
        shown = (min(p["samples_seen"], self.bar.total or p["samples_seen"]), f"{p['status']} {p['config'] or '-'} {p['samples_per_s']:,.0f} samples/s loss={loss}")
        if shown != self.shown:  # a redraw only for news: a notebook keeps every redraw
            self.shown = shown
            self.bar.n = shown[0]
            self.bar.set_postfix_str(shown[1], refresh=False)
            self.bar.refresh()

    def event(self, e: Event) -> None:
        self.bar.write(event_line(self.job_id, e), file=sys.stderr)

    def finished(self, summary: JobSummary, run_dir: Path) -> None:
        pass

    def close(self) -> None:
        self.bar.close()


class LineProgress:
    """Plain ``[dlrover]`` lines on stdout for logs (``ray job logs -f``), where a bar would
    be noise: each notable event, the progress every few seconds, the result at the end.
    ``dlrover status`` reads the latest of them back."""

    def __init__(self, job_id: str, every_s: float = LINE_EVERY_S) -> None:
        self.job_id, self.every_s, self.last = job_id, every_s, time.monotonic()

    def progress(self, p: dict) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            print(progress_line(self.job_id, p), flush=True)

    def event(self, e: Event) -> None:
        print(event_line(self.job_id, e), flush=True)

    def finished(self, summary: JobSummary, run_dir: Path) -> None:
        print(result_line(self.job_id, summary), flush=True)

    def close(self) -> None:
        pass


def progress_display(mode: str, job_id: str) -> list[Observer]:
    """The observers of a progress mode: "bar", "lines" or "none"."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress: {mode!r}: expected one of {', '.join(PROGRESS_MODES)}")
    return [BarProgress(job_id)] if mode == "bar" else [LineProgress(job_id)] if mode == "lines" else []
