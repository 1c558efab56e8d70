"""``dlrover bench bigtable``: a job whose embedding tables and optimizer state total more
than 4 GB over 4 PS trains, rescales its PS 4 -> 6 -> 4 while training, and checkpoints.

The tables have Criteo Kaggle's 26 vocabulary sizes (the counts the DLRM reference reads
from the Kaggle data), capped at 3.5M rows as DLRM's ``--max-ind-range`` caps them, dim
64, with row-wise Adagrad (one fp32 accumulator per row): 16.8M rows, 4.37 GB. The data is
synthetic Criteo rows whose vocabularies are as large as the tables (Zipf ids). The
scripted policy adds two PS (every PS hands vshards to the new ones) and then retires
two; a checkpoint is cut every ``CHECKPOINT_EVERY_S``, written to a temporary directory
and then released from the object store.

Measured from the job's own events: the memory of each PS (the largest its metrics
reported) against its share of the model, each rescale's pre-copy rate (bytes moved while
training goes on / copy time; goal >= 0.5 GB/s), pause and duration, each cut's pause,
and the durable checkpoints' bytes and write times. ``--quick`` runs the same flow on
tables 100x smaller (the test suite's version).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from dlrover.bench.progress import JobProgress
from dlrover.errors import DLRoverError
from dlrover.resource.configs import describe_change
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import Event, JobSummary
from dlrover.spec import JobSpec, spec_from_dict

# Criteo Kaggle (Display Advertising Challenge) vocabulary sizes of C1..C26.
KAGGLE_VOCAB = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
CAP, DIM = 3_500_000, 64
PS_FROM, PS_PEAK = 4, 6
# Every cut is written to disk and then leaves the object store (keep_in_memory: false):
# a 4.4 GB copy left there is spilled to disk when a rescale's moving vshards need room.
CHECKPOINT_EVERY_S = 30.0
# PS memory: its share of the model (1.09 GB at 4 PS) + ~0.45 GB of process; room for
# twice the share, for a PS whose tables are rebuilt (a compact layout, a rollback).
FULL = {"cap": CAP, "rows": 600_000, "epochs": 1, "batch_size": 4096, "ps_memory_mb": 2600}
QUICK = {"cap": CAP // 100, "rows": 120_000, "epochs": 4, "batch_size": 1024, "ps_memory_mb": 1024}


class BigTableBenchError(DLRoverError):
    """The bench job did not succeed (one ``error:`` line, exit non-zero)."""


def table_sizes(cap: int) -> list[int]:
    return [min(n, cap) for n in KAGGLE_VOCAB]


def model_bytes(sizes: list[int], dim: int = DIM) -> int:
    """Weights plus row-wise Adagrad state."""
    return sum(sizes) * (dim + 1) * 4


def bigtable_spec(data_dir: str, ckpt_dir: str, p: dict) -> JobSpec:
    steps = [{"at_progress": 0.2, "ps": PS_PEAK}, {"at_progress": 0.5, "ps": PS_FROM}]
    return spec_from_dict(
        {
            "name": "bench-bigtable",
            "model": {"embedding_dim": DIM, "num_embeddings": table_sizes(p["cap"]), "dense_arch": [128, DIM], "over_arch": [256, 64, 1]},
            "data": {"paths": [os.path.join(data_dir, "*.tsv")], "epochs": p["epochs"], "batch_size": p["batch_size"], "eval_fraction": 0.01, "shard_rows": 8 * p["batch_size"]},
            "resources": {
                "workers": 1, "ps": PS_FROM, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 1536, "ps_memory_mb": p["ps_memory_mb"],
                "budget_cpu": 1 + PS_PEAK + 0.25, "budget_memory_mb": 1536 + PS_PEAK * p["ps_memory_mb"],
            },
            "train": {"log_every_s": 1.0},
            "policy": {"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.5, "warmup_s": 1.0, "history_dir": os.path.join(ckpt_dir, "history")},
            "checkpoint": {"dir": ckpt_dir, "memory_interval_s": CHECKPOINT_EVERY_S, "interval_s": CHECKPOINT_EVERY_S, "min_interval_s": CHECKPOINT_EVERY_S, "keep_in_memory": False},
        }
    )  # fmt: skip


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def summarize(summary: JobSummary, events: list[Event], sizes: list[int]) -> dict:
    """The bench's result from the job's summary and events."""
    total = model_bytes(sizes)
    rss: dict[str, float] = {}
    for e in events:
        if e.kind == "ps_metrics":
            name = str(e.actor).rsplit("/", 1)[-1]
            rss[name] = max(rss.get(name, 0.0), float(e.fields["rss_mb"]))
    scales = [
        {
            "kind": e.kind.value, "summary": describe_change(e.old, e.new), "bytes_moved": e.timings.get("bytes_moved", 0), "copy_s": e.timings.get("copy_s"),
            "precopy_gb_per_s": (e.timings.get("migration_bytes_per_s") or 0.0) / 1e9, "pause_s": e.timings.get("pause_s"),
            "duration_s": e.duration_s, "launch_s": e.timings.get("launch_s"), "vshards_moved": e.timings.get("vshards_moved", 0),
        }
        for e in summary.scale_events
    ]  # fmt: skip
    durable = [{"bytes": e.fields["bytes"], "write_s": e.fields["write_s"], "link": e.fields.get("link")} for e in events if e.kind == "checkpoint_durable"]
    cuts = [{"at_s": e.at_s, "pause_s": e.fields["pause_s"], "samples": e.fields["samples"]} for e in events if e.kind == "checkpoint"]
    return {
        "status": summary.status, "model_bytes": total, "table_rows": sum(sizes), "dim": DIM,
        "samples": summary.samples_trained, "samples_per_s": summary.throughput_samples_per_s, "auc": summary.auc,
        "ps_rss_mb": dict(sorted(rss.items())), "model_mb_per_ps_at_4": total / PS_FROM / 2**20, "model_mb_per_ps_at_6": total / PS_PEAK / 2**20,
        "scales": scales, "checkpoints": cuts, "durable_checkpoints": durable, "ps_bags_updated": summary.ps_bags_updated,
        "bags_expected": 26 * summary.samples_expected, "wall_s": summary.wall_time_s,
    }  # fmt: skip


def _start_ray(spec: JobSpec, model: int) -> bool:
    """An embedded Ray whose logical memory is what the job's actors ask for at the peak of
    a rescale (old and new PS at once), not Ray's default share of this machine (memory
    requests are a scheduling budget; the bench reports what the PS really use), and
    whose object store holds one checkpoint being written and a rescale's vshards in
    flight (``model`` bytes and 2 GB: a checkpoint alone fills it past 80%, where Ray
    starts spilling objects to disk, with 1 GB) rather than 30% of the machine: the
    rest is the PS's. The store is populated at start (see ``init_ray``)."""
    from dlrover.driver.runner import init_ray

    r = spec.resources
    memory_mb = r.workers * r.worker_memory_mb + (PS_FROM + PS_PEAK) * r.ps_memory_mb
    return init_ray(spec, None, memory_mb=memory_mb, object_store_mb=model // 2**20 + 2048, populate_store=True)


def run_bigtable_bench(quick: bool = False, work_dir: str | None = None) -> dict:
    from dlrover.data.synth import SynthConfig, generate
    from dlrover.driver.runner import run_job

    p = QUICK if quick else FULL
    sizes = table_sizes(p["cap"])
    own = work_dir is None
    work = work_dir or tempfile.mkdtemp(prefix="dlrover-bigtable-")
    try:
        data = os.path.join(work, "data")
        if not os.path.exists(os.path.join(data, "synth.json")):
            _log(f"generating {p['rows']:,} synthetic rows with vocabularies up to {p['cap']:,} -> {data}")
            generate(data, SynthConfig(rows=p["rows"], files=4, seed=17, vocab_sizes=sizes), progress=False)
        ckpt = os.path.join(work, "ckpt")
        spec = bigtable_spec(data, ckpt, p)
        _log(f"job: {spec.model_short()}, {model_bytes(sizes) / 1e9:.2f} GB of tables + optimizer state over {PS_FROM} PS, PS {PS_FROM}->{PS_PEAK}->{PS_FROM}")
        started = _start_ray(spec, model_bytes(sizes))
        try:
            doc, path = run_job(spec, runs_dir=os.path.join(work, "runs"), progress="none", stop_when=JobProgress("bigtable"))
        finally:
            if started:
                import ray

                ray.shutdown()
        summary = JobSummary.from_json(doc)
        events = [e for _, e in read_events(path.parent / "events.jsonl")]
        if summary.status != "succeeded":
            raise BigTableBenchError(f"bench bigtable: the job ended {summary.status} (events: {path.parent / 'events.jsonl'})")
        return summarize(summary, events, sizes)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def print_bigtable(r: dict) -> None:
    print(f"big tables: {r['table_rows']:,} rows x dim {r['dim']} + row-wise Adagrad = {r['model_bytes'] / 1e9:.2f} GB; {r['samples']:,} samples at {r['samples_per_s']:,.0f}/s, auc {r['auc']:.4f}")
    print(f"  bag updates {r['ps_bags_updated']:,} of {r['bags_expected']:,} expected")
    print(f"  model per PS: {r['model_mb_per_ps_at_4']:,.0f} MB at {PS_FROM} PS, {r['model_mb_per_ps_at_6']:,.0f} MB at {PS_PEAK} PS")
    print("  peak RSS per PS (MB): " + ", ".join(f"{k} {v:,.0f}" for k, v in r["ps_rss_mb"].items()))
    for s in r["scales"]:
        print(
            f"  {s['kind']} {s['summary']}: moved {s['bytes_moved'] / 1e9:.2f} GB ({s['vshards_moved']} vshards), pre-copy "
            f"{s['precopy_gb_per_s']:.2f} GB/s, pause {s['pause_s']:.2f}s, launch {s['launch_s'] or 0:.1f}s, total {s['duration_s']:.1f}s"
        )
    for c in r["checkpoints"]:
        print(f"  checkpoint at {c['at_s']:.0f}s ({c['samples']:,} samples in): pause {c['pause_s']:.2f}s")
    for c in r["durable_checkpoints"]:
        print(f"  durable checkpoint ({(c['link'] or 'full')}): {c['bytes'] / 1e9:.2f} GB in {c['write_s']:.1f}s")
