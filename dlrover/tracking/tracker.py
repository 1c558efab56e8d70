"""A tracker: an observer of the driver (``dlrover.driver.observers.Observer``) that writes
the job to a sink (MLflow, TensorBoard) on a thread of its own.

The driver's loop only queues: a slow or unreachable tracking server never holds up the
progress display or the polling of the master. The first call of a sink that raises turns
that tracker off with one warning line; the job goes on, and its run directory keeps
everything the tracker would have sent.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from dlrover.runlogs.records import Event, JobSummary
from dlrover.tracking.mapping import TAGGED_EVENTS, Windows, event_key, event_metrics, event_text, samples_trained, summary_metrics, window_metrics


class Sink(Protocol):
    """Where a tracker writes. ``name``: for its warning line; ``end``: the job is over
    (``summary`` None when it ended without one: an error, an interrupt)."""

    name: str

    def params(self, params: Mapping[str, str]) -> None: ...

    def metrics(self, step: int, values: Mapping[str, float]) -> None: ...

    def event(self, step: int, e: Event, text: str) -> None: ...

    def end(self, summary: JobSummary | None, run_dir: Path | None) -> None: ...


class Background:
    """Runs calls in order on a daemon thread; the first one that raises is reported on
    stderr in one line and the rest are dropped."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.failed: str | None = None
        self.calls: queue.Queue[tuple[Callable[..., Any], tuple] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._drain, name=f"dlrover-{label}", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.failed is None:
            self.calls.put((fn, args))

    def _drain(self) -> None:
        while (call := self.calls.get()) is not None:
            if self.failed is not None:
                continue
            fn, args = call
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - whatever a sink raises, the job goes on
                first = (str(e).strip().splitlines() or [""])[0][:300]
                self.failed = f"{e.__class__.__name__}: {first}"
                print(f"[dlrover] {self.label}: {self.failed}; tracking off, the job goes on", file=sys.stderr, flush=True)

    def join(self) -> None:
        """Wait for what was queued (each call bounded by the sink's own timeouts)."""
        self.calls.put(None)
        self.thread.join()


class Tracker:
    """Turns the driver's view of a job into a sink's params, metrics and tagged events:
    the resolved spec once; a window of the progress every ``every_s``; an evaluation's
    AUC and log loss at the samples trained when the driver saw it (the final one, and
    those it never saw, at the summary's ``samples_trained``: the driver's last progress
    may predate the last steps); scale events and failures
    as tagged events; the totals and the run directory at the end."""

    def __init__(self, sink: Sink, job_id: str, params: Mapping[str, str], every_s: float) -> None:
        self.sink, self.windows, self.step = sink, Windows(every_s), 0
        self.seen: set[tuple[float, str]] = set()
        self.worker = Background(f"{job_id} tracking: {sink.name}")
        self.worker.submit(sink.params, dict(params))
        self.ended = False

    @property
    def failed(self) -> str | None:
        """Why the sink was turned off, if it was."""
        return self.worker.failed

    def progress(self, p: dict) -> None:
        self.step = samples_trained(p)
        if self.windows.due(p, time.monotonic()):
            self.worker.submit(self.sink.metrics, self.step, window_metrics(p))

    def event(self, e: Event) -> None:
        if e.kind == "eval" and e.fields.get("final"):
            return  # recorded by finished(), at the summary's samples_trained
        self.seen.add(event_key(e))
        self.record(self.step, e)

    def record(self, step: int, e: Event) -> None:
        if metrics := event_metrics(e):
            self.worker.submit(self.sink.metrics, step, metrics)
        elif e.kind in TAGGED_EVENTS:
            self.worker.submit(self.sink.event, step, e, event_text(e))

    def finished(self, summary: JobSummary, run_dir: Path) -> None:
        for e in summary.events:
            if event_key(e) not in self.seen:
                self.record(summary.samples_trained, e)
        self.worker.submit(self.sink.metrics, summary.samples_trained, summary_metrics(summary))
        self.worker.submit(self.sink.end, summary, run_dir)
        self.ended = True

    def close(self) -> None:
        if not self.ended:
            self.worker.submit(self.sink.end, None, None)
        self.worker.join()
