"""What every bench prints while a job of it runs: a line on stderr every few seconds
(stdout stays clean for ``--json``)."""

from __future__ import annotations

import sys
import time


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
