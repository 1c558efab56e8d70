"""A real MLflow tracking server for the tests: ``mlflow server`` of ``.venv-mlflow`` (which
``scripts/install.sh`` makes: the full package cannot share ``.venv``'s pyarrow) on a free
loopback port, in a process group of its own that the test stops."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLFLOW_VENV = Path(os.environ.get("MLFLOW_VENV", ROOT / ".venv-mlflow"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(root: Path) -> tuple[str, subprocess.Popen]:
    """``mlflow server`` of .venv-mlflow on a free loopback port: runs in SQLite, artifacts
    proxied to a local directory (the client uploads them over HTTP)."""
    exe = MLFLOW_VENV / "bin" / "mlflow"
    if not exe.exists():
        pytest.skip(f"{exe}: no MLflow server (scripts/install.sh makes .venv-mlflow)")
    root.mkdir(parents=True, exist_ok=True)
    uri = f"http://127.0.0.1:{free_port()}"
    args = ["server", "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1], "--workers", "1"]
    args += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")]
    log = open(root / "server.log", "w")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner processes: a plain tracking server
    proc = subprocess.Popen([str(exe), *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 240  # ~25 s on 2 idle cores
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited {proc.returncode}: {(root / 'server.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            return uri, proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"mlflow server not up after 240 s: {(root / 'server.log').read_text()[-2000:]}")


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """The server and the workers it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
