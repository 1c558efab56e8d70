"""``dlrover bench perf-model``: how well the resource-performance model predicts this machine.

One job sweeps a list of real configurations (live rescales, ``scripted`` policy with
``after_window_s`` steps): each runs until its throughput has been measured for
``window_s`` seconds after the warm-up. The measured (configuration, throughput) points
are then fitted with the model used online (:class:`~dlrover.resource.perf_model.PerfModel`,
NNLS with pinning) in two ways:

- leave-one-out: each configuration predicted by a fit on all the others;
- half split: fit on the first half of the sweep, predict the second half.

MAPE (mean absolute percentage error) of both is reported; the goal is <= 10%.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from dlrover.resource.configs import Config
from dlrover.resource.perf_model import PerfModel
from dlrover.runlog import read_events
from dlrover.spec import JobSpec, spec_from_dict

# (workers, ps, worker_cpu, ps_cpu): the sweep, in order, starting from the first. On the
# 2-core machine every point but the first asks for more CPUs than there are cores.
SWEEP = [
    (1, 1, 1.0, 1.0),
    (2, 1, 1.0, 1.0),
    (2, 2, 1.0, 1.0),
    (1, 2, 1.0, 1.0),
    (1, 1, 2.0, 1.0),
    (3, 1, 1.0, 1.0),
    (2, 1, 1.0, 2.0),
    (1, 1, 2.0, 2.0),
    (3, 2, 1.0, 1.0),
    (1, 1, 1.0, 2.0),
]
NOISE_BIN_S = 2.0  # the noise floor: spread of the job's samples/s over bins this long


def sweep_spec(data_dir: str, window_s: float, history_dir: str) -> JobSpec:
    w0, p0, cw0, cp0 = SWEEP[0]
    steps = [{"after_window_s": window_s, "workers": w, "ps": p, "worker_cpu": cw, "ps_cpu": cp} for w, p, cw, cp in SWEEP[1:]]
    return spec_from_dict(
        {
            "name": "bench-perf-model",
            "model": {"embedding_dim": 16, "num_embeddings": 40_000, "dense_arch": [64, 16], "over_arch": [128, 64, 1]},
            "data": {
                "paths": [os.path.join(data_dir, "*.tsv")],
                "synth": {"out": data_dir, "rows": 500_000, "files": 4, "seed": 5},
                "epochs": 100,  # more than the sweep needs: the bench stops the job after it
                "batch_size": 2048,
                "eval_fraction": 0.01,
                "shard_rows": 16384,
            },
            "resources": {"workers": w0, "ps": p0, "worker_cpu": cw0, "ps_cpu": cp0, "budget_cpu": 6.25},
            "train": {"log_every_s": 0.5},
            "policy": {"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.5, "warmup_s": 4.0, "history_dir": history_dir},
        }
    )


class StopAfterSweep:
    """Stops the job once the last configuration has been measured for ``window_s`` (its
    window closes into the summary when the job ends); a progress line on stderr whenever
    the sweep moves on (stdout stays clean for ``--json``)."""

    def __init__(self, n: int, window_s: float) -> None:
        self.n, self.window_s, self.seen = n, window_s, (-1, None)

    def __call__(self, p: dict) -> bool:
        done = p.get("measurements", 0)
        if (done, p.get("config")) != self.seen:
            self.seen = (done, p.get("config"))
            print(f"[bench]   {done}/{self.n} measured, running {p.get('config')} ({p.get('status')})", file=sys.stderr)
        return done >= self.n - 1 and p.get("window_s", 0.0) >= self.window_s


def noise_floor(events: list[dict], start_s: float, end_s: float) -> float | None:
    """Relative spread (std / mean) of the job's samples/s over ``NOISE_BIN_S`` bins of a
    measured window: how far apart two measurements of the same configuration may land.
    None with fewer than 3 bins. Each worker report's samples are spread over the span it
    covers (``samples / samples_per_s`` before ``at_s``): counted where it ends, a bin
    would get three or four reports by their timing alone, a spread of 10-15% that is
    not in the throughput."""
    edges = np.arange(start_s, end_s + 1e-9, NOISE_BIN_S)
    if len(edges) < 4:
        return None
    reports = [(e["at_s"], e["samples"], e.get("samples_per_s") or 0.0) for e in events if e.get("kind") == "metrics" and "samples" in e]
    if not reports:
        return None
    end, n, rate = (np.array(c, dtype=np.float64) for c in zip(*reports))
    span = np.where(rate > 0, n / np.where(rate > 0, rate, 1.0), 1e-9)  # no rate: a point at its end
    overlap = np.minimum(end, edges[1:, None]) - np.maximum(end - span, edges[:-1, None])
    rates = (np.clip(overlap, 0.0, None) / span * n).sum(axis=1) / NOISE_BIN_S
    return float(np.std(rates) / np.mean(rates)) if np.mean(rates) > 0 else None


def _mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true))


def fit_and_score(points: list[tuple[Config, float, float]], batch_size: int, cores: float = math.inf) -> dict:
    """Leave-one-out and half-split MAPE of the model over measured points (``cores``: the
    host's, as the job's model had them)."""
    def model_on(idx: list[int]) -> PerfModel:
        m = PerfModel(batch_size, cores=cores)
        for i in idx:
            m.observe(points[i][0], points[i][1], weight=points[i][2])
        return m

    n = len(points)
    true = np.array([p[1] for p in points])
    loo = np.array([model_on([j for j in range(n) if j != i]).predict(points[i][0]) for i in range(n)])
    half = n // 2
    m = model_on(list(range(half)))
    split = np.array([m.predict(points[i][0]) for i in range(half, n)])
    full = model_on(list(range(n)))
    return {
        "loo_predicted": loo.tolist(),
        "loo_mape": _mape(loo, true),
        "split_predicted": split.tolist(),
        "split_mape": _mape(split, true[half:]),
        "fit_params": full.params._asdict(),
        "identified": list(full.identified),
    }


def run_perf_model_bench(window_s: float = 12.0) -> dict:
    from dlrover.runner import ensure_data, run_job

    cache = os.environ.get("DLROVER_BENCH_DATA", os.path.join(tempfile.gettempdir(), "dlrover-bench-data"))
    with tempfile.TemporaryDirectory() as tmp:
        spec = sweep_spec(os.path.join(cache, "perf-model-500k"), window_s, os.path.join(tmp, "history"))
        ensure_data(spec)
        print(f"[bench] sweeping {len(SWEEP)} configurations, {window_s:g}s measured each (live rescales)", file=sys.stderr)
        summary, path = run_job(spec, runs_dir=os.path.join(tmp, "runs"), progress="none", stop_when=StopAfterSweep(len(SWEEP), window_s))
        events = [row for _, row in read_events(Path(path).parent / "events.jsonl")]
    rows = [c for c in summary["configurations"] if c["duration_s"] >= window_s * 0.5]
    points = [(Config(**c["config"]), c["measured_throughput"], c["duration_s"]) for c in rows]
    if len(points) < 4:
        raise RuntimeError(f"only {len(points)} configurations measured; the sweep needs at least 4")
    out = {
        "window_s": window_s,
        "points": [
            {"config": c.short(), **c.to_dict(), "measured": t, "duration_s": d, "noise": noise_floor(events, r["at_s"] - d, r["at_s"])}
            for (c, t, d), r in zip(points, rows)
        ],
    }
    cores = summary["perf_model"]["cores"]
    out["cores"] = cores
    out.update(fit_and_score(points, spec.data.batch_size, cores))
    spreads = [p["noise"] for p in out["points"] if p["noise"] is not None]
    out["noise_floor"] = float(np.median(spreads)) if spreads else None
    return out


def print_perf_model(r: dict) -> None:
    print(f"{'configuration':32s}{'measured':>12s}{'noise':>8s}{'LOO pred':>12s}{'err':>8s}")
    for p, pred in zip(r["points"], r["loo_predicted"]):
        noise = f"{p['noise']:.1%}" if p["noise"] is not None else "n/a"
        print(f"{p['config']:32s}{p['measured']:>12,.0f}{noise:>8s}{pred:>12,.0f}{(pred - p['measured']) / p['measured']:>+8.1%}")
    print(f"leave-one-out MAPE {r['loo_mape']:.1%}; fit on the first half, predict the second: MAPE {r['split_mape']:.1%} (goal <= 10% and 15%)")
    if r.get("noise_floor") is not None:
        print(f"noise floor (median spread of a configuration's {NOISE_BIN_S:g}s samples/s bins): {r['noise_floor']:.1%}")
    print(f"host: {r['cores']:g} cores (from Ray); " + "fitted T_iter terms: " + ", ".join(f"{k}={v:.3g}" + ("" if ok else "*") for (k, v), ok in zip(r["fit_params"].items(), r["identified"])) + "   (* pinned)")
