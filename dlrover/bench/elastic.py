"""``dlrover bench elastic``: a live rescale against the same rescale done stop-checkpoint-restart.

The same job (1 worker + 1 PS, tables of ``num_embeddings`` rows x 26, so a PS move
carries real bytes) is rescaled to 2 workers + 2 PS once ``at_progress`` of it is done,
twice: live (``policy.rescale: live``: new actors start while training goes on, then
workers park for the vshard move) and stop-checkpoint-restart (``policy.rescale:
restart``: workers stop at shard boundaries, PS are written to disk, everything is
relaunched and restored). Measured per run, from the job's own scale event:

- plan -> first step: from the policy's decision to the first step of a new worker;
- training stall: how long no worker trained (live: the migration pause);
- bytes moved and migration rate: bytes / the whole move (live: pre-copy while training
  goes on + the paused round that copies only rows updated meanwhile; restart: writing
  and reading the checkpoint).
"""

from __future__ import annotations

import os
import sys
import tempfile

from dlrover.runlogs.records import JobSummary
from dlrover.runlogs.scale_record import ScaleKind
from dlrover.spec import JobSpec, spec_from_dict
from dlrover.bench.progress import bench_data


MODES = {  # name: (policy.rescale, policy.standby)
    "live": ("live", 1),  # a pre-started spare worker and PS take the new places
    "live_cold": ("live", 0),  # new actors start from scratch
    "restart": ("restart", 0),
}


def elastic_spec(data_dir: str, rows: int, num_embeddings: int, mode: str, at_progress: float, history_dir: str) -> JobSpec:
    rescale, standby = MODES[mode]
    return spec_from_dict(
        {
            "name": f"bench-elastic-{mode.replace('_', '-')}",
            "model": {"embedding_dim": 16, "num_embeddings": num_embeddings, "dense_arch": [64, 16], "over_arch": [128, 64, 1]},
            "data": {
                "paths": [os.path.join(data_dir, "*.tsv")],
                "synth": {"out": data_dir, "rows": rows, "files": 4, "seed": 2},
                "epochs": 1,
                "batch_size": 2048,
                "eval_fraction": 0.01,
                "shard_rows": 16384,
            },
            "resources": {"workers": 1, "ps": 1, "worker_cpu": 1, "ps_cpu": 1, "ps_memory_mb": 4096, "budget_cpu": 4.25},
            "train": {"log_every_s": 0.5},
            "policy": {
                "name": "scripted",
                "knobs": {"steps": [{"at_progress": at_progress, "workers": 2, "ps": 2}]},
                "interval_s": 0.25,
                "warmup_s": 1.0,
                "rescale": rescale,
                "standby": standby,
                "history_dir": history_dir,
            },
        }
    )


def _one(spec: JobSpec, runs_dir: str) -> dict:
    from dlrover.driver.runner import run_job

    doc, _ = run_job(spec, runs_dir=runs_dir, progress="none")
    summary = JobSummary.from_json(doc)
    if summary.status != "succeeded" or summary.samples_lost:
        raise RuntimeError(f"bench job ended {summary.status} with {summary.samples_lost} samples lost")
    events = [e for e in summary.scale_events if e.kind is not ScaleKind.FAILED]
    if not events:
        raise RuntimeError("the rescale did not happen before the job ended; use more --rows")
    ev = events[0]
    t = ev.timings
    first = min(ev.first_step_s.values(), default=None)
    pause = t.get("pause_s") or 0.0
    copy_s = t.get("copy_s") or ((t.get("checkpoint_s") or 0) + (t.get("restore_s") or 0))
    return {
        "plan_to_first_step_s": first,
        "training_stall_s": pause,
        "launch_s": t.get("launch_s"),
        "bytes_moved": t.get("bytes_moved", 0),
        "bytes_moved_while_paused": t.get("bytes_in_pause", t.get("bytes_moved", 0)),
        "migration_s": copy_s,
        "migration_bytes_per_s": (t["bytes_moved"] / copy_s) if copy_s and t.get("bytes_moved") else None,
        "throughput_samples_per_s": summary.throughput_samples_per_s,
        "samples_lost": summary.samples_lost,
        "event": {k: v for k, v in ev.to_dict().items() if k not in ("from", "to")},
    }


def run_elastic_bench(rows: int = 1_500_000, num_embeddings: int = 400_000, at_progress: float = 0.1) -> dict:
    data_dir = bench_data(f"elastic-{rows}")
    from dlrover.driver.runner import ensure_data

    out: dict = {"rows": rows, "num_embeddings": num_embeddings, "table_bytes": 26 * num_embeddings * 16 * 4}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            spec = elastic_spec(data_dir, rows, num_embeddings, mode, at_progress, os.path.join(tmp, "history"))
            ensure_data(spec)
            print(f"[bench] {mode} (rescale={MODES[mode][0]}, standby={MODES[mode][1]}): 1w+1ps -> 2w+2ps at {at_progress:.0%} of {rows:,} rows, tables 26 x {num_embeddings:,} x 16", file=sys.stderr)
            out[mode] = _one(spec, os.path.join(tmp, "runs"))
            r = out[mode]
            print(f"[bench]   plan->first step {r['plan_to_first_step_s']}s, stall {r['training_stall_s']}s, moved {r['bytes_moved'] / 2**20:.0f} MB", file=sys.stderr)
    restart = out["restart"]
    for mode in ("live", "live_cold"):
        suffix = "" if mode == "live" else "_cold"
        out[f"ratio_plan_to_first_step{suffix}"] = _ratio(restart["plan_to_first_step_s"], out[mode]["plan_to_first_step_s"])
        out[f"ratio_training_stall{suffix}"] = _ratio(restart["training_stall_s"], out[mode]["training_stall_s"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def print_elastic(r: dict) -> None:
    live, cold, rs = r["live"], r["live_cold"], r["restart"]

    def g(v, fmt=".2f"):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    def mb(v):
        return v / 2**20 if v else None

    def gbs(v):
        return v / 2**30 if v else None

    print(f"rescale 1 worker + 1 PS -> 2 workers + 2 PS, tables 26 x {r['num_embeddings']:,} x 16 ({r['table_bytes'] / 2**20:.0f} MB)")
    print("live: with a pre-started spare worker and PS (policy.standby: 1); live cold: new actors start from scratch")
    print(f"{'':28s}{'live':>10s}{'live cold':>11s}{'stop-restart':>14s}{'restart/live':>14s}{'restart/cold':>14s}")
    rows = [
        ("plan -> new worker step (s)", "plan_to_first_step_s", ".2f", r["ratio_plan_to_first_step"], r["ratio_plan_to_first_step_cold"]),
        ("training stall (s)", "training_stall_s", ".3f", r["ratio_training_stall"], r["ratio_training_stall_cold"]),
    ]
    for label, key, fmt, ratio, ratio_cold in rows:
        print(f"{label:28s}{g(live[key], fmt):>10s}{g(cold[key], fmt):>11s}{g(rs[key], fmt):>14s}{g(ratio, '.1f'):>14s}{g(ratio_cold, '.1f'):>14s}")
    print(f"{'bytes moved (MB)':28s}{g(mb(live['bytes_moved']), '.0f'):>10s}{g(mb(cold['bytes_moved']), '.0f'):>11s}{g(mb(rs['bytes_moved']), '.0f'):>14s}")
    paused = "bytes_moved_while_paused"
    print(f"{'  of which while paused (MB)':28s}{g(mb(live[paused]), '.1f'):>10s}{g(mb(cold[paused]), '.1f'):>11s}{g(mb(rs[paused]), '.0f'):>14s}")
    rate = "migration_bytes_per_s"
    print(f"{'migration rate (GB/s)':28s}{g(gbs(live[rate])):>10s}{g(gbs(cold[rate])):>11s}{g(gbs(rs[rate])):>14s}")
    print("goals: live >= 10x faster than stop-restart; migration >= 1 GB/s with a pause <= 0.5 s")
