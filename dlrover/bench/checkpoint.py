"""``dlrover bench checkpoint``: bytes per durable checkpoint (full vs delta vs delta+int8)
and the AUC cost of resuming from an int8 chain.

One job with about 1 GB of embedding state (26 tables x 300k rows x dim 32 in fp32, plus
row-wise Adagrad's accumulator: 1.03 GB) over synthetic Criteo data whose vocabularies
are as large as the tables (Zipf-distributed ids, so an interval touches a head of hot
rows and a thin slice of the tail, as real traffic does). It runs twice, deterministically
(``train.deterministic``: the model is a pure function of the data order, so the two runs
differ only by what the experiment changes):

- uninterrupted: durable checkpoints in fp32 (``quantize: none``); its full and delta
  checkpoints give ``full_bytes`` and ``delta_bytes``, its AUC ``auc_uninterrupted``;
- int8: the same job with ``quantize: int8`` and the master killed mid-run: the restarted
  master resumes from the newest full + deltas on disk, dequantized, and trains on; its
  deltas give ``delta_int8_bytes``, its AUC ``auc_resumed_int8``.

Bytes are read from the checkpoints' manifests (data files + manifest), a checkpoint's
kind from its meta. The interval is in job seconds, so a delta holds exactly the rows the
training between two durable cuts pushed; samples per interval / table rows is about 2%
here, the order of a production job (100k samples/s x 2 min against ~1B rows).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from dlrover.bench.progress import JobProgress, bench_data
from dlrover.checkpoint.manifest import MANIFEST
from dlrover.checkpoint.store import CheckpointStore
from dlrover.errors import DLRoverError
from dlrover.faults.records import Failure, FailureKind
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import JobSummary
from dlrover.spec import JobSpec, spec_from_dict

NUM_EMBEDDINGS, DIM = 300_000, 32  # 26 x 300k x (32 + 1) x 4 B = 1.03 GB
ROWS, EPOCHS = 400_000, 3
INTERVAL_S, MEMORY_INTERVAL_S = 8.0, 4.0
FULL_EVERY = 5
KILL_AFTER = 3  # the master dies half an interval after the 3rd durable cut (a full, 2 deltas)
QUICK = {"rows": 120_000, "epochs": 3, "num_embeddings": 60_000}


class CheckpointBenchError(DLRoverError):
    """A bench run did not succeed (printed as one ``error:`` line, exit non-zero)."""


def table_bytes(num_embeddings: int, dim: int = DIM) -> int:
    """Weights plus row-wise Adagrad state of the 26 tables."""
    return 26 * num_embeddings * (dim + 1) * 4


def checkpoint_spec(data_dir: str, ckpt_dir: str, quantize: str, epochs: int, num_embeddings: int, kill_at_s: float | None) -> JobSpec:
    chaos = [{"at_s": kill_at_s, "action": "kill", "target": "master"}] if kill_at_s is not None else []
    return spec_from_dict(
        {
            "name": f"bench-checkpoint-{quantize}",
            "model": {"embedding_dim": DIM, "num_embeddings": num_embeddings, "dense_arch": [64, DIM], "over_arch": [128, 64, 1]},
            "data": {"paths": [os.path.join(data_dir, "*.tsv")], "epochs": epochs, "batch_size": 2048, "eval_fraction": 0.02, "shard_rows": 16384},
            "resources": {"workers": 1, "ps": 2, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 2048, "ps_memory_mb": 5120},
            "train": {"staleness": 0, "deterministic": True, "log_every_s": 1.0},
            "checkpoint": {
                "dir": ckpt_dir, "memory_interval_s": MEMORY_INTERVAL_S, "interval_s": INTERVAL_S, "min_interval_s": INTERVAL_S,
                "keep": 1000, "full_every": FULL_EVERY, "quantize": quantize,
            },
            "chaos": chaos,
        }
    )


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Written:
    """One durable checkpoint as its manifest records it."""

    step: int
    kind: str  # full | delta
    quantize: str
    rows: int | None  # rows a delta holds
    bytes: int  # data files + manifest


def written(ckpt_root: str) -> list[Written]:
    """Every durable checkpoint under ``ckpt_root`` (one job's), oldest first."""
    store, out = CheckpointStore(ckpt_root, keep=1000), []
    for step in store.list():
        path = os.path.join(store.url(step), MANIFEST)
        with open(path, "rb") as f:
            raw = f.read()
        m = json.loads(raw)
        link = m["meta"].get("link") or {"kind": "full", "quantize": "none", "rows": None}
        nbytes = sum(e["bytes"] for e in m["files"].values()) + len(raw)
        out.append(Written(step, link["kind"], link["quantize"], link["rows"], nbytes))
    return out


def _mean(rows: list[Written], kind: str) -> float | None:
    b = [r.bytes for r in rows if r.kind == kind]
    return float(sum(b) / len(b)) if b else None


def kill_time(events_path: str) -> float:
    """Seconds after the actors started (the chaos clock) at which the master is killed:
    half an interval after the ``KILL_AFTER``-th durable cut of the uninterrupted run (the
    runs share their cadence), and before its training ended."""
    events = [e for _, e in read_events(events_path)]
    launched = next(e.at_s for e in events if e.kind == "launched")
    cuts = sorted(e.at_s for e in events if e.kind == "checkpoint_durable")
    done = max([e.at_s for e in events if e.kind == "checkpoint"] or [launched + INTERVAL_S])
    if not cuts:
        raise CheckpointBenchError(f"{events_path}: the uninterrupted run wrote no durable checkpoint")
    return round(min(cuts[min(KILL_AFTER, len(cuts)) - 1] + INTERVAL_S / 2, done) - launched, 1)


@dataclass(frozen=True)
class Run:
    """One run of the bench: its summary, durable checkpoints, the master deaths it resumed
    from, and its event log's path."""

    summary: JobSummary
    checkpoints: list[Written]
    resumed: list[Failure]
    events: str

    def result(self) -> dict:
        """The run's part of the result (the summary stays on disk; its numbers)."""
        s = self.summary
        return {
            "checkpoints": [asdict(c) for c in self.checkpoints], "resumed": [f.to_dict() for f in self.resumed], "events": self.events,
            "auc": s.auc, "samples_trained": s.samples_trained, "wall_time_s": s.wall_time_s, "samples_replayed": s.samples_replayed,
        }  # fmt: skip


def _run(name: str, spec: JobSpec, runs_dir: str, ckpt_dir: str) -> Run:
    from dlrover.driver.runner import run_job

    try:
        doc, path = run_job(spec, runs_dir=runs_dir, progress="none", stop_when=JobProgress(name))
    except DLRoverError as e:
        raise CheckpointBenchError(f"{name} run failed: {e} (run directory kept: {runs_dir})") from None
    summary = JobSummary.from_json(doc)
    if summary.status != "succeeded" or summary.samples_lost:
        raise CheckpointBenchError(f"{name} run ended {summary.status} with {summary.samples_lost:,} samples lost (summary: {path})")
    (job_dir,) = [os.path.join(ckpt_dir, d) for d in os.listdir(ckpt_dir)]
    resumed = [f for f in summary.failures if f.kind is FailureKind.MASTER_DEATH]
    return Run(summary, written(job_dir), resumed, str(path.parent / "events.jsonl"))


def _both(runs: dict[str, str], out: dict, data_dir: str, tmp: str, epochs: int, n: int) -> None:
    """The uninterrupted run, then the int8 one killed where the first had written
    ``KILL_AFTER`` durable checkpoints; results into ``out``."""
    for name, quantize in runs.items():
        kill_at = out["kill_master_at_s"] = kill_time(out["uninterrupted"].events) if name == "int8_resumed" else None
        ckpt_dir = os.path.join(tmp, f"ckpt-{name}")
        what = f", master killed at {kill_at:g}s" if kill_at is not None else ""
        _log(f"{name}: {table_bytes(n) / 2**30:.2f} GiB of tables, 1 worker + 2 PS, {epochs} x {out['rows']:,} rows, quantize {quantize}{what}")
        t0 = time.monotonic()
        out[name] = r = _run(name, checkpoint_spec(data_dir, ckpt_dir, quantize, epochs, n, kill_at), out["runs_dir"], ckpt_dir)
        kinds = ", ".join(f"{c.kind} {c.bytes / 2**20:.1f} MiB" for c in r.checkpoints)
        _log(f"  {name} done in {time.monotonic() - t0:.0f}s: AUC {r.summary.auc:.4f}; durable: {kinds}")
        if kill_at is not None and not r.resumed:
            _log(f"  warning: the master kill at {kill_at:g}s did not fire before the job ended")


def run_checkpoint_bench(quick: bool = False) -> dict:
    """Both runs; the result holds the numbers ``--json`` prints."""
    from dlrover.data.synth import SynthConfig, generate

    rows, epochs, n = (QUICK["rows"], QUICK["epochs"], QUICK["num_embeddings"]) if quick else (ROWS, EPOCHS, NUM_EMBEDDINGS)
    data_dir = bench_data(f"checkpoint-{rows}-{n}")
    if not os.path.exists(os.path.join(data_dir, "synth.json")):
        _log(f"generating {rows:,} synthetic rows with {n:,}-value vocabularies -> {data_dir}")
        generate(data_dir, SynthConfig(rows=rows, files=4, seed=13, vocab_sizes=[n] * 26), progress=False)
    tmp = tempfile.mkdtemp(prefix="dlrover-bench-checkpoint-")
    runs_dir = os.path.join(tmp, "runs")
    out: dict = {"quick": quick, "table_bytes": table_bytes(n), "num_embeddings": n, "embedding_dim": DIM, "rows": rows,
                 "epochs": epochs, "interval_s": INTERVAL_S, "full_every": FULL_EVERY, "runs_dir": runs_dir}
    runs = {"uninterrupted": "none", "int8_resumed": "int8"}
    try:  # Ray's own warnings (a killed master's retried calls) go to stdout: keep it for the result
        with contextlib.redirect_stdout(sys.stderr):
            _both(runs, out, data_dir, tmp, epochs, n)
    finally:
        for name in runs:
            shutil.rmtree(os.path.join(tmp, f"ckpt-{name}"), ignore_errors=True)  # GBs
    a, b = out["uninterrupted"], out["int8_resumed"]
    out["full_bytes"] = _mean(a.checkpoints, "full")
    out["delta_bytes"] = _mean(a.checkpoints, "delta")
    out["full_int8_bytes"] = _mean(b.checkpoints, "full")
    out["delta_int8_bytes"] = _mean(b.checkpoints, "delta")
    out["auc_uninterrupted"] = a.summary.auc
    out["auc_resumed_int8"] = b.summary.auc
    res = b.resumed[0].checkpoint if b.resumed else None
    kinds = {c.step: c.kind for c in b.checkpoints}
    out["resumed_from"] = None if res is None else {"seq": res.seq, "source": res.source, "kind": kinds.get(res.seq)}
    for name in runs:  # summaries stay on disk; the result keeps the numbers
        out[name] = out[name].result()
    full, d8 = out["full_bytes"], out["delta_int8_bytes"]
    out["ratio_full_to_delta_int8"] = full / d8 if full and d8 else None
    out["ratio_full_to_delta"] = full / out["delta_bytes"] if full and out["delta_bytes"] else None
    out["auc_diff"] = abs(out["auc_resumed_int8"] - out["auc_uninterrupted"])
    _log(f"summaries and event logs: {runs_dir}")
    return out


def print_checkpoint(r: dict) -> None:
    def mib(v: float | None) -> str:
        return f"{v / 2**20:10.1f} MiB" if v else "       n/a"

    def x(v: float | None) -> str:
        return f"{v:.1f}x" if v else "n/a"

    print(f"{r['table_bytes'] / 2**30:.2f} GiB of embedding state (26 x {r['num_embeddings']:,} x dim {r['embedding_dim']} + row-wise Adagrad), "
          f"durable checkpoint every {r['interval_s']:g}s, a full one every {r['full_every']}")
    print(f"bytes per durable checkpoint:  full {mib(r['full_bytes'])}")
    print(f"                               delta {mib(r['delta_bytes'])}  ({x(r['ratio_full_to_delta'])} fewer)")
    print(f"                               delta+int8 {mib(r['delta_int8_bytes'])}  ({x(r['ratio_full_to_delta_int8'])} fewer; goal >= 5x)")
    print(f"                               full+int8 {mib(r['full_int8_bytes'])}")
    res = r["resumed_from"] or {}
    print(f"AUC uninterrupted {r['auc_uninterrupted']:.4f}; resumed from an int8 chain (checkpoint {res.get('seq')}, a {res.get('kind')}) "
          f"{r['auc_resumed_int8']:.4f}: diff {r['auc_diff']:.4f} (goal <= 0.002)")
