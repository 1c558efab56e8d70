"""PAL placement live vs Ray's default, on a loopback multi-node cluster with one slow node.

    python benchmarks/pal_live.py [--rows 120000] [--delay-ms 150] [--epochs 2]

Head (no CPUs: master, dense PS), a slow node of 4 CPUs (label ``dlrover.io/step-delay-ms``)
and a fast node of 3 CPUs. The job starts with 1 worker + 1 PS (0.5 CPU), scales to 2 and
then 4 workers (``scripted``), once with ``policy.placement: default`` and once with
``pal``; each run gets a fresh cluster. Prints, per placement, the node each worker ran
on, each configuration's measured throughput (by worker count) and the job's training time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

RUN = textwrap.dedent(
    """
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    from dlrover.chaos import STEP_DELAY_LABEL
    from dlrover.runner import run_job
    from dlrover.runlog import read_events
    from dlrover.spec import spec_from_dict

    cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 0}})
    slow = cluster.add_node(num_cpus=4, labels={{STEP_DELAY_LABEL: "{delay}"}})
    fast = cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="dlrover", logging_level="ERROR")
    steps = [{{"after_window_s": 3, "workers": 2}}, {{"after_window_s": 8, "workers": 4}}]
    spec = spec_from_dict({{
        "name": "pal", "model": {{"embedding_dim": 8, "num_embeddings": 5000, "dense_arch": [32, 8], "over_arch": [64, 32, 1]}},
        "data": {{"paths": ["{data}/*.tsv"], "epochs": {epochs}, "batch_size": 256, "eval_fraction": 0.1, "shard_rows": 4096}},
        "resources": {{"workers": 1, "ps": 1, "worker_cpu": 1, "ps_cpu": 0.5, "dense_ps_cpu": 0, "budget_cpu": 4.5,
                       "worker_memory_mb": 2048, "ps_memory_mb": 1024}},
        "train": {{"log_every_s": 0.5}},
        "policy": {{"name": "scripted", "knobs": {{"steps": steps}}, "interval_s": 0.5, "warmup_s": 2,
                    "placement": "{placement}", "history_dir": "{tmp}/h"}},
    }})
    s, path = run_job(spec, runs_dir="{tmp}/runs", progress="none", job_id="pal-{placement}")
    names = {{slow.node_id: "slow", fast.node_id: "fast"}}
    ran_on = {{}}
    for _, e in read_events(path.parent / "events.jsonl"):
        if e["kind"] == "metrics" and e.get("node_id"):
            ran_on.setdefault(e["actor"].split("/")[-1], set()).add(names.get(e["node_id"], "head"))
    print("RESULT " + json.dumps({{
        "placement": "{placement}", "status": s["status"], "train_s": round(s["train_time_s"], 1), "samples_per_s": round(s["throughput_samples_per_s"]),
        "samples": s["samples_trained"], "ran_on": {{w: sorted(n) for w, n in sorted(ran_on.items())}},
        "samples_per_s_by_workers": {{c["config"]["workers"]: round(c["measured_throughput"]) for c in s["configurations"]}},
    }}))
    """
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=120_000)
    ap.add_argument("--delay-ms", type=float, default=150.0)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    from dlrover.data.synth import SynthConfig, generate

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        generate(data, SynthConfig(rows=args.rows, files=2, seed=4), progress=False)
        for placement in ("default", "pal"):
            script = RUN.format(delay=args.delay_ms, data=data, epochs=args.epochs, placement=placement, tmp=tmp)
            env = dict(os.environ, RAY_AUTH_MODE="disabled")
            r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
            line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
            print(line[len("RESULT ") :] if line else f"{placement}: no result\n{r.stderr[-3000:]}", flush=True)


if __name__ == "__main__":
    main()
