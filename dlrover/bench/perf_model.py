"""``dlrover bench perf-model``: how well the resource-performance model predicts this machine.

One job sweeps a list of real configurations (live rescales, ``scripted`` policy with
``after_window_s`` steps): each runs until its throughput has been measured for
``window_s`` seconds after the warm-up. The measured (configuration, throughput) points
are then fitted with the model used online (:class:`~dlrover.resource.perf_model.PerfModel`,
NNLS with pinning) in two ways:

- leave-one-out: each configuration predicted by a fit on all the others;
- half split: fit on the first half of the configurations, predict the others.

The sweep runs ``repeats`` times (default 2), so each configuration is measured at two
moments: the spread of its windows is the noise floor (the issue's goal allows
leave-one-out MAPE within 1.5x of it), reported next to the spread within a window.
MAPE (mean absolute percentage error) of both is reported.
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
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import Event, JobSummary
from dlrover.spec import JobSpec, spec_from_dict
from dlrover.bench.progress import bench_data

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


def sweep_spec(data_dir: str, window_s: float, history_dir: str, repeats: int = 1) -> JobSpec:
    """The sweep as one job: ``SWEEP`` ``repeats`` times over, one configuration after the other."""
    w0, p0, cw0, cp0 = SWEEP[0]
    steps = [{"after_window_s": window_s, "workers": w, "ps": p, "worker_cpu": cw, "ps_cpu": cp} for w, p, cw, cp in (SWEEP * repeats)[1:]]
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


def noise_floor(events: list[Event], start_s: float, end_s: float) -> float | None:
    """Relative spread (std / mean) of the job's samples/s over ``NOISE_BIN_S`` bins of a
    measured window: how far apart two measurements of the same configuration may land.
    None with fewer than 3 bins. Each worker report's samples are spread over the span it
    covers (``samples / samples_per_s`` before ``at_s``): counted where it ends, a bin
    would get three or four reports by their timing alone, a spread of 10-15% that is
    not in the throughput."""
    edges = np.arange(start_s, end_s + 1e-9, NOISE_BIN_S)
    if len(edges) < 4:
        return None
    reports = [(e.at_s, e.fields["samples"], e.fields.get("samples_per_s") or 0.0) for e in events if e.kind == "metrics" and "samples" in e.fields]
    if not reports:
        return None
    end, n, rate = (np.array(c, dtype=np.float64) for c in zip(*reports))
    span = np.where(rate > 0, n / np.where(rate > 0, rate, 1.0), 1e-9)  # no rate: a point at its end
    overlap = np.minimum(end, edges[1:, None]) - np.maximum(end - span, edges[:-1, None])
    rates = (np.clip(overlap, 0.0, None) / span * n).sum(axis=1) / NOISE_BIN_S
    return float(np.std(rates) / np.mean(rates)) if np.mean(rates) > 0 else None


def fit_and_score(points: list[tuple[Config, float, float]], batch_size: int, cores: float = math.inf) -> dict:
    """Leave-one-out and half-split MAPE of the model over measured windows ``(config,
    samples/s, seconds)`` (``cores``: the host's, as the job's model had them).

    A configuration measured more than once is predicted once, and every one of its
    windows scores that prediction: leave-one-out leaves all its windows out, and the
    half split fits on every window of the first half of the configurations (in the
    order first measured) and predicts the others. ``spread``: each configuration's
    windows' standard deviation over their mean (None for one window); with two windows
    it is an unbiased estimate of the mean relative error of a prediction that knew the
    configuration's true throughput, so its mean (``noise_floor``) is the MAPE no model
    can beat on these windows."""
    configs = list(dict.fromkeys(p[0] for p in points))  # distinct, in sweep order
    windows = [np.array([t for c, t, _ in points if c == k]) for k in configs]

    def model_on(keep: list[Config]) -> PerfModel:
        m = PerfModel(batch_size, cores=cores)
        kept = set(keep)
        for c, t, d in points:
            if c in kept:
                m.observe(c, t, weight=d)
        return m

    def mape(pred: np.ndarray, idx: range) -> float:
        return float(np.mean(np.concatenate([np.abs(pred[j] - windows[i]) / windows[i] for j, i in enumerate(idx)])))

    n = len(configs)
    loo = np.array([model_on(configs[:i] + configs[i + 1 :]).predict(configs[i]) for i in range(n)])
    half = n // 2
    m = model_on(configs[:half])
    split = np.array([m.predict(c) for c in configs[half:]])
    spread = [float(np.std(t, ddof=1) / np.mean(t)) if len(t) > 1 else None for t in windows]
    known = [x for x in spread if x is not None]
    full = model_on(configs)
    return {
        "configs": [c.short() for c in configs],
        "measured": [float(np.mean(t)) for t in windows],
        "windows": [t.tolist() for t in windows],
        "spread": spread,
        "noise_floor": float(np.mean(known)) if known else None,
        "loo_predicted": loo.tolist(),
        "loo_mape": mape(loo, range(n)),
        "split_predicted": split.tolist(),
        "split_mape": mape(split, range(half, n)),
        "fit_params": full.params._asdict(),
        "identified": list(full.identified),
    }


def run_perf_model_bench(window_s: float = 12.0, repeats: int = 2) -> dict:
    from dlrover.driver.runner import ensure_data, run_job

    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    n = len(SWEEP) * repeats
    with tempfile.TemporaryDirectory() as tmp:
        spec = sweep_spec(bench_data("perf-model-500k"), window_s, os.path.join(tmp, "history"), repeats)
        ensure_data(spec)
        print(f"[bench] sweeping {len(SWEEP)} configurations {repeats}x, {window_s:g}s measured each (live rescales)", file=sys.stderr)
        doc, path = run_job(spec, runs_dir=os.path.join(tmp, "runs"), progress="none", stop_when=StopAfterSweep(n, window_s))
        events = [e for _, e in read_events(Path(path).parent / "events.jsonl")]
    summary = JobSummary.from_json(doc)
    rows = [c for c in summary.configurations if c["duration_s"] >= window_s * 0.5]
    points = [(Config(**c["config"]), c["measured_throughput"], c["duration_s"]) for c in rows]
    measured = len({p[0] for p in points})
    if measured < 4:
        raise RuntimeError(f"only {measured} configurations measured; the sweep needs at least 4")
    out = {
        "window_s": window_s,
        "repeats": repeats,
        "points": [
            {"config": c.short(), **c.to_dict(), "measured": t, "duration_s": d, "noise": noise_floor(events, r["at_s"] - d, r["at_s"])}
            for (c, t, d), r in zip(points, rows)
        ],
    }
    cores = summary.perf_model["cores"]
    out["cores"] = cores
    out.update(fit_and_score(points, spec.data.batch_size, cores))
    spreads = [p["noise"] for p in out["points"] if p["noise"] is not None]
    out["bin_noise_floor"] = float(np.median(spreads)) if spreads else None
    return out


def print_perf_model(r: dict) -> None:
    print(f"{'configuration':32s}{'measured':>10s}{'windows':>18s}{'spread':>8s}{'LOO pred':>10s}{'err':>8s}")
    for c, t, ws, sd, pred in zip(r["configs"], r["measured"], r["windows"], r["spread"], r["loo_predicted"]):
        shown = "/".join(f"{x / 1000:.1f}k" for x in ws)
        print(f"{c:32s}{t:>10,.0f}{shown:>18s}{f'{sd:.1%}' if sd is not None else 'n/a':>8s}{pred:>10,.0f}{(pred - t) / t:>+8.1%}")
    print(f"leave-one-out MAPE {r['loo_mape']:.1%}; fit on the first half of the configurations, predict the rest: MAPE {r['split_mape']:.1%}"
          " (over every window; goal <= 10% and 15%)")  # fmt: skip
    if r["noise_floor"] is not None:
        print(f"noise floor (mean spread of a configuration's {r['repeats']} windows: the MAPE of a model that knew each "
              f"configuration's true throughput): {r['noise_floor']:.1%}; 1.5x: {1.5 * r['noise_floor']:.1%}")  # fmt: skip
    if r.get("bin_noise_floor") is not None:
        print(f"within one window (median spread of {NOISE_BIN_S:g}s samples/s bins): {r['bin_noise_floor']:.1%}")
    print(f"host: {r['cores']:g} cores (from Ray); " + "fitted T_iter terms: " + ", ".join(f"{k}={v:.3g}" + ("" if ok else "*") for (k, v), ok in zip(r["fit_params"].items(), r["identified"])) + "   (* pinned)")
