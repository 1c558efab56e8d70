"""``dlrover bench dense-sync``: the dense PS's round modes with and without a slow worker
(issue 17, item 4, live).

The throughput bench's DLRM with ``--workers`` workers of half a CPU and one PS trains the
same rows six times: ``train.dense_sync`` async, sync and coded (ignore-stragglers, one
straggler per round), each fault-free and with ``chaos: slow`` making ``worker:0``
``--slow-factor`` times slower from the start. Periodic evaluation (every
``EVAL_EVERY_STEPS`` steps, on a fixed slice of the held-out rows) gives an AUC curve; the
bench reports each run's training time, samples/s, final AUC (all held-out rows), rounds
and dropped gradients, and when (seconds after its first step) its curve first reached
the target: the fault-free sync run's last periodic AUC less 0.005.
"""

from __future__ import annotations

import os
import sys
import tempfile

from dlrover.bench.progress import bench_data, run_bench_job
from dlrover.spec import JobSpec

BATCH_SIZE = 1024
EVAL_EVERY_STEPS = 16
AUC_SLACK = 0.005
MODES = ("async", "sync", "coded")


def dense_sync_spec(data_dir: str, rows: int, workers: int, mode: str, slow_factor: float) -> JobSpec:
    """The bench job in ``mode``, ``worker:0`` slowed by ``slow_factor`` (1: fault-free)."""
    from dlrover.bench.throughput import bench_spec
    from dlrover.spec import spec_from_dict

    doc = bench_spec(data_dir, rows, BATCH_SIZE, workers_cpu=0.5, ps_cpu=1.0, workers=workers, eval_fraction=0.1).model_dump()
    doc["name"] = f"bench-dense-{mode}"
    doc["data"]["eval_every_steps"] = EVAL_EVERY_STEPS
    doc["train"].update(dense_sync=mode, stragglers=1, log_every_s=0.5)
    doc["chaos"] = [{"at_s": 0, "action": "slow", "target": "worker:0", "factor": slow_factor}] if slow_factor > 1 else []
    return spec_from_dict(doc, "bench dense-sync")


def first_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """Time (s after the first step) of the first periodic evaluation at or above
    ``target`` (None: never)."""
    return next((t for t, auc in curve if auc >= target), None)


def run_dense_sync_bench(rows: int = 960_000, workers: int = 4, slow_factor: float = 4.0) -> dict:
    """The six runs; one row each, with the target and time to it (see the module docstring)."""
    from dlrover.driver.runner import ensure_data

    data_dir = bench_data(f"criteo-{rows}")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            for factor in (1.0, slow_factor):
                spec = dense_sync_spec(data_dir, rows, workers, mode, factor)
                ensure_data(spec)
                label = f"{mode}, {'fault-free' if factor == 1 else f'worker:0 {factor:g}x slow'}"
                print(f"[bench] {label}: {workers} workers + 1 PS, {rows:,} rows", file=sys.stderr, flush=True)
                s, events = run_bench_job(spec, os.path.join(tmp, f"{mode}-{factor:g}"), label, "dense-sync")
                t0 = min((e.at_s for e in events if e.kind == "first_step"), default=0.0)  # training began
                curve = [(e.at_s - t0, e.fields["auc"]) for e in events if e.kind == "eval" and e.fields.get("periodic") and e.fields.get("auc") is not None]
                rounds = s.dense_rounds or {}
                runs.append({
                    "mode": mode, "slow_factor": factor, "train_s": s.train_time_s, "samples_per_s": s.throughput_samples_per_s,
                    "auc": s.auc, "rounds": rounds.get("rounds"), "ignored": rounds.get("ignored", 0),
                    "dense_updates": s.dense_updates, "curve": curve,
                })  # fmt: skip
    ref = next(r for r in runs if r["mode"] == "sync" and r["slow_factor"] == 1)
    target = (ref["curve"][-1][1] if ref["curve"] else ref["auc"]) - AUC_SLACK
    for r in runs:
        r["target_reached_s"] = first_reach(r["curve"], target)
    return {"rows": rows, "workers": workers, "slow_factor": slow_factor, "target_auc": target, "runs": runs}


def print_dense_sync(r: dict) -> None:
    def f(v, fmt):
        return format(v, fmt) if v is not None else "never"

    print(f"dense-sync: {r['workers']} workers x 0.5 CPU + 1 PS, {r['rows']:,} rows; slow = worker:0 {r['slow_factor']:g}x slower")
    print(f"target AUC {r['target_auc']:.4f} (fault-free sync's last periodic AUC - {AUC_SLACK}), on the periodic evaluation's slice")
    print(f"  {'mode':6} {'worker:0':>9} {'train s':>8} {'samples/s':>10} {'AUC':>7} {'rounds':>7} {'dropped':>8} {'to target':>10}")
    for x in r["runs"]:
        slow = "fine" if x["slow_factor"] == 1 else f"{x['slow_factor']:g}x slow"
        print(f"  {x['mode']:6} {slow:>9} {x['train_s']:8.1f} {x['samples_per_s']:10,.0f} {f(x['auc'], '.4f'):>7} "
              f"{f(x['rounds'], 'd') if x['rounds'] is not None else '-':>7} {x['ignored']:8d} {f(x['target_reached_s'], '.1f'):>10}")  # fmt: skip
