"""``dlrover bench pal``: PAL placement live against Ray's default placement, on a loopback
cluster with one slow node (issue 17, item 6).

Each placement gets a fresh ``ray.cluster_utils.Cluster`` in its own process (a process
holds one Ray): a head with no CPUs (the master, the dense PS) and two nodes of
``NODE_CPUS`` logical CPUs, one of them labelled ``dlrover.io/slowdown: F``, so that a
worker there spends F times the CPU per step (``dlrover.faults.injected``). The job starts with
2 workers + 1 PS and scales out to 4 workers (``scripted``) once both have reported.
With ``pal`` a probe timed on each node when the job starts finds the slow node, and the
actors go to the fast one while it has room; Ray's default puts them wherever it likes.
All nodes share this machine's cores, so a worker on the slow node takes CPU from the
others: the job is faster the fewer workers sit there.

Reported per placement: the node each worker ran on, samples/s of each worker count
(the ``configurations`` of the summary) and the job's training time; and PAL over the
default for the 4-worker configuration and the whole job.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from dlrover.errors import DLRoverError
from dlrover.ids import ActorId, Role

NODE_CPUS = 4
MAX_WORKERS = 16  # worker ids a run may use (4 at a time, replacements take new ones)
PLACEMENTS = ("default", "pal")
SCALE_OUT_AFTER_S = 6.0  # windows of the 2-worker configuration before it scales to 4


def pal_spec_doc(data: str, epochs: int, placement: str, history_dir: str) -> dict:
    """The bench job (a small DLRM: the placement, not the model, is measured)."""
    steps = [{"after_window_s": SCALE_OUT_AFTER_S, "workers": 4}]
    return {
        "name": f"bench-pal-{placement}",
        "model": {"embedding_dim": 8, "num_embeddings": 5000, "dense_arch": [32, 8], "over_arch": [64, 32, 1]},
        "data": {"paths": [f"{data}/*.tsv"], "epochs": epochs, "batch_size": 256, "eval_fraction": 0.1, "shard_rows": 4096},
        "resources": {"workers": 2, "ps": 1, "worker_cpu": 1, "ps_cpu": 0.5, "dense_ps_cpu": 0, "budget_cpu": 4.5,
                      "worker_memory_mb": 2048, "ps_memory_mb": 1024},  # fmt: skip
        "train": {"log_every_s": 0.5},
        "policy": {"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.5, "warmup_s": 2,
                   "placement": placement, "history_dir": history_dir},  # fmt: skip
    }


def run_placement(placement: str, data: str, epochs: int, slowdown: float, tmp: str) -> dict:
    """One job on a fresh cluster (call it in a process of its own): where each worker
    ran, samples/s by worker count, training time."""
    import ray
    from ray.cluster_utils import Cluster

    from dlrover.bench.progress import run_bench_job
    from dlrover.faults.injected import SLOWDOWN_LABEL
    from dlrover.spec import spec_from_dict

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        slow = cluster.add_node(num_cpus=NODE_CPUS, labels={SLOWDOWN_LABEL: f"{slowdown:g}"})
        fast = cluster.add_node(num_cpus=NODE_CPUS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="dlrover", logging_level="ERROR")
        spec = spec_from_dict(pal_spec_doc(data, epochs, placement, os.path.join(tmp, f"h-{placement}")), "bench pal")
        s, events = run_bench_job(spec, os.path.join(tmp, f"runs-{placement}"), placement, "pal")
    finally:
        ray.shutdown()
        cluster.shutdown()
    nodes = {slow.node_id: "slow", fast.node_id: "fast"}
    workers = {ActorId(Role.WORKER, i).ray_name(s.job_id): str(ActorId(Role.WORKER, i)) for i in range(MAX_WORKERS)}
    ran_on: dict[str, set[str]] = {}
    for e in events:
        if e.kind == "metrics" and e.fields.get("node_id") and e.actor in workers:
            ran_on.setdefault(workers[e.actor], set()).add(nodes.get(e.fields["node_id"], "head"))
    return {
        "placement": placement,
        "train_s": s.train_time_s,
        "samples_per_s": s.throughput_samples_per_s,
        "ran_on": {w: sorted(n) for w, n in sorted(ran_on.items())},
        "samples_per_s_by_workers": {str(c["config"]["workers"]): c["measured_throughput"] for c in s.configurations},
    }


def run_pal_bench(rows: int = 120_000, slowdown: float = 3.0, epochs: int = 4) -> dict:
    """Both placements, each in a child process with its own cluster."""
    from dlrover.data.synth import SynthConfig, generate

    out = {"rows": rows, "epochs": epochs, "slowdown": slowdown, "node_cpus": NODE_CPUS, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        generate(data, SynthConfig(rows=rows, files=2, seed=4), progress=False)
        for placement in PLACEMENTS:
            print(f"[bench] placement {placement}: 2 -> 4 workers, slow node {slowdown:g}x", file=sys.stderr, flush=True)
            cmd = [sys.executable, "-m", "dlrover.bench.pal", placement, data, str(epochs), str(slowdown), tmp]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
            if r.returncode != 0 or line is None:
                raise DLRoverError(f"bench pal: the {placement} run failed (exit {r.returncode}); its errors are above")
            out["runs"].append(json.loads(line[len("RESULT ") :]))
    by = {r["placement"]: r for r in out["runs"]}
    four = [by[p]["samples_per_s_by_workers"].get("4") for p in PLACEMENTS]
    out["pal_over_default_4_workers"] = four[1] / four[0] if all(four) else None
    out["pal_over_default_job"] = by["pal"]["samples_per_s"] / by["default"]["samples_per_s"]
    return out


def print_pal(r: dict) -> None:
    print(f"PAL vs Ray's default placement: {r['rows']:,} rows x {r['epochs']} epochs, 2 -> 4 workers, a slow node ({r['slowdown']:g}x) and a fast one ({r['node_cpus']} CPUs each)")
    print(f"{'placement':<10} {'workers on slow / fast':<34} {'2 w/s':>8} {'4 w/s':>8} {'job /s':>8} {'train s':>8}")
    for run in r["runs"]:
        slow = ",".join(w.removeprefix("worker-") for w, n in run["ran_on"].items() if "slow" in n) or "-"
        fast = ",".join(w.removeprefix("worker-") for w, n in run["ran_on"].items() if "fast" in n) or "-"
        by = run["samples_per_s_by_workers"]
        cells = [f"{by[k]:8,.0f}" if by.get(k) else f"{'-':>8}" for k in ("2", "4")]
        print(f"{run['placement']:<10} {'w ' + slow + ' / w ' + fast:<34} {cells[0]} {cells[1]} {run['samples_per_s']:8,.0f} {run['train_s']:8.1f}")
    four = r["pal_over_default_4_workers"]
    print(f"pal / default: 4 workers {four:.2f}x, whole job {r['pal_over_default_job']:.2f}x" if four else f"pal / default: whole job {r['pal_over_default_job']:.2f}x")


def main() -> None:
    """The child process of :func:`run_pal_bench`: one placement, its result on stdout."""
    ap = argparse.ArgumentParser()
    ap.add_argument("placement", choices=PLACEMENTS)
    ap.add_argument("data")
    ap.add_argument("epochs", type=int)
    ap.add_argument("slowdown", type=float)
    ap.add_argument("tmp")
    a = ap.parse_args()
    print("RESULT " + json.dumps(run_placement(a.placement, a.data, a.epochs, a.slowdown, a.tmp)), flush=True)


if __name__ == "__main__":
    main()
