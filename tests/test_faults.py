"""Fault tolerance with real actors: one test per fault kind (the spec's ``chaos:``).

Each job must finish with nothing lost, an AUC within 0.01 of the same job without faults,
and the failure in its summary with injection, detection and recovery times. A kill's job
is then replayed on the fake cluster (``event_sequence``): both tell the same recovery story.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import auc_spec, check_exactly_once, fault_spec, small_spec
from event_sequence import check_same_story

AUC_TOLERANCE = 0.01


def check_recovered(s: dict, reference: dict, kind: str) -> dict:
    assert s["status"] == "succeeded", s.get("status")
    assert s["samples_lost"] == 0 and s["samples_trained"] == s["samples_expected"]
    # No worse than without the fault; a rollback replays samples, which may train it further.
    assert s["auc"] > reference["auc"] - AUC_TOLERANCE, (s["auc"], reference["auc"])
    failures = [f for f in s["failures"] if f["kind"] == kind]
    assert failures, s["failures"]
    f = failures[0]
    assert f["at_s"] <= f["detected_s"] <= f["recovered_s"], f
    assert f["cause_class"] in ("user_code", "system", "infrastructure")
    assert kind in s["reliability"]["by_kind"]
    assert 0.0 < s["ettr"] <= 1.0
    return f


def test_worker_kill(fault_free, synth_dir_auc, tmp_path):
    from dlrover.driver.runner import run_job

    spec = auc_spec(synth_dir_auc, tmp_path, [{"at_s": 2, "action": "kill", "target": "worker:0"}])
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    f = check_recovered(s, fault_free, "worker_death")
    assert f["actor"].endswith("worker-0") and f["replacement"] and f["node"]
    check_exactly_once(s, spec)  # PS state survived: no rollback, and no batch applied twice
    check_same_story(path, spec, tmp_path)  # the same job on the fake cluster: the same events


def test_ps_kill_under_rollback_rolls_back_to_in_memory_checkpoint(fault_free, synth_dir_auc, tmp_path):
    from dlrover.driver.runner import run_job

    spec = auc_spec(synth_dir_auc, tmp_path, [{"at_s": 3, "action": "kill", "target": "ps:1"}], recovery__ps="rollback")
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    f = check_recovered(s, fault_free, "ps_death")
    assert f["actor"].endswith("ps-1")
    assert f["checkpoint"]["source"] == "memory" and f["checkpoint"]["at_s"] <= f["at_s"]
    assert s["samples_replayed"] == f["samples_replayed"] >= 0
    events = [json.loads(line) for line in (path.parent / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "rollback" for e in events)
    assert s["checkpoints"]["in_memory_taken"] >= 2
    check_same_story(path, spec, tmp_path)  # the same job on the fake cluster: the same events


def test_master_kill_resumes_from_durable_checkpoint(fault_free, synth_dir_auc, tmp_path):
    from dlrover.driver.runner import run_job

    spec = auc_spec(synth_dir_auc, tmp_path, [{"at_s": 4, "action": "kill", "target": "master"}])
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    f = check_recovered(s, fault_free, "master_death")
    assert f["checkpoint"]["source"] == "durable" and f["restarts"] == 1
    assert [c["target"] for c in s["chaos"]] == ["master"]  # not fired again after the restart


def test_memory_limit_is_enforced(fault_free, synth_dir_auc, tmp_path):
    """With a static policy nothing predicts the leak: the master kills the worker at its
    limit (as a container would), and the replacement gets more memory."""
    from dlrover.driver.runner import run_job

    spec = auc_spec(synth_dir_auc, tmp_path, [{"at_s": 1, "action": "leak", "target": "worker:0", "mb_per_s": 500}])
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0
    assert s["oom_kills"] == 1
    assert abs(s["auc"] - fault_free["auc"]) < AUC_TOLERANCE, (s["auc"], fault_free["auc"])
    (f,) = [f for f in s["failures"] if f["kind"] == "oom_kill"]
    assert f["actor"].endswith("worker-0") and f["cause_class"] == "system"


NODE_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import ray
    from ray.cluster_utils import Cluster
    from conftest import auc_spec
    from dlrover.driver.runner import run_job

    cluster = Cluster(initialize_head=True, head_node_args={{
        "num_cpus": 0, "_system_config": {{"health_check_period_ms": 500, "health_check_failure_threshold": 3}}}})
    cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="dlrover", logging_level="ERROR")
    # The session's fault-free job (``auc_spec``); the head has no CPUs: the dense PS
    # reserves none, so it stays there with the master.
    spec = auc_spec({data!r}, Path({tmp!r}), [], resources__dense_ps_cpu=0)
    out = {{}}
    t = threading.Thread(target=lambda: out.update(s=run_job(spec, runs_dir={runs!r}, progress="none")[0]))
    t.start()
    while True:  # until the job trains; then the node goes away with the actors on it
        time.sleep(0.5)
        masters = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith("/master")]
        if masters and ray.get(ray.get_actor(masters[0], namespace="dlrover").progress.remote())["samples_seen"] > 0:
            break
    time.sleep({delay})
    # Not the master's node (the master and the dense PS live there: its loss is a master restart).
    here = ray.get(ray.get_actor(masters[0], namespace="dlrover").node_id.remote())
    doomed = next(n for n in cluster.worker_nodes if n.node_id != here and n.node_id != cluster.head_node.node_id)
    cluster.add_node(num_cpus=2)  # room for the replacements
    cluster.remove_node(doomed, allow_graceful=False)
    t.join()
    print("SUMMARY " + json.dumps(out["s"], default=float))
    """
)


@pytest.mark.timeout(600)
def test_node_removal(fault_free, synth_dir_auc, tmp_path):
    """A worker node of a multi-node cluster (``ray.cluster_utils.Cluster``) dies with the
    job's actors on it: they are rescheduled on the remaining nodes, nothing is lost, and
    the model is as good as the session's run of the same job (``auc_spec``) without the
    fault: one epoch over 360k rows, whose AUC does not depend on where the actors ran or
    the order their updates landed in (a job of its own on this cluster, as a reference,
    cost as much again)."""
    script = NODE_SCRIPT.format(tests=str(Path(__file__).parent), data=str(synth_dir_auc), tmp=str(tmp_path), runs=str(tmp_path / "runs"), delay=2)
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=540, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    s = json.loads(line[len("SUMMARY ") :])
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["samples_trained"] == s["samples_expected"]
    lost = [f for f in s["failures"] if f["kind"] in ("node_loss", "ps_death", "worker_death")]
    assert lost, s["failures"]
    assert all(f["at_s"] <= f["detected_s"] <= f["recovered_s"] for f in lost)
    assert s["samples_expected"] == fault_free["samples_expected"]  # the same job as the reference
    assert abs(s["auc"] - fault_free["auc"]) < AUC_TOLERANCE, (s["auc"], fault_free["auc"])


def test_corrupt_and_missing_durable_checkpoints(tmp_path):
    """Recovery from disk: a corrupt newest checkpoint is reported and the previous one
    used; a missing directory is a one-line CheckpointError."""
    import numpy as np

    from dlrover.checkpoint.store import CheckpointError, CheckpointStore
    from dlrover.master.checkpoint import Checkpoint, Checkpointer
    from dlrover.master.events import EventLog

    class Master:  # the two things the Checkpointer reads from its master here
        spec = small_spec(tmp_path)
        events = EventLog()

    store = CheckpointStore(str(tmp_path / "ck"))
    ck = Checkpointer(Master(), store)
    for seq in (1, 2):
        c = Checkpoint(seq, float(seq), {"done": [], "offsets": []}, seq * 100, 0, seq, {"param": np.full(3, seq, np.float32)}, [])
        store.save(seq, {"ps_0": {"vshards": np.arange(2), "tables": [[np.full((2, 4), seq, np.float32)]]}, "dense": c.dense}, c.meta())
    newest = tmp_path / "ck" / "ckpt-00000002" / "ps_0.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    got, payloads, source = ck.load_durable()
    assert source == "durable" and got.seq == 1 and got.samples == 100
    assert float(payloads[0]["tables"][0][0][0, 0]) == 1.0
    (ev,) = [e for e in Master.events.rows() if e.kind == "checkpoint_corrupt"]
    assert "ps_0.pt" in ev.fields["message"] and "checksum" in ev.fields["message"]

    missing = Checkpointer(Master(), CheckpointStore(str(tmp_path / "nowhere")))
    with pytest.raises(CheckpointError, match="nowhere: checkpoint directory does not exist"):
        missing.load_durable()


@pytest.mark.timeout(400)
def test_a_job_past_max_failures_ends_failed_with_a_summary_and_the_reason(synth_dir, tmp_path):
    """Three real worker kills against ``checkpoint.max_failures: 1``, through the CLI: the
    job ends FAILED with exit code 1, one line naming the limit, and a summary.json."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        textwrap.dedent(
            f"""\
            name: past-the-limit
            data: {{paths: ['{synth_dir}/*.tsv'], epochs: 40, batch_size: 1024, shard_rows: 4096}}
            model: {{embedding_dim: 8, num_embeddings: 5000, dense_arch: [32, 8], over_arch: [64, 32, 1]}}
            resources: {{workers: 2, ps: 2, worker_cpu: 1, ps_cpu: 1, worker_memory_mb: 2048, ps_memory_mb: 1024}}
            checkpoint: {{max_failures: 1}}
            chaos:
              - {{at_s: 1, action: kill, target: "worker:0"}}
              - {{at_s: 3, action: kill, target: "worker:1"}}
              - {{at_s: 5, action: kill, target: "worker:0"}}
            """
        )
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    cmd = [sys.executable, "-m", "dlrover", "run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    proc = subprocess.run(cmd, cwd=Path(__file__).parent.parent, env=env, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    status = next(line for line in proc.stdout.splitlines() if line.startswith("job "))
    assert ": failed: 2 failures (checkpoint.max_failures: 1)" in status, status
    (summary_path,) = (tmp_path / "runs").glob("*/summary.json")
    s = json.loads(summary_path.read_text())
    assert s["status"] == "failed" and "checkpoint.max_failures: 1" in s["reason"] and "\n" not in s["reason"]
    assert len(s["failures"]) >= 2 and s["failures"][0]["kind"] == "worker_death"
    assert s["failures"][0]["recovered_s"] is not None and s["failures"][1]["recovered_s"] is None  # the job never trained after it
    assert s["samples_trained"] < s["samples_expected"]
    events = [json.loads(line) for line in (summary_path.parent / "events.jsonl").read_text().splitlines()]
    (end,) = [e for e in events if e["kind"] == "job_end"]
    assert end["status"] == "failed" and end["reason"] == s["reason"]
