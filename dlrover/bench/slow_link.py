"""``dlrover bench slow-link``: adaptive pull-ahead behind a slow link (issue 17, item 5).

The slow-PS bench's job (1 worker, 2 PS, same rows) three times: fault-free; with
``chaos: {action: latency, target: "ps:1", ms: N}`` from ``at_s`` (ps:1's answers reach
the worker N ms after its pulls went out, the PS free meanwhile) at the fixed staleness
of one batch; and the same with ``train.max_staleness`` (pulls run further ahead while
they keep the worker waiting). Samples/s over the worker's metrics windows from the
fault's time on (steady state on each side), the deepest pull-ahead, AUC, and bag
updates per sample (26: each exactly once).
"""

from __future__ import annotations

import os
import sys
import tempfile

from dlrover.bench.progress import bench_data, run_bench_job
from dlrover.bench.slow_ps import SETTLE_S, slow_ps_spec, window_rate
from dlrover.spec import JobSpec, spec_from_dict
from dlrover.worker.window import WorkerReport


def slow_link_spec(data_dir: str, rows: int, latency_ms: float, max_staleness: int, at_s: float, history_dir: str) -> JobSpec:
    """The slow-PS bench's job with a link latency on ``ps:1`` (none when 0)."""
    doc = slow_ps_spec(data_dir, rows, 0.0, at_s, history_dir).model_dump()
    doc["name"] = "bench-slow-link"
    doc["train"]["max_staleness"] = max_staleness
    doc["chaos"] = [{"at_s": at_s, "action": "latency", "target": "ps:1", "ms": latency_ms}] if latency_ms > 0 else []
    return spec_from_dict(doc, "bench slow-link")


def run_slow_link_bench(rows: int = 819_200, latency_ms: float = 200.0, max_staleness: int = 4, at_s: float = 3.0) -> dict:
    """The three runs, one row each (see the module docstring)."""
    from dlrover.driver.runner import ensure_data

    data_dir = bench_data(f"criteo-{rows}")
    done = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, latency, bound in [("fault-free", 0.0, 1), ("slow link, staleness 1", latency_ms, 1), (f"slow link, max_staleness {max_staleness}", latency_ms, max_staleness)]:
            spec = slow_link_spec(data_dir, rows, latency, bound, at_s, os.path.join(tmp, f"h{len(done)}"))
            ensure_data(spec)
            print(f"[bench] {label}: 1 worker + 2 PS, {rows:,} rows", file=sys.stderr, flush=True)
            done.append((label, latency, bound, *run_bench_job(spec, os.path.join(tmp, f"run{len(done)}"), label, "slow-link")))
    # From each run's fault on (chaos time counts from the first launch, so its job time
    # varies with start-up), the fault-free run from the first faulted run's: steady state.
    first = next((c["job_s"] for *_, s, _ in done for c in s.chaos), at_s)
    runs = []
    for label, latency, bound, s, events in done:
        start = next((c["job_s"] for c in s.chaos), first) + SETTLE_S
        windows = [WorkerReport.from_json(e.to_json()) for e in events if e.kind == "metrics" and "samples" in e.fields]
        end = max((w.at_s or 0.0 for w in windows), default=0.0)
        waits = [w.wait_ps_s for w in windows if (w.at_s or 0.0) > start]
        runs.append({
            "run": label, "latency_ms": latency, "max_staleness": bound, "samples_per_s": window_rate(events, start, end),
            "pull_ahead_peak": max((e.fields.get("pull_ahead_peak", 1) for e in events if e.kind == "worker_exit"), default=None),
            "wait_ps_ms": 1000 * sum(waits) / max(1, len(waits)),
            "auc": s.auc, "samples_lost": s.samples_lost, "bags_updated_per_sample": s.ps_bags_updated / max(s.samples_trained, 1),
        })  # fmt: skip
    ref = runs[0]["samples_per_s"]
    for r in runs:
        r["ratio"] = r["samples_per_s"] / ref if r["samples_per_s"] and ref else None
        r["auc_delta"] = r["auc"] - runs[0]["auc"] if r["auc"] is not None and runs[0]["auc"] is not None else None
    return {"rows": rows, "latency_ms": latency_ms, "max_staleness": max_staleness, "at_s": at_s, "runs": runs}


def print_slow_link(r: dict) -> None:
    def f(v, fmt):
        return format(v, fmt) if v is not None else "n/a"

    print(f"slow link: ps:1's answers {r['latency_ms']:g} ms after the pull from {r['at_s']:g} s; samples/s over the windows from then on")
    print(f"  {'run':<28} {'samples/s':>10} {'ratio':>6} {'wait ms/step':>12} {'peak ahead':>10} {'AUC':>7} {'delta':>8} {'bags/sample':>11}")
    for x in r["runs"]:
        print(f"  {x['run']:<28} {f(x['samples_per_s'], ',.0f'):>10} {f(x['ratio'], '.2f'):>6} {x['wait_ps_ms']:>12.1f} {f(x['pull_ahead_peak'], 'd'):>10}"
              f" {f(x['auc'], '.4f'):>7} {f(x['auc_delta'], '+.4f'):>8} {x['bags_updated_per_sample']:>11.2f}")  # fmt: skip
