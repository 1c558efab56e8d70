"""How a bench runs one of its jobs: a progress line on stderr every few seconds (stdout
stays clean for ``--json``), and one error line naming the bench if the job fails."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from dlrover.errors import DLRoverError
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import Event, JobSummary
from dlrover.spec import JobSpec


class JobProgress:
    """A ``run_job(stop_when=...)`` callback that reports and never stops the job."""

    def __init__(self, name: str, every_s: float = 10.0) -> None:
        self.name, self.every_s = name, every_s
        self.t0 = time.monotonic()
        self.last = -every_s

    def __call__(self, p: dict) -> bool:
        now = time.monotonic() - self.t0
        if now - self.last >= self.every_s:
            self.last = now
            pct = 100.0 * p.get("samples_done", 0) / max(p.get("samples_expected") or 1, 1)
            print(f"[bench]   {self.name}: {now:4.0f}s elapsed, {p.get('status')}, {pct:3.0f}% trained, {p.get('config') or ''}", file=sys.stderr, flush=True)
        return False


def bench_data(name: str) -> str:
    """Where a bench keeps its generated data between runs: ``$DLROVER_BENCH_DATA/name``
    (default: ``dlrover-bench-data`` in the temp directory)."""
    return os.path.join(os.environ.get("DLROVER_BENCH_DATA", os.path.join(tempfile.gettempdir(), "dlrover-bench-data")), name)


def run_bench_job(spec: JobSpec, runs_dir: str, label: str, bench: str) -> tuple[JobSummary, list[Event]]:
    """Run one of a bench's jobs, reporting progress: its summary and events. A failed or
    unsuccessful run is one error naming the bench and the run's ``label``."""
    from dlrover.driver.runner import run_job

    try:
        doc, path = run_job(spec, runs_dir=runs_dir, progress="none", stop_when=JobProgress(label))
    except DLRoverError as e:
        raise DLRoverError(f"bench {bench}: the {label} run failed: {e}") from None
    summary = JobSummary.from_json(doc)
    if summary.status != "succeeded":
        raise DLRoverError(f"bench {bench}: the {label} run ended {summary.status} (summary: {path})")
    events = [e for _, e in read_events(Path(path).parent / "events.jsonl")]
    return summary, events
