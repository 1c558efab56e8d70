"""Launching on a cluster that can never hold the job: one line at once, naming the
shortfall, rather than actors pending until a timeout."""

from __future__ import annotations

import pytest

from conftest import small_spec
from dlrover.errors import DLRoverError


def test_a_job_asking_more_cpus_than_the_cluster_has_fails_at_once_naming_them(ray_local, synth_dir, tmp_path):
    from dlrover.driver.runner import run_job

    total = ray_local.cluster_resources()["CPU"]
    spec = small_spec(synth_dir, resources__worker_cpu=total / 2)  # 2 workers alone take every CPU
    with pytest.raises(DLRoverError) as e:
        run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    # before any actor is asked for: not the timeout's "actors did not start within"
    assert "the cluster cannot hold the job and no autoscaler can add nodes" in str(e.value)
    assert f"need {total + 2 + 0.25:g} CPUs; the cluster has {total:g} CPUs on 1 node" in str(e.value), str(e.value)


def fake_autoscaling_config(gcs_port: int) -> dict:
    """Ray's fake multi-node provider (nodes are processes on this machine): a head with no
    CPUs, up to two 2-CPU nodes added on demand. (The fake provider cannot give its nodes a
    ``memory`` resource, so it never adds one for the job's actors, which ask for memory:
    the test stops at the job's word that it waits.)"""
    return {
        "cluster_name": "dlrover-test", "max_workers": 2, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "fake_multinode", "gcs_address": f"127.0.0.1:{gcs_port}"},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "cpu2": {"resources": {"CPU": 2}, "node_config": {}, "min_workers": 0, "max_workers": 2},
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }  # fmt: skip


AUTOSCALED_JOB = """
import os, sys, threading, time
sys.path.insert(0, {tests!r})
import ray
from conftest import small_spec
from dlrover.driver.rayauth import use_token_auth
from dlrover.driver.runner import run_job

use_token_auth()
for attempt in range(30):  # the head may still be starting on a busy machine
    try:
        ray.init(address={gcs!r}, namespace="dlrover", logging_level="ERROR")
        break
    except ConnectionError:
        ray.shutdown()
        time.sleep(2)
spec = small_spec({data!r}, resources__dense_ps_cpu=0)
threading.Thread(target=run_job, args=(spec,), kwargs=dict(runs_dir={runs!r}, progress="none"), daemon=True).start()
deadline = time.monotonic() + 300
while time.monotonic() < deadline:  # the master's notable events, as the driver's progress lines show them
    time.sleep(1)
    masters = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith("/master")]
    if not masters:
        continue
    p = ray.get(ray.get_actor(masters[0], namespace="dlrover").progress.remote(since=0))
    waits = [e for e in p["events"] if e.kind == "waiting_for_nodes"]
    if waits:
        print("WAITING " + waits[0].fields["why"] + " STATUS " + p["status"], flush=True)
        os._exit(0)
print("NO EVENT", flush=True)
os._exit(1)
"""


@pytest.mark.ray  # starts a head of its own, in a script the marker's source check does not see
@pytest.mark.timeout(600)
def test_on_an_autoscaling_cluster_a_job_that_does_not_fit_yet_waits_for_nodes_saying_so(synth_dir, tmp_path):
    """A head with no CPUs and an autoscaler that can add nodes: the job does not fail at
    launch; it says it waits for nodes, naming what is missing, and stays starting."""
    import json
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from dlrover.driver.localhead import free_port

    port = free_port()
    config = tmp_path / "autoscaling.json"
    config.write_text(json.dumps(fake_autoscaling_config(port)))
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    env = dict(os.environ, RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="dlrover-ray-")  # short: Ray's socket paths must fit in 107 bytes
    ports = [f"--{flag}={free_port()}" for flag in ("ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")]
    cmd = [ray_bin, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=0", f"--autoscaling-config={config}",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}", *ports]  # fmt: skip
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        script = AUTOSCALED_JOB.format(tests=str(Path(__file__).parent), gcs=f"127.0.0.1:{port}", data=str(synth_dir), runs=str(tmp_path / "runs"))
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=400, env=env)
    finally:
        # `ray start --block` stops its cluster in order on SIGTERM (2-3 s). Not the whole
        # group at once: a GCS told to stop with its raylet lingers ~30 s.
        head.terminate()
        try:
            head.wait(timeout=40)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp_dir, ignore_errors=True)
    line = next((x for x in r.stdout.splitlines() if x.startswith("WAITING ")), None)
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    assert "a worker asks for 1 CPU and the largest node has 0 CPUs; an autoscaler may add nodes" in line, line
    assert line.endswith("STATUS starting"), line
