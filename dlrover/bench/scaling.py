"""``dlrover bench scaling``: samples/s of the throughput bench's DLRM over a grid of
(workers, PS), one real job per point, with the workers' own per-step breakdown.

Each point is a whole dlrover job on an embedded local Ray (1 CPU per worker and per PS,
static policy: nothing rescales), over the same synthetic data as ``bench throughput``.
Samples/s is the job's training loop only (first batch to last update, from its summary),
so Ray start-up and actor creation are excluded. The breakdown (compute, pull wait, push,
dense wait, ...) comes from the ``worker_exit`` events, the counters each worker keeps for
its whole run, so a point says where its time went and not only how fast it was.
Efficiency is samples/s over ``workers x`` the 1 worker + 1 PS figure.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

from dlrover.bench.progress import JobProgress, bench_data
from dlrover.errors import DLRoverError
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import Event, JobSummary
from dlrover.spec import JobSpec

Grid = list[tuple[int, int]]
BATCH_SIZE = 2048
STEPS = 150  # per worker at the grid's largest worker count: every point trains the same rows
QUICK_STEPS = 20
# worker_exit counter (seconds over the run) -> row field (ms per step)
BREAKDOWN = {
    "compute_s": "compute_ms",
    "wait_pull_s": "wait_pull_ms",
    "push_s": "push_ms",
    "wait_dense_s": "wait_dense_ms",
    "issue_pull_s": "issue_pull_ms",
    "wait_data_s": "wait_data_ms",
    "route_s": "route_ms",  # on the input thread: off the step's critical path, not off the CPU
}


class ScalingBenchError(DLRoverError):
    """A grid point's job did not succeed (one ``error:`` line, exit non-zero)."""


def parse_grid(text: str) -> Grid:
    """``"1x1,2x1,2x2"`` -> ``[(1, 1), (2, 1), (2, 2)]``; ValueError naming the bad part."""
    grid: Grid = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*", part)
        point = (int(m[1]), int(m[2])) if m else (0, 0)
        if min(point) < 1:
            raise ValueError(f"expected WORKERSxPS pairs of positive integers separated by commas (e.g. 1x1,2x2), got {part.strip()!r} in {text!r}")
        if point in grid:
            raise ValueError(f"{part.strip()!r} appears twice in {text!r}")
        grid.append(point)
    return grid


def default_grid(cores: int) -> Grid:
    """The points this machine can run: workers doubling, then PS, up to half the cores as
    workers and a quarter (at least 2) as PS: the dense PS, master and input threads need
    the rest. Below 4 cores the full {1,2} x {1,2} square instead, oversubscribed: 1x2
    separates the PS's share from the workers'."""
    if cores < 4:
        return [(1, 1), (2, 1), (1, 2), (2, 2)]
    max_w, max_p = cores // 2, max(2, cores // 4)
    grid, (w, p) = [(1, 1)], (1, 1)
    while True:
        w, p = (2 * w, p) if w == p else (w, 2 * p)
        if w > max_w or p > max_p:
            return grid
        grid.append((w, p))


def scaling_spec(data_dir: str, rows: int, workers: int, ps: int, batch_size: int = BATCH_SIZE) -> JobSpec:
    """The throughput bench's job, with ``workers`` x 1 CPU and ``ps`` x 1 CPU. Shards of 4
    batches (not 16): the last shards of a run keep every worker busy to near the end."""
    from dlrover.bench.throughput import bench_spec

    spec = bench_spec(data_dir, rows, batch_size, workers_cpu=1.0, ps_cpu=1.0)
    return spec.model_copy(
        update={
            "name": f"bench-scaling-{workers}w{ps}p",
            "resources": spec.resources.model_copy(update={"workers": workers, "ps": ps}),
            "data": spec.data.model_copy(update={"shard_rows": 4 * batch_size}),
            "policy": spec.policy.model_copy(update={"name": "static"}),
        }
    )


def breakdown(events: list[Event], train_time_s: float, workers: int) -> dict:
    """Per-step ms of each counter over all workers' steps; ``step_ms``: workers x training
    time / steps. The counters are not subtracted from it: they include each worker's wait
    for its first shard and its first (warm-up) step, which the job's training time does
    not, so on short runs they can add up to more than ``step_ms``."""
    exits = [e.fields for e in events if e.kind == "worker_exit"]
    steps = sum(int(e.get("steps") or 0) for e in exits)
    out: dict = {"steps": steps}
    for key, name in BREAKDOWN.items():
        out[name] = 1000.0 * sum(float(e.get(key) or 0.0) for e in exits) / steps if steps else None
    out["step_ms"] = 1000.0 * train_time_s * workers / steps if steps else None
    # PS busy share: each PS's first report has no earlier one to difference with (0).
    seen: set[str] = set()
    busy = []
    for e in events:
        if e.kind == "ps_metrics":
            if e.actor in seen:
                busy.append(float(e.fields.get("busy") or 0.0))
            seen.add(e.actor)
    out["ps_busy"] = sum(busy) / len(busy) if busy else None
    return out


def run_point(data_dir: str, rows: int, workers: int, ps: int, runs_dir: str, batch_size: int = BATCH_SIZE) -> dict:
    """One job; its row of the table."""
    from dlrover.driver.runner import run_job

    name = f"{workers}w+{ps}p"
    try:
        doc, path = run_job(scaling_spec(data_dir, rows, workers, ps, batch_size), runs_dir=runs_dir, progress="none", stop_when=JobProgress(name))
    except DLRoverError as e:
        raise ScalingBenchError(f"{name} run failed: {e}") from None
    summary = JobSummary.from_json(doc)
    changes, failures = len(summary.scale_events), len(summary.failures)
    if summary.status != "succeeded" or changes or failures:  # a point measures one configuration
        raise ScalingBenchError(f"{name} run ended {summary.status} with {changes} scale events and {failures} failures (summary: {path})")
    events = [e for _, e in read_events(Path(path).parent / "events.jsonl")]
    return {
        "workers": workers,
        "ps": ps,
        "samples_per_s": summary.throughput_samples_per_s,
        "train_time_s": summary.train_time_s,
        "samples": summary.samples_trained,
        **breakdown(events, summary.train_time_s, workers),
        "run_dir": str(Path(path).parent),
    }


def run_scaling_bench(grid: Grid | None = None, quick: bool = False, steps: int | None = None, batch_size: int = BATCH_SIZE) -> dict:
    """Every grid point in turn; rows with efficiency, and the 2w+2p / 1w+1p ratio."""
    from dlrover.driver.runner import ensure_data

    cores = os.cpu_count() or 1
    grid = grid or default_grid(cores)
    steps = steps or (QUICK_STEPS if quick else STEPS)
    rows = steps * batch_size * max(w for w, _ in grid)
    data_dir = bench_data(f"criteo-{rows}")
    ensure_data(scaling_spec(data_dir, rows, 1, 1, batch_size))
    runs_dir = tempfile.mkdtemp(prefix="dlrover-bench-scaling-")
    print(f"[bench] summaries and event logs go to {runs_dir}", file=sys.stderr)
    rows_out = []
    for w, p in grid:
        print(f"[bench] {w} worker(s) + {p} PS, 1 CPU each, {rows:,} rows in batches of {batch_size}", file=sys.stderr)
        r = run_point(data_dir, rows, w, p, runs_dir, batch_size)
        rows_out.append(r)
        print(f"[bench]   {r['samples_per_s']:,.0f} samples/s, {r['step_ms']:.1f} ms/step (compute {r['compute_ms']:.1f})", file=sys.stderr)
    by_point = {(r["workers"], r["ps"]): r["samples_per_s"] for r in rows_out}
    base = by_point.get((1, 1))
    for r in rows_out:
        r["efficiency"] = r["samples_per_s"] / (r["workers"] * base) if base else None
    ratio = by_point[(2, 2)] / base if base and (2, 2) in by_point else None
    return {"cores": cores, "rows_per_run": rows, "batch_size": batch_size, "quick": quick, "rows": rows_out, "ratio_2w2p_vs_1w1p": ratio}


def print_scaling(r: dict) -> None:
    def g(v, fmt=".1f") -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    print(f"{r['rows_per_run']:,} rows per run, batch {r['batch_size']}, {r['cores']} cores; per-step ms from the workers' counters")
    head = ["workers", "PS", "samples/s", "eff.", "step", "compute", "pull wait", "push", "dense wait", "issue pull", "input", "routing", "PS busy"]
    print("".join(f"{h:>11s}" for h in head))
    for x in r["rows"]:
        cells = [str(x["workers"]), str(x["ps"]), f"{x['samples_per_s']:,.0f}", g(x["efficiency"], ".2f")]
        cells += [g(x[k]) for k in ("step_ms", "compute_ms", "wait_pull_ms", "push_ms", "wait_dense_ms", "issue_pull_ms", "wait_data_ms", "route_ms")]
        cells.append(g(x["ps_busy"], ".2f"))
        print("".join(f"{c:>11s}" for c in cells))
    if r["ratio_2w2p_vs_1w1p"] is not None:
        print(f"2 workers + 2 PS vs 1 worker + 1 PS: {r['ratio_2w2p_vs_1w1p']:.2f}x (goal >= 1.3)")
