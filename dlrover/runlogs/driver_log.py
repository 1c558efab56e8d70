"""The ``[dlrover]`` lines of a job's driver log: written by ``dlrover.driver.runner``, read back
by ``dlrover status``. One module owns the format both ways.

    [dlrover] <job> progress progress=41.2% samples=... throughput=12,345/s ... config=2w x 1cpu + 2ps x 1cpu
    [dlrover] <job> event t=12.3s scale: scale_out ...
    [dlrover] <job> result status=succeeded auc=0.7705 ... config=...

Fields are ``key=value``; a value may hold spaces (the configuration), as the next
`` key=`` or the line's end ends it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dlrover.runlogs.event_file import config_text, describe_event
from dlrover.runlogs.records import Event, JobSummary

LOG_PREFIX = "[dlrover]"
_LINE = re.compile(re.escape(LOG_PREFIX) + r" (\S+) (progress|event|result) (.*)$")
_FIELD = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def progress_line(job_id: str, p: dict) -> str:
    """``[dlrover] <job> progress=41.2% samples=... throughput=... config=...``: ``key=value``
    fields, the configuration last (it has spaces); ``dlrover.driver.status`` parses these."""
    fields = {
        "progress": f"{100.0 * p['progress']:.1f}%",
        "samples": f"{p['samples_done']:,}/{p['samples_expected']:,}",
        "throughput": f"{p['samples_per_s']:,.0f}/s",
        "loss": f"{p['loss']:.4f}" if p["loss"] is not None else "-",
        "auc": f"{p['auc']:.4f}" if p.get("auc") is not None else "-",
        "ettr": f"{p['ettr']:.3f}" if p.get("ettr") is not None else "-",
        **({"lag": f"{p['lag_rows']:,}rows/{p['lag_s']:.0f}s"} if p.get("lag_rows") is not None else {}),
        "status": p["status"],
        "config": p["config"] or "-",
    }
    return f"{LOG_PREFIX} {job_id} progress " + " ".join(f"{k}={v}" for k, v in fields.items())


def result_line(job_id: str, s: JobSummary) -> str:
    """The job's outcome as the last ``[dlrover]`` line of its log."""
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    fields = {
        "progress": f"{100.0 * s.samples_trained / max(s.samples_expected, 1):.1f}%",
        "status": s.status,
        "auc": num(s.auc, ".4f"),
        "throughput": f"{s.throughput_samples_per_s:,.0f}/s",
        "samples": f"{s.samples_trained:,}/{s.samples_expected:,}",
        "lost": s.samples_lost,
        "ettr": num(s.ettr, ".3f"),
        "wall": f"{s.wall_time_s:.1f}s",
        "config": config_text(s.final_config) if s.final_config else "-",
    }
    return f"{LOG_PREFIX} {job_id} result " + " ".join(f"{k}={v}" for k, v in fields.items())


def event_line(job_id: str, e: Event) -> str:
    """One event of the master's log as ``[dlrover] <job> event t=12.3s <kind>: <what>``."""
    return f"{LOG_PREFIX} {job_id} event t={e.job_s:.1f}s {describe_event(e)}"


@dataclass
class JobLog:
    """What a job's driver log says: the latest progress, the events, the result."""

    progress: dict[str, str] = field(default_factory=dict)
    result: dict[str, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    @property
    def latest(self) -> dict[str, str]:
        return {**self.progress, **self.result}


def parse_log(text: str, job_id: str | None = None) -> JobLog:
    out = JobLog()
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is None or (job_id is not None and m.group(1) != job_id):
            continue
        kind, rest = m.group(2), m.group(3)
        if kind == "event":
            out.events.append(rest)
        else:
            fields = dict(_FIELD.findall(rest))
            if kind == "progress":
                out.progress = fields
            else:
                out.result = fields
    return out
