"""``dlrover bench serve``: scoring latency of ``dlrover serve`` at a fixed request rate
on loopback while new versions are applied, and the same load against the same scoring
in Ray Serve (when ``ray[serve]`` is installed): the measurement behind
docs/decisions/serve-with-fastapi.md.

Versions are published without a job (``publish_version`` on PS payloads of a known
state, as the master's task does), so every answer can be checked: each is tagged with
a version, and its scores must equal those of that version loaded offline. Requests are
sent open-loop (request ``i`` at ``i / rate`` s, over keep-alive connections), so a
server that stalls shows it in the latency, not in a slower offered rate.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrover.driver.localhead import free_port
from dlrover.serving.publish import PublishJob, publish_version
from dlrover.serving.versions import Version, load_version
from dlrover.spec import JobSpec, spec_from_dict

VSHARDS = 4
CLIENTS = 8


def bench_spec(out: Path, rows: int = 100_000, quantize: str = "none") -> JobSpec:
    """Criteo's layout, 26 tables of ``rows`` rows of dim 16, publishing to ``out``."""
    return spec_from_dict({
        "model": {"embedding_dim": 16, "num_embeddings": rows, "dense_arch": [64, 16], "over_arch": [64, 32, 1]},
        "data": {"paths": [str(out)]},
        "publish": {"dir": str(out), "every_s": 1, "quantize": quantize},
    })  # fmt: skip


def initial_state(spec: JobSpec, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """Random tables and dense vector of ``spec``'s model."""
    from dlrover.model.dlrm import dense_arches

    rng = np.random.default_rng(seed)
    tables = [rng.normal(0, 0.05, (n, spec.model.embedding_dim)).astype(np.float32) for n in spec.schema.table_sizes()]
    size = sum(p.numel() for arch in dense_arches(spec.model, 0, spec.schema) for p in arch.parameters())
    return tables, rng.normal(0, 0.05, size).astype(np.float32)


def changed_state(state: list[np.ndarray], rng: np.random.Generator, fraction: float = 0.05) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A copy with ``fraction`` of each table's rows changed; (new state, changed rows)."""
    new, changed = [], []
    for t in state:
        rows = np.sort(rng.choice(len(t), size=max(1, int(len(t) * fraction)), replace=False))
        t = t.copy()
        t[rows] += rng.normal(0, 0.1, (len(rows), t.shape[1])).astype(np.float32)
        new.append(t)
        changed.append(rows)
    return new, changed


def ps_payloads(tables: list[np.ndarray]) -> list[dict]:
    """The tables as two PS hand them over at a cut (vshards 0, 2 and 1, 3; row ``r`` of
    vshard ``r % V`` at ``r // V`` of its block), with a row-wise optimizer state."""
    out = []
    for vshards in ([0, 2], [1, 3]):
        per_table = []
        for t in tables:
            rpv = -(-len(t) // VSHARDS)
            w = np.zeros((len(vshards) * rpv, t.shape[1]), np.float32)
            for slot, v in enumerate(vshards):
                rows = np.arange(v, len(t), VSHARDS)
                w[slot * rpv : slot * rpv + len(rows)] = t[rows]
            per_table.append([w, np.ones(len(w), np.float32)])
        out.append({"vshards": vshards, "tables": per_table})
    return out


def publish_state(spec: JobSpec, state: list[np.ndarray], dense: np.ndarray, n: int, parent: int | None = None, base: int | None = None,
                  rows: list[np.ndarray] | None = None) -> Version:  # fmt: skip
    """Publish ``state`` as version ``n``: full, or (``rows``) a delta on ``parent``."""
    v = Version(
        version=n, kind="full" if rows is None else "delta", parent=parent, base=n if rows is None else int(base), quantize=spec.publish.quantize,
        job_id="synthetic", rows_trained=1000 * n, watermark=[], at_s=float(n), state_sha256="",
        changed_rows=sum(len(r) for r in rows) if rows is not None else sum(len(t) for t in state), files=[],
    )  # fmt: skip
    return publish_version(PublishJob(v, spec, [len(t) for t in state], VSHARDS, dense, rows), *ps_payloads(state))


def criteo_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` rows of Criteo's columns as a request carries them (ints, hex ids)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row: dict = {f"I{i + 1}": int(rng.integers(0, 100)) for i in range(13)}
        row.update({f"C{i + 1}": format(int(rng.integers(0, 2**32)), "08x") for i in range(26)})
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Answer:
    status: int
    version: int | None
    latency_s: float
    scores: list[float] | None


def load(port: int, rows: list[dict], rate: float, count: int, path: str = "/score") -> list[Answer]:
    """``count`` requests of ``rows`` at ``rate`` a second, open-loop, over ``CLIENTS`` connections."""
    body = json.dumps({"rows": rows}).encode()
    t0 = time.monotonic() + 0.05
    local = threading.local()

    def one(i: int) -> Answer:
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        conn = getattr(local, "conn", None) or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        local.conn = conn
        start = time.monotonic()
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            local.conn = None
            return Answer(-1, None, time.monotonic() - start, None)
        took = time.monotonic() - start
        if resp.status != 200:
            return Answer(resp.status, None, took, None)
        doc = json.loads(data)
        return Answer(200, doc.get("version"), took, doc.get("scores"))

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, range(count)))


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 120.0, path: str = "/version") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status in (200, 405):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not answer in time")


RAY_SERVE = textwrap.dedent(
    """
    import sys, time, ray
    from ray import serve
    from starlette.requests import Request
    from dlrover.serving.server import VersionFollower, score_rows
    root, port, poll_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
    class Score:
        def __init__(self):
            self.follower = VersionFollower(root, poll_s)
            self.follower.start()

        async def __call__(self, request: Request) -> dict:
            body = await request.json()
            current = self.follower.current
            return {"version": current.version.version, "scores": score_rows(current, body["rows"])}

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Score.bind(), route_prefix="/score")
    print("ready", flush=True)
    while True:
        time.sleep(3600)
    """
)


def start_server(kind: str, root: Path, port: int, poll_s: float) -> subprocess.Popen:
    """``dlrover serve`` (FastAPI on uvicorn), or the same scoring as a Ray Serve deployment."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if kind == "fastapi":
        cmd = [sys.executable, "-m", "dlrover", "serve", str(root), "--port", str(port), "--poll-s", str(poll_s)]
    else:
        cmd = [sys.executable, "-c", RAY_SERVE, str(root), str(port), str(poll_s)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_case(kind: str, rate: float, seconds: float, rows_per_request: int, table_rows: int, poll_s: float = 0.5) -> dict:
    """One server under load while versions 2 (delta), 3 (delta) and 4 (full) appear."""
    with tempfile.TemporaryDirectory(prefix="dlrover-bench-serve-") as tmp:
        root = Path(tmp) / "pub"
        spec = bench_spec(root, table_rows)
        state, dense = initial_state(spec)
        rng = np.random.default_rng(1)
        publish_state(spec, state, dense, 1)
        port = free_port()
        proc = start_server(kind, root, port, poll_s)
        try:
            wait_ready(port, proc, path="/version" if kind == "fastapi" else "/-/healthz")
            rows, count = criteo_rows(rows_per_request), int(rate * seconds)
            out: list[Answer] = []
            client = threading.Thread(target=lambda: out.extend(load(port, rows, rate, count)))
            client.start()
            for n in (2, 3, 4):
                time.sleep(seconds / 4)
                prev, (state, changed) = state, changed_state(state, rng)
                publish_state(spec, state, dense, n, *((None, None, None) if n == 4 else (n - 1, 1, changed)))
                del prev
            client.join()
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()
        expected = {n: score_offline(root, n, rows) for n in {a.version for a in out if a.version is not None}}
    ok = [a for a in out if a.status == 200]
    lat = np.array([a.latency_s for a in ok]) * 1000
    wrong = sum(not np.allclose(a.scores, expected[a.version], rtol=0, atol=1e-6) for a in ok)
    return {
        "server": kind, "rate_per_s": rate, "requests": len(out), "failed": len(out) - len(ok), "wrong_scores": int(wrong),
        "versions_seen": sorted({a.version for a in ok}), "p50_ms": round(float(np.percentile(lat, 50)), 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 2) if len(lat) else None, "rows_per_request": rows_per_request,
    }  # fmt: skip


def score_offline(root: Path, n: int, rows: list[dict]) -> list[float]:
    from dlrover.serving.server import score_rows, served

    return score_rows(served(load_version(root, n)), rows)


def run(rate: float = 50.0, seconds: float = 12.0, rows_per_request: int = 8, table_rows: int = 100_000) -> dict:
    """FastAPI (``dlrover serve``) and, when installed, Ray Serve, at the same load."""
    cases = [run_case("fastapi", rate, seconds, rows_per_request, table_rows)]
    try:
        import ray.serve  # noqa: F401
    except ImportError as e:
        cases.append({"server": "ray_serve", "skipped": f"ray[serve] is not installed ({e.name} missing): pip install 'ray[serve]==2.60.0'"})
    else:
        cases.append(run_case("ray_serve", rate, seconds, rows_per_request, table_rows))
    return {"cases": cases}


def print_serve(result: dict) -> None:
    for c in result["cases"]:
        if "skipped" in c:
            print(f"{c['server']:>9}: skipped: {c['skipped']}")
            continue
        print(f"{c['server']:>9}: {c['requests']} requests at {c['rate_per_s']:g}/s ({c['rows_per_request']} rows each): "
              f"p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms, failed {c['failed']}, wrong scores {c['wrong_scores']}, versions {c['versions_seen']}")
    done = [c for c in result["cases"] if "p99_ms" in c and c["p99_ms"]]
    if len(done) == 2:
        print(f"p99 ratio ray_serve / fastapi: {done[1]['p99_ms'] / done[0]['p99_ms']:.1f}x")
