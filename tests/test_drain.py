"""Draining a node (a spot reclaim, an eviction, an operator): ``dlrover drain`` asks Ray
to drain it, the job's master sees the drain and moves its actors off with a live
rescale, on a real multi-node cluster (``ray.cluster_utils.Cluster``): no rollback, no
failure, every update applied exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DRAIN_SCRIPT = textwrap.dedent(
    """
    import json, subprocess, sys, threading, time
    sys.path.insert(0, {tests!r})
    import ray
    from ray.cluster_utils import Cluster
    from conftest import batches_expected, sleepy, small_spec
    from dlrover.driver.runner import run_job

    cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 0}})
    cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="dlrover", logging_level="ERROR")
    # The head has no CPUs (as on KubeRay): the dense PS reserves none, so it stays there with the master.
    # The drain (asked once the job trains) was over by 40% of 2 epochs on a busy 2-core host;
    # training on a quiet one is relatively faster than starting the actors: both first
    # workers sleep each step's time after it (``slow``, factor 2), so 2 epochs last as long
    # as 4 at the CPU of 2.
    spec = small_spec({data!r}, data__epochs=2, data__batch_size=512, train__log_every_s=0.5, resources__dense_ps_cpu=0,
                      chaos=sleepy(2))
    job = "drain-job"
    out = {{}}
    t = threading.Thread(target=lambda: out.update(s=run_job(spec, runs_dir={runs!r}, progress="none", job_id=job)[0]))
    t.start()
    while True:  # until the job trains
        time.sleep(0.5)
        try:
            master = ray.get_actor(job + "/master", namespace="dlrover")
            if ray.get(master.progress.remote())["samples_done"] > 0:
                break
        except ValueError:
            pass
    # The node of a PS (else of a worker) that does not host the master: the master's node cannot be drained.
    here = ray.get(master.node_id.remote())
    actor = lambda a: ray.get_actor(job + "/" + a, namespace="dlrover")
    nodes = [ray.get(actor(a).stats.remote()).node_id for a in ("ps-0", "ps-1")]
    nodes += [ray.get(actor(a).ping.remote()).node_id for a in ("worker-0", "worker-1")]
    node = next(n for n in nodes if n != here)
    drain = subprocess.Popen([sys.executable, "-m", "dlrover", "drain", job, "--node", node, "--deadline-s", "120",
                              "--address", cluster.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Room for the replacements, while the drain is asked for (they wait for it if need be).
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    stdout, stderr = drain.communicate(timeout=120)
    print("DRAIN", drain.returncode, stdout.strip(), stderr.strip()[-500:])
    t.join()
    s = out["s"]
    print("SUMMARY " + json.dumps(dict(s, drained_node=node, batches_expected=batches_expected(spec)), default=float))
    """
)


@pytest.mark.timeout(600)
def test_a_drained_nodes_actors_move_off_without_rollback_or_lost_update(synth_dir_large, tmp_path):
    script = DRAIN_SCRIPT.format(tests=str(Path(__file__).parent), data=str(synth_dir_large), runs=str(tmp_path / "runs"))
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=560, env=env)
    drain = next((x for x in r.stdout.splitlines() if x.startswith("DRAIN ")), None)
    assert drain and drain.startswith("DRAIN 0 node "), r.stdout[-2000:] + r.stderr[-3000:]
    line = next((x for x in r.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    s = json.loads(line[len("SUMMARY ") :])
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["samples_trained"] == s["samples_expected"]
    assert s["failures"] == [] and s["samples_replayed"] == 0  # moved, not lost and recovered
    assert s["ps_bags_updated"] == 26 * s["samples_expected"]
    assert s["dense_updates"] == s["batches_expected"]
    (moved,) = [e for e in s["scale_events"] if e["stage"] == "drain"]
    assert moved["kind"] == "replace" and s["drained_node"][:12] in moved["reason"]
    events = [json.loads(x) for x in (tmp_path / "runs" / "drain-job" / "events.jsonl").read_text().splitlines()]
    (seen,) = [e for e in events if e["kind"] == "node_drain"]
    assert seen["node"] == s["drained_node"] and seen["actors"]
    if any("/ps-" in a for a in seen["actors"]):  # a PS there: its vshards went to its replacement
        assert moved["vshards_moved"] > 0


def test_a_bad_deadline_is_one_line_naming_the_flag_before_anything_is_asked():
    r = subprocess.run([sys.executable, "-m", "dlrover", "drain", "job", "--node", "n", "--deadline-s", "-5", "--address", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0
    lines = [x for x in r.stderr.strip().splitlines() if x]
    assert len(lines) == 1 and "--deadline-s" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_an_address_where_nothing_listens_is_one_line_without_ray_retrying():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "dlrover", "drain", "job", "--node", "n", "--address", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = [x for x in r.stderr.strip().splitlines() if x]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: --address 127.0.0.1:{port}: cannot connect to Ray: nothing answers there"), lines


def test_a_sigtermed_ps_and_worker_are_moved_off_before_their_grace_period_ends(ray_local, synth_dir_large, tmp_path):
    """SIGTERM is a preemption notice: each actor tells the master, which replaces it with
    a live rescale while it keeps serving; nothing fails, rolls back or applies twice."""
    import signal

    from conftest import batches_expected, signal_when_training, sleepy, small_spec
    from dlrover.driver.runner import run_job

    # 4 epochs: the moves (notices at 20k samples, two actors started) were over by 30-50%
    # of them on a busy 2-core host; at 3 epochs a quieter one ended 4 s after the move, and
    # a quiet one at 4 ended before its second move (which waits for the first, a checkpoint
    # and RETRY_S): the workers also sleep as long as they step (sleepy), doubling the time.
    spec = small_spec(synth_dir_large, data__epochs=4, data__batch_size=512, train__log_every_s=0.5, chaos=sleepy(2))
    job = "sigterm-job"
    sent: dict = {}
    threads = [signal_when_training(job, actor, signal.SIGTERM, sent.setdefault(actor, {})) for actor in ("ps-0", "worker-0")]
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id=job)
    for t in threads:
        t.join(timeout=5)
    assert all("pid" in out for out in sent.values()), sent
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["failures"] == [] and s["samples_replayed"] == 0
    assert s["ps_bags_updated"] == 26 * s["samples_expected"] and s["dense_updates"] == batches_expected(spec)
    moves = [e for e in s["scale_events"] if e["stage"] == "drain"]
    assert moves and all(e["kind"] == "replace" for e in moves)
    reasons = " ".join(e["reason"] for e in moves)
    assert "ps-0 got SIGTERM" in reasons and "worker-0 got SIGTERM" in reasons
    assert sum(e["vshards_moved"] for e in moves) > 0
    events = [json.loads(x) for x in (path.parent / "events.jsonl").read_text().splitlines()]
    assert {e["actor"].split("/")[-1] for e in events if e["kind"] == "preemption_notice"} == {"ps-0", "worker-0"}
