"""``dlrover serve``: a load test on loopback while three versions are applied (no failed
request, each answer tagged with its version and scored by it), and what bad requests get."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys

import numpy as np

from dlrover.bench.serving import bench_spec, criteo_rows, initial_state, publish_state, run_case, start_server, wait_ready
from dlrover.driver.localhead import free_port


def test_requests_under_load_while_three_versions_are_applied_all_succeed_tagged_with_their_version():
    r = run_case("fastapi", rate=40, seconds=6, rows_per_request=4, table_rows=2000, poll_s=0.2)
    assert r["requests"] == 240 and r["failed"] == 0, r
    assert r["wrong_scores"] == 0, r  # each answer's scores are its version's, loaded offline
    assert r["versions_seen"] == [1, 2, 3, 4], r  # two deltas and a full version applied under load


def post(port: int, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/score", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def test_bad_requests_get_400_naming_the_problem_and_the_server_goes_on(tmp_path):
    spec = bench_spec(tmp_path / "pub", rows=1000)
    state, dense = initial_state(spec)
    publish_state(spec, state, dense, 1)
    port = free_port()
    proc = start_server("fastapi", tmp_path / "pub", port, 0.5)
    try:
        wait_ready(port, proc)
        row = criteo_rows(1)[0]
        assert post(port, b'{"nope": 1}') == (400, {"detail": 'expected {"rows": [{column: value, ...}, ...]}'})
        status, doc = post(port, json.dumps({"rows": [{**row, "I3": "many"}]}).encode())
        assert status == 400 and "I3" in doc["detail"], doc
        status, doc = post(port, json.dumps({"rows": [{k: v for k, v in row.items() if k != "C7"}]}).encode())
        assert status == 400 and "C7" in doc["detail"], doc
        status, doc = post(port, json.dumps({"rows": [row, row]}).encode())
        assert status == 200 and doc["version"] == 1 and len(doc["scores"]) == 2 and np.isclose(*doc["scores"])
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_serve_without_versions_is_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dlrover", "serve", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {tmp_path}: no complete model version (is it a publish.dir?)"
