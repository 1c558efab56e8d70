"""``dlrover bench publish``: what publishing versions costs a job whose tables pass 1 GB:
the bytes of a full version and of a delta (the rows changed since the previous
version), and the pause of the cut each version is taken at.

The tables have Criteo Kaggle's 26 vocabulary sizes capped at 3.5M rows (16.8M rows of
dim 16: 1.07 GB of weights, plus row-wise Adagrad state), and the data synthetic Criteo
rows with vocabularies as large (Zipf ids, ``dlrover.data.synth``): between two versions
the job touches a small part of the rows, which is what a delta holds. The job publishes
every ``EVERY_S`` seconds, a full version every ``FULL_EVERY``; each version is checked
after the job by loading it (every delta applied, its digest compared). ``--quick``: the
same flow on tables 100x smaller.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from dlrover.bench.bigtable import KAGGLE_VOCAB
from dlrover.bench.progress import JobProgress
from dlrover.errors import DLRoverError
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import JobSummary
from dlrover.serving.versions import load_version, versions
from dlrover.spec import JobSpec, spec_from_dict

DIM, FULL_EVERY = 16, 4
FULL = {"cap": 3_500_000, "rows": 2_000_000, "every_s": 10.0, "ps_memory_mb": 2600}
QUICK = {"cap": 35_000, "rows": 120_000, "every_s": 2.0, "ps_memory_mb": 1024}


class PublishBenchError(DLRoverError):
    """The bench job did not succeed (one ``error:`` line, exit non-zero)."""


def publish_bench_spec(data_dir: str, out: str, p: dict) -> JobSpec:
    sizes = [min(n, p["cap"]) for n in KAGGLE_VOCAB]
    return spec_from_dict({
        "name": "bench-publish",
        "model": {"embedding_dim": DIM, "num_embeddings": sizes, "dense_arch": [64, DIM], "over_arch": [128, 64, 1]},
        "data": {"paths": [os.path.join(data_dir, "*.tsv")], "batch_size": 4096, "eval_fraction": 0.01, "shard_rows": 32_768},
        "resources": {"workers": 1, "ps": 2, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 1536, "ps_memory_mb": p["ps_memory_mb"]},
        "train": {"log_every_s": 1.0},
        "checkpoint": {"memory_interval_s": 0},
        "publish": {"dir": out, "every_s": p["every_s"], "full_every": FULL_EVERY},
    })  # fmt: skip


def run_publish_bench(quick: bool = False) -> dict:
    from dlrover.data.synth import SynthConfig, generate
    from dlrover.driver.runner import run_job

    p = QUICK if quick else FULL
    work = tempfile.mkdtemp(prefix="dlrover-bench-publish-")
    try:
        data, out = os.path.join(work, "data"), os.path.join(work, "versions")
        spec = publish_bench_spec(data, out, p)
        sizes = spec.schema.table_sizes()
        print(f"[bench] {p['rows']:,} synthetic rows, vocabularies up to {p['cap']:,}; tables {sum(sizes) * DIM * 4 / 1e9:.2f} GB of weights", file=sys.stderr, flush=True)
        generate(data, SynthConfig(rows=p["rows"], files=4, seed=17, vocab_sizes=sizes), progress=False)
        doc, path = run_job(spec, runs_dir=os.path.join(work, "runs"), progress="none", stop_when=JobProgress("publish"))
        summary = JobSummary.from_json(doc)
        if summary.status != "succeeded":
            raise PublishBenchError(f"bench publish: the job ended {summary.status}")
        published = [e.fields for _, e in read_events(path.parent / "events.jsonl") if e.kind == "version_published"]
        checked = [load_version(out, n).version.version for n in versions(out)]  # each chain applied and its digest checked
        fulls = [v["bytes"] for v in published if v["version_kind"] == "full"]
        deltas = [v for v in published if v["version_kind"] == "delta"]
        full_bytes = max(fulls) if fulls else None
        delta_bytes = sum(v["bytes"] for v in deltas) / len(deltas) if deltas else None
        return {
            "table_rows": sum(sizes), "weights_bytes": sum(sizes) * DIM * 4, "versions": len(published), "versions_checked": checked,
            "full_bytes": full_bytes, "delta_bytes": delta_bytes, "ratio": full_bytes / delta_bytes if full_bytes and delta_bytes else None,
            "delta_rows_fraction": max((v["changed_rows"] / sum(sizes) for v in deltas), default=None),
            "publish_pause_s": max((v["pause_s"] for v in published), default=None), "samples": summary.samples_trained,
            "samples_per_s": summary.throughput_samples_per_s,
        }  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_publish(r: dict) -> None:
    print(f"tables: {r['table_rows']:,} rows, {r['weights_bytes'] / 1e9:.2f} GB of weights; {r['samples']:,} samples at {r['samples_per_s']:,.0f}/s")
    print(f"  {r['versions']} versions published (checked after the job: {r['versions_checked']})")
    if r["full_bytes"] and r["delta_bytes"]:
        print(f"  full version {r['full_bytes'] / 1e6:,.1f} MB, delta {r['delta_bytes'] / 1e6:,.1f} MB on average: {r['ratio']:.1f}x fewer bytes")
        print(f"  a delta holds at most {100 * r['delta_rows_fraction']:.2f}% of the rows")
    print(f"  longest cut pause for a version: {r['publish_pause_s']:.3f}s")
