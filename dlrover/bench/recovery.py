"""``dlrover bench recovery``: partial PS recovery, rollback, and restart-from-checkpoint.

The same job (2 workers + 2 PS, synthetic Criteo) runs three times under the same fixed
fault schedule (``chaos:`` kills of workers and PS at fixed times after the job's actors
first started), with the same durable checkpoint cadence (``checkpoint.interval_s``):

- partial (``recovery.ps: partial``, the default): a dead worker is replaced while the
  others train on (its shards resume from its progress); a dead PS alone goes back to the
  newest in-memory checkpoint (``memory_interval_s``), the other PS and the workers keep
  their state, and the dead PS's updates since that checkpoint are lost and counted;
- rollback (``recovery.ps: rollback``): the same, except that a dead PS rolls the whole
  job back to that checkpoint, and the samples since are trained again;
- restart (``checkpoint.on_failure: restart``, what Ray Train does): every failure
  restarts every actor from the last durable checkpoint. It takes its in-memory cuts only
  as often as it writes durable ones (it never rolls back to an in-memory one), so it
  pays no pauses it does not use.

Measured per run, from the job's own failure records: detection (fault -> noticed) and
recovery (noticed -> training again) per fault kind, samples replayed, updates lost, wall
time and ETTR (productive training time / wall time, ``dlrover.metrics.reliability``).
Every run trains every sample, so the wall-time ratios compare the same work. The run
directories (``summary.json``, ``events.jsonl``; durable checkpoints removed) are kept
for a closer look; their path is printed on stderr.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time
from typing import NamedTuple

from dlrover.bench.progress import JobProgress, bench_data
from dlrover.errors import DLRoverError
from dlrover.runlogs.records import JobSummary
from dlrover.spec import JobSpec, spec_from_dict

ROWS = 500_000
DURABLE_INTERVAL_S = 20.0  # every run
MEMORY_INTERVAL_S = 5.0  # the in-memory checkpoints partial recovery and rollback go back to
# (s, target): chaos times count from when the job's actors first started (ChaosEvent),
# so every fault lands in training. No master kills (kept robust). 25 s apart: a
# whole-job restart takes 15-25 s on 2 busy cores, and a fault due while the job is still
# recovering fires right after it (two at once cost the baseline one restart, not two).
SCHEDULE = [(10.0, "worker:0"), (35.0, "ps:1"), (60.0, "worker:1"), (85.0, "ps:0")]
EPOCHS = 14  # 7M samples: > 120 s of training even on a quiet machine, so the last fault lands in training
QUICK_SCHEDULE = [(5.0, "worker:0"), (12.0, "ps:1")]
QUICK_EPOCHS = 2
TABLES = 26  # Criteo's categorical features: bag updates per sample


class Mode(NamedTuple):
    on_failure: str  # checkpoint.on_failure
    ps: str  # recovery.ps
    label: str


RUNS = {
    "partial": Mode("recover", "partial", "partial PS recovery (recovery.ps: partial)"),
    "rollback": Mode("recover", "rollback", "rollback (recovery.ps: rollback)"),
    "restart": Mode("restart", "rollback", "restart-from-checkpoint (checkpoint.on_failure: restart)"),
}


class RecoveryBenchError(DLRoverError):
    """A bench run did not succeed (printed as one ``error:`` line, exit non-zero)."""


def recovery_spec(data_dir: str, mode: Mode, epochs: int, schedule: list[tuple[float, str]]) -> JobSpec:
    memory_interval = MEMORY_INTERVAL_S if mode.on_failure == "recover" else DURABLE_INTERVAL_S
    return spec_from_dict(
        {
            "name": f"bench-recovery-{mode.on_failure}-{mode.ps}",
            "model": {"embedding_dim": 16, "num_embeddings": 40_000, "dense_arch": [64, 16], "over_arch": [128, 64, 1]},
            "data": {
                "paths": [os.path.join(data_dir, "*.tsv")],
                "synth": {"out": data_dir, "rows": ROWS, "files": 4, "seed": 7},
                "epochs": epochs,
                "batch_size": 2048,
                "eval_fraction": 0.01,
                "shard_rows": 16384,
            },
            "resources": {"workers": 2, "ps": 2, "worker_cpu": 1, "ps_cpu": 1},
            "train": {"log_every_s": 0.5},
            "checkpoint": {
                "memory_interval_s": memory_interval,
                "interval_s": DURABLE_INTERVAL_S,
                "min_interval_s": DURABLE_INTERVAL_S,
                "on_failure": mode.on_failure,
            },
            "recovery": {"ps": mode.ps},
            "chaos": [{"at_s": at, "action": "kill", "target": target} for at, target in schedule],
        }
    )


def _first_line(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e
    lines = [ln.strip() for ln in str(cause).strip().splitlines() if ln.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"


def _one(name: str, spec: JobSpec, runs_dir: str, planned: int) -> tuple[JobSummary, dict]:
    """One run: its summary, and its row of the result."""
    from dlrover.driver.runner import run_job

    label = RUNS[name].label
    try:
        doc, path = run_job(spec, runs_dir=runs_dir, progress="none", stop_when=JobProgress(name))
    except DLRoverError as e:
        raise RecoveryBenchError(f"{label} run failed: {e} (run directory kept: {runs_dir})") from None
    except Exception as e:  # noqa: BLE001 - a job that fails inside Ray: one line, say which run
        raise RecoveryBenchError(f"{label} run failed: {_first_line(e)} (run directory kept: {runs_dir})") from None
    s = JobSummary.from_json(doc)
    if s.status != "succeeded" or s.samples_lost:
        last = s.failures[-1] if s.failures else None
        why = f"; last failure: {last.kind.value} of {last.actor}: {last.cause}" if last else ""
        raise RecoveryBenchError(f"{label} run ended {s.status} with {s.samples_lost:,} samples lost{why} (summary: {path})")
    rel = s.reliability
    by_kind = {k: {**v, "samples_replayed": 0, "updates_lost": 0} for k, v in (rel.by_kind if rel else {}).items()}
    for f in s.failures:
        row = by_kind.setdefault(f.kind.value, {"count": 0, "detect_s_mean": None, "recover_s_mean": None, "samples_replayed": 0, "updates_lost": 0})
        row["samples_replayed"] += int(f.samples_replayed or 0)
        row["updates_lost"] += int(f.updates_lost or 0)
    fired = [c for c in s.chaos if c.get("action") == "kill"]
    ckpts = s.checkpoints
    return s, {
        "on_failure": RUNS[name].on_failure,
        "recovery_ps": RUNS[name].ps,
        "ettr": s.ettr,
        "wall_time_s": s.wall_time_s,
        "train_time_s": s.train_time_s,
        "samples_lost": s.samples_lost,
        "samples_replayed": s.samples_replayed,
        "updates_lost": s.updates_lost,
        "samples_trained": s.samples_trained,
        "auc": s.auc,
        "by_kind": by_kind,
        "downtime_s": rel.downtime_s if rel else None,
        "replay_s": rel.replay_s if rel else None,
        "failures": len(s.failures),
        "faults_fired": len(fired),
        "faults_planned": planned,
        "in_memory_checkpoints": ckpts.get("in_memory_taken"),
        "durable_checkpoints": len(ckpts.get("durable") or []),
        "checkpoint_pause_s_mean": ckpts.get("pause_s_mean"),
    }


def run_recovery_bench(quick: bool = False) -> dict:
    from dlrover.driver.runner import ensure_data

    data_dir = bench_data(f"recovery-{ROWS}")
    epochs, schedule = (QUICK_EPOCHS, QUICK_SCHEDULE) if quick else (EPOCHS, SCHEDULE)
    faults = ", ".join(f"{t} at {at:g}s" for at, t in schedule)
    out: dict = {
        "quick": quick,
        "samples": None,
        "schedule": [{"at_s": at, "action": "kill", "target": t} for at, t in schedule],
        "durable_interval_s": DURABLE_INTERVAL_S,
        "memory_interval_s": MEMORY_INTERVAL_S,
    }
    tmp = tempfile.mkdtemp(prefix="dlrover-bench-recovery-")
    out["runs_dir"] = runs_dir = os.path.join(tmp, "runs")
    summaries: dict[str, JobSummary] = {}
    for name in RUNS:
        spec = recovery_spec(data_dir, RUNS[name], epochs, schedule)
        ensure_data(spec)
        print(f"[bench] {RUNS[name].label}: 2 workers + 2 PS, {epochs} epoch(s) of {ROWS:,} rows; kill {faults}", file=sys.stderr)
        t0 = time.monotonic()
        s, r = _one(name, spec, runs_dir, len(schedule))
        summaries[name] = s
        out[name] = r
        out["samples"] = s.samples_trained
        print(f"[bench]   {name} done in {time.monotonic() - t0:.0f}s: wall {s.wall_time_s:.1f}s, ETTR {s.ettr:.3f}, {r['failures']} failures", file=sys.stderr)
        if r["faults_fired"] != r["faults_planned"]:
            print(f"[bench]   warning: only {r['faults_fired']} of {r['faults_planned']} faults fired before the {name} job ended", file=sys.stderr)
        if r["failures"] < r["faults_fired"]:
            print(f"[bench]   note: {r['faults_fired']} faults fired, {r['failures']} failures recorded: some hit while the {name} job was recovering", file=sys.stderr)
    for ckpt in glob.glob(os.path.join(runs_dir, "*", "checkpoints")):
        shutil.rmtree(ckpt, ignore_errors=True)  # tens of MB each; summaries and events stay
    print(f"[bench] summaries and event logs: {runs_dir}", file=sys.stderr)
    for name in RUNS:
        out[f"ettr_{name}"] = summaries[name].ettr
    p, rb, rs = summaries["partial"], summaries["rollback"], summaries["restart"]
    out["ettr_ratio"] = p.ettr / rb.ettr if rb.ettr else None  # partial / rollback (goal >= 1.2)
    out["ettr_ratio_restart"] = p.ettr / rs.ettr if rs.ettr else None
    out["wall_ratio"] = rb.wall_time_s / p.wall_time_s if p.wall_time_s else None
    # First shard to last: the same ratio without actor start-up, which faults do not touch
    # and which varies by several seconds from run to run on a busy machine.
    out["train_time_ratio"] = rb.train_time_s / p.train_time_s if p.train_time_s else None
    return out


def print_recovery(r: dict) -> None:
    def g(v, fmt=".2f"):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    faults = ", ".join(f"{e['target']} at {e['at_s']:g}s" for e in r["schedule"])
    print(f"2 workers + 2 PS, {r['samples']:,} samples; kill {faults} (after the actors started)")
    print(f"durable checkpoint every {r['durable_interval_s']:g}s in every run; in-memory checkpoint every {r['memory_interval_s']:g}s (partial, rollback)")
    for name, mode in RUNS.items():
        run = r[name]
        print()
        print(mode.label)
        print(f"  {'fault kind':16s}{'count':>6s}{'detect (s)':>12s}{'recover (s)':>13s}{'replayed':>12s}{'updates lost':>14s}")
        for kind, k in sorted(run["by_kind"].items()):
            print(f"  {kind:16s}{k['count']:>6d}{g(k['detect_s_mean']):>12s}{g(k['recover_s_mean']):>13s}{k['samples_replayed']:>12,d}{k['updates_lost']:>14,d}")
        print(
            f"  wall {run['wall_time_s']:.1f}s  ETTR {run['ettr']:.3f}  replayed {run['samples_replayed']:,} samples"
            f"  updates lost {run['updates_lost']:,} ({100 * run['updates_lost'] / max(TABLES * run['samples_trained'], 1):.2f}% of {TABLES} x samples)  AUC {g(run['auc'], '.4f')}"
        )
        print(
            f"  training {run['train_time_s']:.1f}s (first shard to last), of which down {g(run['downtime_s'], '.1f')}s and replaying {g(run['replay_s'], '.1f')}s;"
            f"  faults fired {run['faults_fired']}/{run['faults_planned']}, failures recorded {run['failures']}"
        )
    print()
    print(f"ETTR: partial {g(r['ettr_partial'], '.3f')}, rollback {g(r['ettr_rollback'], '.3f')}, restart {g(r['ettr_restart'], '.3f')}")
    print(f"ETTR ratio partial / rollback: {g(r['ettr_ratio'])}x (goal >= 1.2); partial / restart: {g(r['ettr_ratio_restart'])}x")
    print(f"wall-time ratio (rollback / partial, same samples trained): {g(r['wall_ratio'])}x (training time only: {g(r['train_time_ratio'])}x)")
