"""``dlrover status [JOB] [--address]``: jobs on a Ray cluster, read over its HTTP API only.

Everything comes from Ray Jobs (``JobSubmissionClient``): the job list, the metadata
``dlrover submit`` attached (model, policy, requested configuration), and the driver log,
whose ``[dlrover] <job> progress|event|result`` lines (``dlrover.driver.runner``) carry the live
configuration, throughput and events. So it works from any machine that reaches the
dashboard, like ``ray job status``; no driver connection to the cluster is needed.
"""

from __future__ import annotations

import time

from dlrover.errors import DLRoverError
from dlrover.runlogs.driver_log import parse_log

RECENT_JOBS = 20  # the list shows (and reads the logs of) at most this many, newest first
LAST_EVENTS = 10


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((ms or 0) / 1000)) if ms else "-"


def _status(job) -> str:
    return str(job.status).split(".")[-1]


def _job_id(job) -> str:
    return job.submission_id or job.job_id or "-"


def status(address: str, job: str | None = None, events: int = LAST_EVENTS) -> int:
    from dlrover.driver.submit import client

    jobs = client(address)
    try:
        listed = sorted(jobs.list_jobs(), key=lambda j: j.start_time or 0, reverse=True)
    except Exception as e:  # noqa: BLE001 - HTTP/auth errors: one line
        raise DLRoverError(f"cannot list jobs at {address}: {str(e).strip().splitlines()[0]}") from None
    if job is not None:
        found = [j for j in listed if job in (j.submission_id, j.job_id)]
        if not found:
            raise DLRoverError(f"no job {job!r} at {address} (dlrover status --address {address} lists them)")
        return _detail(jobs, found[0], events)
    if not listed:
        print(f"no jobs at {address}")
        return 0
    print(f"{'JOB':<40} {'STATUS':<10} {'STARTED':<19} {'POLICY':<10} {'PROGRESS':>8} {'THROUGHPUT':>12}  CONFIGURATION")
    for j in listed[:RECENT_JOBS]:
        meta = j.metadata or {}
        log = parse_log(_logs(jobs, j), _job_id(j)).latest
        print(
            f"{_job_id(j):<40} {_status(j):<10} {_when(j.start_time):<19} {meta.get('policy', '-'):<10} "
            f"{log.get('progress', '-'):>8} {log.get('throughput', '-'):>12}  {log.get('config', meta.get('requested', '-'))}"
        )
    if len(listed) > RECENT_JOBS:
        print(f"... and {len(listed) - RECENT_JOBS} older jobs")
    return 0


def _logs(jobs, job) -> str:
    try:
        return jobs.get_job_logs(_job_id(job))
    except Exception:  # noqa: BLE001 - a job without a driver log yet
        return ""


def _detail(jobs, job, events: int) -> int:
    meta = job.metadata or {}
    log = parse_log(_logs(jobs, job), _job_id(job))
    cur = log.latest
    rows = [
        ("job", _job_id(job)),
        ("status", _status(job) + (f" (dlrover: {cur['status']})" if cur.get("status") else "")),
        ("started", _when(job.start_time) + (f", ended {_when(job.end_time)}" if job.end_time else "")),
        ("model", meta.get("model", "-")),
        ("policy", meta.get("policy", "-")),
        ("requested", meta.get("requested", "-")),
        ("configuration", cur.get("config", "-")),
        ("progress", f"{cur.get('progress', '-')} of samples ({cur.get('samples', '-')})"),
        ("throughput", f"{cur['throughput'].removesuffix('/s')} samples/s" if cur.get("throughput") else "-"),
        ("loss / auc", f"{cur.get('loss', '-')} / {cur.get('auc', '-')}"),
        ("ettr", cur.get("ettr", "-")),
    ]
    if log.result:
        rows.append(("result", f"{log.result.get('status')}: auc {log.result.get('auc')}, {log.result.get('samples')} samples, lost {log.result.get('lost')}, wall {log.result.get('wall')}"))
    if meta.get("runs_dir"):
        run_dir = f"{meta['runs_dir']}/{_job_id(job)}"
        rows += [("run directory", run_dir), ("report", f"dlrover report {run_dir}")]
    if job.message and _status(job) != "SUCCEEDED":
        rows.append(("message", job.message.strip().splitlines()[-1][:200]))
    for k, v in rows:
        print(f"{k + ':':<15}{v}")
    shown = log.events[-events:] if events > 0 else []
    print(f"last events ({len(shown)} of {len(log.events)}):" if log.events else "last events: none yet")
    for e in shown:
        print(f"  {e}")
    return 0
