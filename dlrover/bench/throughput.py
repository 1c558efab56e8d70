"""``dlrover bench throughput``: dlrover vs single-process TorchRec on the same cores.

Both sides train the same DLRM (26 tables, dim 16, MLP 512-256) on the same synthetic
Criteo files, read through the same reader, with the same batch size and optimizers, for
one epoch over the same rows, and are scored on the same held-out rows. ``--job`` puts a
job file's model (DLRM or DCN), schema, data and batch size in their place. The baseline is a
plain training loop in this process over a ``FusedEmbeddingBagCollection``, with one
intra-op thread and with every core (the faster counts). dlrover runs its real actors on
an embedded local Ray in each actor layout that fits the cores: one worker whose MLP uses
every core (intra-op threads), and one single-threaded worker per core (data parallel),
each with one PS. The fastest layout whose held-out AUC is within ``AUC_TOLERANCE`` of the
baseline's is dlrover's figure: a layout that is faster only by learning worse does not
count. Timings start at the first batch and end at the last update (Ray start-up and
actor creation excluded, data reading included).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from dlrover.errors import DLRoverError
from dlrover.runlogs.records import JobSummary
from dlrover.spec import JobSpec, spec_from_dict
from dlrover.bench.progress import bench_data

AUC_TOLERANCE = 0.005  # the fault tests' tolerance for "learns what the reference learns"
EVAL_FRACTION = 0.1


@dataclass(frozen=True)
class Layout:
    """How dlrover spreads the job over the cores (by default with one embedding PS: on
    Criteo's layout it is 10-20% busy, and a second one costs more routing than it serves)."""

    workers: int
    worker_cpu: float
    ps: int = 1

    @property
    def label(self) -> str:
        return f"{self.workers}w x {self.worker_cpu:g}cpu + {self.ps}ps"


def layouts(cores: int, job: Layout | None = None) -> list[Layout]:
    """Intra-op threads in one worker, and (with more than one core) one single-threaded
    worker per core: on CPUs the second often wins, since an OpenMP team stalls whenever
    any of its threads is preempted by the PS or an input thread. A job's own layout
    (``--job``) is measured too."""
    out = [Layout(1, float(cores))]
    if cores > 1:
        out.append(Layout(cores, 1.0))
    return out + ([job] if job is not None and job not in out else [])


def bench_spec(
    data_dir: str, rows: int, batch_size: int, workers_cpu: float = 1.0, ps_cpu: float = 1.0, workers: int = 1, eval_fraction: float = 0.0
) -> JobSpec:
    """The bench's job. Shards of 4 batches with several workers, so that the last shards
    keep every worker busy to near the end; 16 with one."""
    return spec_from_dict(
        {
            "name": "bench-throughput",
            "model": {"embedding_dim": 16, "num_embeddings": 100_000, "dense_arch": [512, 256, 16], "over_arch": [512, 256, 1]},
            "data": {
                "paths": [os.path.join(data_dir, "*.tsv")],
                "synth": {"out": data_dir, "rows": rows, "files": 2, "seed": 1},
                "epochs": 1,
                "batch_size": batch_size,
                "eval_fraction": eval_fraction,
                "shard_rows": batch_size * (16 if workers == 1 else 4),
                "shuffle": False,
            },
            "resources": {"workers": workers, "ps": 1, "worker_cpu": workers_cpu, "ps_cpu": ps_cpu},
        }
    )


@dataclass
class Measured:
    samples_per_s: float
    auc: float | None


def measure_baseline(spec: JobSpec, threads: int) -> Measured:
    """The single-process TorchRec loop over every training row once, as the dlrover job
    trains them (each file's last batch may be short): samples/s after 3 warm-up steps,
    then held-out AUC."""
    from dlrover.bench.baseline import build_local_model, evaluate_local, train_step
    from dlrover.data.plan import DataPlan
    from dlrover.data.reader import FileReader

    torch.set_num_threads(threads)
    plan = DataPlan.build(spec)
    reader = FileReader(layout=spec.layout())
    sizes = spec.schema
    model, opt = build_local_model(spec)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    b = spec.data.batch_size
    ranges = [(p, a, min(a + b, n)) for p, n in plan.train_rows.items() for a in range(0, n, b)]
    warm = 3
    samples, t0 = 0, time.perf_counter()
    for i, (path, a, z) in enumerate(ranges):
        if i == warm:
            t0 = time.perf_counter()
            samples = 0
        batch, _ = reader.read(plan.files[path], a, z)
        train_step(model, opt, loss_fn, batch, sizes)
        samples += len(batch)
    speed = samples / (time.perf_counter() - t0)
    return Measured(speed, evaluate_local(model, plan, reader, spec).get("auc"))


def measure_dlrover(spec: JobSpec, runs_dir: str) -> Measured:
    from dlrover.driver.runner import run_job

    doc, _ = run_job(spec, runs_dir=runs_dir, progress="none")
    summary = JobSummary.from_json(doc)
    if summary.status != "succeeded":
        raise RuntimeError(f"dlrover bench job ended {summary.status}")
    return Measured(summary.throughput_samples_per_s, summary.auc)


def job_bench_spec(path: str, layout: Layout) -> JobSpec:
    """A job file as the bench runs it: one epoch, in order, the static policy, in ``layout``."""
    sets = {"data.epochs": 1, "data.shuffle": False, "policy.name": "static", "resources.workers": layout.workers,
            "resources.worker_cpu": layout.worker_cpu, "resources.ps": layout.ps, "resources.ps_cpu": 1}  # fmt: skip
    return JobSpec.from_yaml(path, sets)


def run_throughput_bench(rows: int | None = None, batch_size: int | None = None, steps: int | None = None, job: str | None = None) -> dict:
    """Baseline (1 thread, every core), each dlrover layout, the baseline again (the
    machine is noisy: the best baseline run counts). ``job``: a job file to compare on
    instead (its model, data and batch size; one epoch)."""
    cores = os.cpu_count() or 1
    if job is not None:
        if rows is not None or batch_size is not None or steps is not None:
            raise DLRoverError("bench throughput: --rows, --batch-size and --steps do not apply with --job (the job's data and batch size are used)")
        from dlrover.spec import load_spec

        own = load_spec(job).resources
        job_layout = Layout(own.workers, own.worker_cpu, own.ps)
        spec_for: Callable[[Layout], JobSpec] = lambda layout: job_bench_spec(job, layout)  # noqa: E731
    else:
        batch_size = batch_size or 2048
        train_rows = min(rows or 1_000_000, (steps or 300) * batch_size)
        total = int(np.ceil(train_rows / (1 - EVAL_FRACTION) / 2)) * 2  # 2 files, each split
        data_dir = bench_data(f"criteo-{total}")
        job_layout = None
        spec_for = lambda layout: bench_spec(data_dir, total, batch_size, workers_cpu=layout.worker_cpu, workers=layout.workers, eval_fraction=EVAL_FRACTION)  # noqa: E731

    from dlrover.data.plan import DataPlan
    from dlrover.driver.runner import ensure_data

    first = spec_for(Layout(1, 1.0))
    ensure_data(first)
    train_rows = sum(DataPlan.build(first).train_rows.values())
    runs: list[tuple[Measured, int]] = []

    def baseline(threads: int) -> None:
        print(f"[bench] baseline: single-process TorchRec, {threads} thread(s), {train_rows:,} training rows", file=sys.stderr)
        runs.append((measure_baseline(first, threads=threads), threads))
        print(f"[bench]   {runs[-1][0].samples_per_s:,.0f} samples/s, held-out AUC {runs[-1][0].auc:.4f}", file=sys.stderr)

    for threads in sorted({1, cores}):
        baseline(threads)
    rows_out = []
    for layout in layouts(cores, job_layout):
        print(f"[bench] dlrover: {layout.label}, {train_rows:,} training rows", file=sys.stderr)
        with tempfile.TemporaryDirectory() as runs_dir:
            got = measure_dlrover(spec_for(layout), runs_dir)
        print(f"[bench]   {got.samples_per_s:,.0f} samples/s, held-out AUC {got.auc:.4f}", file=sys.stderr)
        rows_out.append({"layout": layout.label, "workers": layout.workers, "worker_cpu": layout.worker_cpu, "ps": layout.ps,
                         "samples_per_s": got.samples_per_s, "auc": got.auc})  # fmt: skip
    baseline(max(runs, key=lambda r: r[0].samples_per_s)[1])
    base, base_threads = max(runs, key=lambda r: r[0].samples_per_s)
    best = rate_layouts(rows_out, base)
    return {
        "dlrover_samples_per_s": best["samples_per_s"] if best else None,
        "dlrover_layout": best["layout"] if best else None,
        "baseline_samples_per_s": base.samples_per_s,
        "baseline_auc": base.auc,
        "ratio": best["ratio"] if best else None,
        "layouts": rows_out,
        "baseline_runs": [{"threads": t, "samples_per_s": m.samples_per_s, "auc": m.auc} for m, t in runs],
        "job": job or "synthetic Criteo, DLRM (26 tables x 100k rows, dim 16)",
        "model": first.model_short(),
        "batch_size": first.data.batch_size,
        "train_rows": train_rows,
        "cores": cores,
        "baseline_threads": base_threads,
    }


def rate_layouts(rows: list[dict], base: Measured) -> dict | None:
    """Give each layout's row its ratio to the baseline and whether it counts (held-out AUC
    at most ``AUC_TOLERANCE`` below the baseline's); the fastest that counts, or None."""
    for r in rows:
        r["ratio"] = r["samples_per_s"] / base.samples_per_s
        r["auc_delta"] = r["auc"] - base.auc if r["auc"] is not None and base.auc is not None else None
        r["counts"] = r["auc_delta"] is not None and r["auc_delta"] >= -AUC_TOLERANCE
    counted = [r for r in rows if r["counts"]]
    return max(counted, key=lambda r: r["samples_per_s"]) if counted else None


def print_throughput(result: dict) -> None:
    print(f"{result['job']}: {result['model']}, {result['train_rows']:,} training rows, batch {result['batch_size']}, {result['cores']} cores")
    print(f"baseline (single-process TorchRec, FusedEmbeddingBagCollection, {result['baseline_threads']} thread(s)): "
          f"{result['baseline_samples_per_s']:,.0f} samples/s, held-out AUC {result['baseline_auc']:.4f}")  # fmt: skip
    for r in result["layouts"]:
        note = "" if r["counts"] else f"  (not counted: AUC more than {AUC_TOLERANCE} below the baseline's)"
        print(f"dlrover {r['layout']:<22} {r['samples_per_s']:>9,.0f} samples/s  ratio {r['ratio']:.3f}  AUC {r['auc']:.4f} ({r['auc_delta']:+.4f}){note}")
    if result["ratio"] is None:
        print("ratio dlrover/baseline: none (no layout learned what the baseline learns)")
    else:
        print(f"ratio dlrover/baseline: {result['ratio']:.3f} ({result['dlrover_layout']})")


def cores_default() -> int:
    """The worker gets every core for its MLP (the PS actor shares them: it is busy ~10%)."""
    return os.cpu_count() or 1
