"""A Ray head on loopback, started and stopped by us: ``dlrover dashboards check`` and tests.

It is a real ``ray start --head`` (dashboard, Ray Jobs, metrics agent) in its own temp
directory and process group, on free ports outside Ray's worker port range, so it never
meets another Ray on the machine; leaving the ``with`` block kills that group and only it.
"""

from __future__ import annotations

import json
import os
import random
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


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for ``bind(0)`` (Linux default 32768-60999)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_RNG = random.SystemRandom()  # not the module's: a seeded or forked random would repeat ports
_given: set[int] = set()  # ports this process handed out: the next head must not get them too


def free_port() -> int:
    """A free loopback port in 20000-65535 outside the kernel's ephemeral range (and so
    above Ray's worker ports, 10002-19999), never one this process handed out before. A
    port the kernel picked for us could be handed to one of Ray's own processes (they
    bind port 0) before the agent binds it; the agent then serves no HTTP and Ray Jobs
    answers "No available agent" for ever."""
    low, high = ephemeral_range()
    for _ in range(200):
        port = _RNG.randint(20000, 65535)
        if low <= port <= high or port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise DLRoverError(f"no free loopback port in 20000-65535 outside the ephemeral range {low}-{high}")


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
        self._died = False  # the last start failed because the head's process exited

    def __enter__(self) -> "LocalHead":
        """Start the head. A head that dies while it starts is started once more: on a busy
        machine Ray's dashboard agent can die before it registers, and the raylet with it
        (a transient failure Ray knows of, ray-project/ray#42514); a second death is the error."""
        try:
            return self._start()
        except DLRoverError:
            if not self._died:
                raise
        return self._start()

    def _start(self) -> "LocalHead":
        self._died = False
        ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or "ray"
        self.temp_dir = tempfile.mkdtemp(prefix="dlrover-ray-")
        port, dash, agent, self.metrics_port = free_port(), free_port(), free_port(), free_port()
        cmd = [
            ray_bin, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--num-cpus={self.num_cpus}",
            "--include-dashboard=true", "--disable-usage-stats", f"--temp-dir={self.temp_dir}",
            # Every agent port free too: a head whose job agent cannot bind answers
            # "No available agent" forever.
            f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={self.metrics_port}",
            f"--ray-client-server-port={free_port()}",  # 10001 by default: two heads at once would clash
        ]
        if self.metrics_report_ms:
            cmd.append("--system-config=" + json.dumps({"metrics_report_interval_ms": self.metrics_report_ms}))
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR", "RAY_IGNORE_UNHANDLED_ERRORS": "1"}
        env.pop("RAY_ADDRESS", None)
        self.address, self.gcs = f"http://127.0.0.1:{dash}", f"127.0.0.1:{port}"
        try:
            with open(os.path.join(self.temp_dir, "head.out"), "wb") as out:  # `ray start`'s own words, for a failed start
                self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self._wait_for_jobs_api(agent)
        except BaseException:
            self._died = self.proc is not None and self.proc.poll() is not None
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_for_jobs_api(self, agent_port: int) -> None:
        """Ray Jobs submits through the head node's dashboard agent, which comes up after
        the dashboard: wait for both."""
        import urllib.request

        from dlrover.driver.submit import client

        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through http_proxy

        def ready() -> bool:
            with direct.open(f"http://127.0.0.1:{agent_port}/api/healthz", timeout=5) as r:
                return r.status == 200 and client(self.address).list_jobs() is not None

        wait_until(
            ready, self.proc, START_TIMEOUT_S,
            lambda why: f"the Ray head at {self.address} {why}{self._last_words()}",
        )

    def _last_words(self) -> str:
        """The last line of ``ray start``'s output that says something went wrong (its logs
        go with the temp directory when the head stops)."""
        try:
            lines = [ln.strip() for ln in open(os.path.join(self.temp_dir, "head.out"), errors="replace") if ln.strip()]
        except OSError:
            return ""
        bad = [ln for ln in lines if any(w in ln for w in ("ERROR", "Error", "error", "exited", "died", "failed"))]
        return f": {(bad or lines or [''])[-1][:300]}" if lines else ""

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                # `ray start --block` stops its cluster in order on SIGTERM (2-3 s). Not the
                # whole group at once: a GCS told to stop with its raylet lingers ~30 s.
                self.proc.terminate()
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
