"""A Ray head on loopback, started and stopped by us: ``dlrover dashboards check`` and tests.

It is a real ``ray start --head`` (dashboard, Ray Jobs, metrics agent) in its own temp
directory and process group, on free ports outside Ray's worker port range, so it never
meets another Ray on the machine; leaving the ``with`` block kills that group and only it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from dlrover.errors import DLRoverError

START_TIMEOUT_S = 120.0


def free_port() -> int:
    """A free loopback port outside Ray's default worker range (10002-19999)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not 10002 <= port <= 19999:
            return port


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen, timeout_s: float, failed: Callable[[str], str]) -> None:
    """Poll ``ready()`` (an exception means "not yet") until it is true; a one-line error,
    worded by ``failed(why)``, when ``proc`` exits first or ``timeout_s`` runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if proc.poll() is not None:
            raise DLRoverError(failed(f"exited with code {proc.returncode}"))
        if time.monotonic() > deadline:
            raise DLRoverError(failed(f"was not ready after {timeout_s:.0f}s"))
        time.sleep(0.5)


class LocalHead:
    """``with LocalHead() as head:`` -- ``head.address`` is the dashboard URL (Ray Jobs),
    ``head.gcs`` the address ``ray.init`` takes, ``head.temp_dir`` Ray's temp directory
    (where it writes ``prom_metrics_service_discovery.json``)."""

    def __init__(self, num_cpus: int = 4, metrics_report_ms: int | None = None) -> None:
        self.num_cpus = num_cpus
        self.metrics_report_ms = metrics_report_ms
        self.proc: subprocess.Popen | None = None
        self.temp_dir = ""
        self.address = ""
        self.gcs = ""
        self.metrics_port = 0

    def __enter__(self) -> "LocalHead":
        ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or "ray"
        self.temp_dir = tempfile.mkdtemp(prefix="dlrover-ray-")
        port, dash, self.metrics_port = free_port(), free_port(), free_port()
        cmd = [
            ray_bin, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--num-cpus={self.num_cpus}",
            "--include-dashboard=true", "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
            # Every agent port free too: a head whose job agent cannot bind answers
            # "No available agent" forever.
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={self.metrics_port}",
            f"--ray-client-server-port={free_port()}",  # 10001 by default: two heads at once would clash
        ]
        if self.metrics_report_ms:
            cmd.append("--system-config=" + json.dumps({"metrics_report_interval_ms": self.metrics_report_ms}))
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR", "RAY_IGNORE_UNHANDLED_ERRORS": "1"}
        env.pop("RAY_ADDRESS", None)
        self.address, self.gcs = f"http://127.0.0.1:{dash}", f"127.0.0.1:{port}"
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self._wait_for_jobs_api()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_for_jobs_api(self) -> None:
        from dlrover.submit import client

        wait_until(
            lambda: client(self.address).list_jobs() is not None, self.proc, START_TIMEOUT_S,
            lambda why: f"the Ray head at {self.address} {why} (logs: {self.temp_dir}/session_latest/logs)",
        )

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)  # `ray start --block` stops its cluster
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            try:  # whatever of the group outlived it
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
