"""Run deploy/kuberay/rayjob.yaml's entrypoint the way KubeRay does, on a local Ray head.

KubeRay's submitter runs ``ray job submit --address <head>:8265 -- <entrypoint>``; this
does the same through Ray Jobs against a real ``ray start --head`` on loopback
(``dlrover.driver.localhead``), with the image's paths mapped to this checkout
(/opt/venv/bin/python -> this interpreter, /home/ray/dlrover-ray -> the repo root,
/mnt/shared -> a temp dir) and a smaller data set. It checks the job succeeds, writes
its summary under the "shared" runs dir, and that the head's metrics port serves
ray_dlrover_* metrics; the temp dir is removed when it passes. No Kubernetes is involved: one node, no image, no KubeRay.

    .venv/bin/python deploy/smoke_rayjob_locally.py [--rows 60000]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dlrover.driver.localhead import LocalHead
from dlrover.driver.submit import client

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=60_000, help="synthetic rows (the spec's 2M take minutes on 2 cores)")
    ap.add_argument("--timeout-s", type=float, default=500.0)
    args = ap.parse_args()
    shared = Path(tempfile.mkdtemp(prefix="dlrover-shared-"))
    entrypoint = yaml.safe_load((ROOT / "deploy/kuberay/rayjob.yaml").read_text())["spec"]["entrypoint"]
    entrypoint = (
        entrypoint.replace("/opt/venv/bin/python", sys.executable).replace("/home/ray/dlrover-ray", str(ROOT)).replace("/mnt/shared", str(shared))
        + f" --set data.synth.rows={args.rows}"
    )
    print(f"entrypoint: {entrypoint}", flush=True)
    metrics: set[str] = set()
    with LocalHead(num_cpus=5, metrics_report_ms=1000) as head:  # the job's 4 CPUs + its dense PS's 0.25
        jobs = client(head.address)
        sid = jobs.submit_job(entrypoint=entrypoint, metadata={"name": "quickstart", "policy": "static"})
        deadline = time.monotonic() + args.timeout_s
        while (status := str(jobs.get_job_status(sid)).split(".")[-1]) not in TERMINAL and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{head.metrics_port}/metrics", timeout=5).read().decode()
                metrics |= set(re.findall(r"^(ray_dlrover_\w+)", body, re.MULTILINE))
            except OSError:
                pass
            time.sleep(2)
        if status not in TERMINAL:
            jobs.stop_job(sid)
        logs = jobs.get_job_logs(sid)
    print("\n".join(logs.splitlines()[-6:]))
    summaries = list((shared / "runs").glob("*/summary.json"))
    ok = status == "SUCCEEDED" and len(summaries) == 1 and json.loads(summaries[0].read_text())["samples_lost"] == 0
    print(f"ray job {sid}: {status}; summary: {summaries[0] if summaries else 'none'}")
    print(f"metrics served on the head's metrics port: {len(metrics)} ray_dlrover_* ({', '.join(sorted(metrics)[:4])}, ...)")
    ok = ok and "ray_dlrover_throughput_samples_per_s" in metrics
    if ok:
        shutil.rmtree(shared, ignore_errors=True)
    print("smoke: ok" if ok else f"smoke: FAILED (data and runs kept in {shared})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
