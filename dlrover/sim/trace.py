"""Job traces for the simulator: the file format, its validation and a generator.

A trace is a table (CSV or Parquet, read with pandas), one row per job:

=====================  ===================================================================
column                 meaning
=====================  ===================================================================
job_id                 unique name
submit_s               submission time (s from the start of the trace)
signature              model + data signature: jobs with the same one share history
batch_size             per-worker batch (samples)
samples                dataset size (samples per epoch)
epochs                 passes over the data
req_workers, req_ps    the user's requested counts
req_worker_cpu,        the user's requested CPUs per worker / per PS
req_ps_cpu
req_worker_memory_mb,  the user's requested memory per worker / per PS
req_ps_memory_mb
budget_cpu,            the job's quota (what ``resources.budget_*`` is in a job spec);
budget_memory_mb       empty: the request
t0 .. t4               ground truth: coefficients of ``T_iter`` (``dlrover.resource.perf_model``)
profile                ... or a profile name/path (``dlrover.sim.profile``) instead of t0..t4
serial_worker,         the saturating truth's Amdahl serial fractions (0..1) and PS hot
serial_ps,             spot (0..1) (``dlrover.sim.truth``); empty: its defaults
ps_hot_share
ids_per_sample         mean ids a sample of the job's data (> 0); empty: its profile's, else 26.
                       The truth's PS terms scale with it (``t0..t4`` are per Criteo-equivalent
                       sample, 26 ids; a profile holds at its own); the policy's model knows it
worker_memory_need_mb  true peak RSS of one worker
ps_memory_need_mb      true peak RSS of the embedding tables + optimizer state, all PS together
max_failures           failures (OOM kills, lost actors) the job survives; empty: 3
=====================  ===================================================================

Which form the truth takes (``model``, ``saturating``, ``profile``) is the simulation's
setting (``SimSettings.truth``), not the trace's. The policy never sees ``t0..t4``, the
profile, the saturating parameters or the memory needs: it sees measured
throughput and RSS, like the live master (truth and model kept apart).

Every problem is a one-line :class:`~dlrover.errors.DataError` naming the file, the line
(CSV) or row (Parquet) and the column.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dlrover.errors import DataError
from dlrover.resource.configs import Config
from dlrover.resource.perf_model import PerfParams
from dlrover.sim.truth import SAT_COLUMNS, TRUTH_TERMS, SaturatingParams, SaturatingTruth, request_for

TRUTH = list(TRUTH_TERMS)
REQUIRED = [
    "job_id", "submit_s", "signature", "batch_size", "samples", "epochs",
    "req_workers", "req_ps", "req_worker_cpu", "req_ps_cpu", "req_worker_memory_mb", "req_ps_memory_mb",
    "worker_memory_need_mb", "ps_memory_need_mb",
]  # fmt: skip
OPTIONAL = ["budget_cpu", "budget_memory_mb", "max_failures", "profile", *TRUTH, *SAT_COLUMNS, "ids_per_sample"]
COLUMNS = REQUIRED[:6] + ["req_workers", "req_ps", "req_worker_cpu", "req_ps_cpu", "req_worker_memory_mb", "req_ps_memory_mb",
                          "budget_cpu", "budget_memory_mb", *TRUTH, "profile", *SAT_COLUMNS, "ids_per_sample", "worker_memory_need_mb",
                          "ps_memory_need_mb", "max_failures"]  # fmt: skip
_INT_POS = ["batch_size", "samples", "req_workers", "req_ps"]
_FLOAT_POS = ["epochs", "req_worker_cpu", "req_ps_cpu", "req_worker_memory_mb", "req_ps_memory_mb", "worker_memory_need_mb", "ps_memory_need_mb"]
DEFAULT_MAX_FAILURES = 3


def read_trace(path: str | Path) -> pd.DataFrame:
    """Read and validate a CSV or Parquet trace (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{path}: trace file not found")
    try:
        df = pd.read_parquet(p) if p.suffix in (".parquet", ".pq") else pd.read_csv(p, dtype={"job_id": str, "signature": str, "profile": str})
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file
        raise DataError(f"{path}: cannot read trace: {str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__}") from None
    return validate_trace(df, source=str(path), csv=p.suffix not in (".parquet", ".pq"))


def write_trace(df: pd.DataFrame, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix in (".parquet", ".pq"):
        df.to_parquet(p, index=False)
    else:
        df.to_csv(p, index=False)
    return p


def validate_trace(df: pd.DataFrame, source: str = "trace", csv: bool = True) -> pd.DataFrame:
    """Check columns and values; fill defaults. Returns a clean copy sorted by submit time."""

    def where(i: int) -> str:
        return f"{source}:{i + 2}" if csv else f"{source}: row {i}"  # CSV line: header is line 1

    if len(df) == 0:
        raise DataError(f"{source}: trace has no jobs")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise DataError(f"{source}: missing column(s) {', '.join(missing)}")
    unknown = [c for c in df.columns if c not in COLUMNS]
    if unknown:
        raise DataError(f"{source}: unknown column(s) {', '.join(map(str, unknown))} (known: {', '.join(COLUMNS)})")
    df = df.reset_index(drop=True).copy()
    for c in OPTIONAL:
        if c not in df.columns:
            df[c] = np.nan if c != "profile" else None

    def numeric(col: str) -> np.ndarray:
        vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(np.isnan(vals) & df[col].notna().to_numpy())
        if len(bad):
            raise DataError(f"{where(int(bad[0]))}: {col}: not a number: {df[col].iloc[bad[0]]!r}")
        return vals

    for col in ["submit_s", *_FLOAT_POS, *_INT_POS]:
        vals = numeric(col)
        bad = np.flatnonzero(~np.isfinite(vals) | (vals < 0 if col == "submit_s" else vals <= 0))
        if len(bad):
            need = "a number >= 0" if col == "submit_s" else "a positive number"
            raise DataError(f"{where(int(bad[0]))}: {col}: must be {need}, got {df[col].iloc[bad[0]]!r}")
        if col in _INT_POS:
            frac = np.flatnonzero(vals != np.round(vals))
            if len(frac):
                raise DataError(f"{where(int(frac[0]))}: {col}: must be an integer, got {df[col].iloc[frac[0]]!r}")
            df[col] = vals.astype(np.int64)
        else:
            df[col] = vals
    for col in ["budget_cpu", "budget_memory_mb", "max_failures", *TRUTH]:
        vals = numeric(col)
        bad = np.flatnonzero(vals < 0)
        if len(bad):
            raise DataError(f"{where(int(bad[0]))}: {col}: must be >= 0, got {df[col].iloc[bad[0]]!r}")
        df[col] = vals
    per_sample = numeric("ids_per_sample")
    bad = np.flatnonzero(~np.isnan(per_sample) & ~((per_sample > 0) & np.isfinite(per_sample)))
    if len(bad):
        raise DataError(f"{where(int(bad[0]))}: ids_per_sample: must be a positive number, got {df['ids_per_sample'].iloc[bad[0]]!r}")
    df["ids_per_sample"] = per_sample
    for col in SAT_COLUMNS:
        vals = numeric(col)
        bad = np.flatnonzero((vals < 0) | (vals >= 1 if col != "ps_hot_share" else vals > 1))
        if len(bad):
            top = "1" if col == "ps_hot_share" else "below 1"
            raise DataError(f"{where(int(bad[0]))}: {col}: must be from 0 to {top}, got {df[col].iloc[bad[0]]!r}")
        df[col] = vals
    ids = df["job_id"].astype(str)
    dup = ids.duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise DataError(f"{where(i)}: job_id: duplicate {ids.iloc[i]!r}")
    df["job_id"] = ids
    df["signature"] = df["signature"].astype(str)
    df["profile"] = pd.Series([x if isinstance(x, str) and x else None for x in df["profile"]], index=df.index, dtype=object)
    has_truth = df[TRUTH].notna().all(axis=1).to_numpy()
    some_truth = df[TRUTH].notna().any(axis=1).to_numpy()
    has_profile = df["profile"].notna().to_numpy()
    for i in np.flatnonzero(some_truth & ~has_truth):
        col = next(c for c in TRUTH if pd.isna(df[c].iloc[i]))
        raise DataError(f"{where(int(i))}: {col}: t0..t4 must all be given (or none, with a profile)")
    for i in np.flatnonzero(~has_truth & ~has_profile):
        raise DataError(f"{where(int(i))}: t0..t4 or profile: the job needs a ground truth")
    for i in np.flatnonzero(has_truth & (df[TRUTH].sum(axis=1).to_numpy() <= 0))[:1]:
        raise DataError(f"{where(int(i))}: t0..t4: not all zero")
    req_cpu = df["req_workers"] * df["req_worker_cpu"] + df["req_ps"] * df["req_ps_cpu"]
    req_mem = df["req_workers"] * df["req_worker_memory_mb"] + df["req_ps"] * df["req_ps_memory_mb"]
    df["budget_cpu"] = df["budget_cpu"].fillna(req_cpu)
    df["budget_memory_mb"] = df["budget_memory_mb"].fillna(req_mem)
    for col, req in (("budget_cpu", req_cpu), ("budget_memory_mb", req_mem)):
        bad = np.flatnonzero((df[col] < req - 1e-9).to_numpy())
        if len(bad):
            raise DataError(f"{where(int(bad[0]))}: {col}: {df[col].iloc[bad[0]]:g} is below the request ({req.iloc[bad[0]]:g})")
    df["max_failures"] = df["max_failures"].fillna(DEFAULT_MAX_FAILURES).astype(np.int64)
    return df.sort_values(["submit_s", "job_id"], kind="stable").reset_index(drop=True)[COLUMNS]


# ----------------------------------------------------------------------------- generator

# Ground truth of a mid-sized production DLRM job (per-worker batch 512): about 1e5
# samples/s at 16 workers x 8 CPU + 8 PS x 4 CPU in the model's form, flattening as the PS
# saturate, in the range the DLRover-RM paper reports (peak ~4e5 samples/s at 32
# workers, 18 PS). The saturating truth's extra parameters are drawn around its
# defaults (dlrover.sim.truth; assumptions, see docs/SIMULATOR.md).
BASE_TRUTH = PerfParams(t0=0.01, t1=6.0e-4, t2=0.03, t3=0.004, t4=3.0e-4)
SERIAL_WORKER_RANGE = (0.1, 0.4)  # uniform per model, mean 0.25
SERIAL_PS_RANGE = (0.15, 0.45)  # uniform per model, mean 0.3
HOT_SHARE_RANGE = (0.02, 0.1)  # log-uniform per model, geometric mean 0.045

# CPU over-request: the CPUs a user asks for per worker (per PS) over the CPUs that actor
# keeps busy at that request, under the saturating truth. Log-normal per request, with
# its mean utilisation E[1 / over-request] equal to the CPU utilisation DLRover-RM
# (VLDB'24, Fig. 4) reports for a year of production jobs before DLRover: workers 0.2, PS
# 0.15 (../shared/REFERENCES.md). The figure gives means only: the spread (sigma 0.5 of
# the log, i.e. 2 in 3 jobs within 0.6-1.6x the median) is an assumption. Not tuned to
# any result. Users ask in half CPUs (Kubernetes' 500m), 0.5 to 32 per actor. Over the
# distinct requests of a 1500-job trace (seed 0) the mean utilisation at the request is
# 0.22 (workers) and 0.14 (PS): one draw per request, the rounding and the caps.
CPU_UTIL_WORKER = 0.20
CPU_UTIL_PS = 0.15
OVER_REQUEST_SIGMA = 0.5
MAX_ACTOR_CPU = 32.0


def over_request_mu(util: float, sigma: float = OVER_REQUEST_SIGMA) -> float:
    """Log-mean of a log-normal over-request whose mean utilisation (1 / over-request) is ``util``."""
    return math.log(1.0 / util) + sigma**2 / 2.0


def cpu_over_requests(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` draws of (worker, PS) CPU over-requests (see the constants above); at least 1."""
    w = rng.lognormal(over_request_mu(CPU_UTIL_WORKER), OVER_REQUEST_SIGMA, n)
    p = rng.lognormal(over_request_mu(CPU_UTIL_PS), OVER_REQUEST_SIGMA, n)
    return np.maximum(w, 1.0), np.maximum(p, 1.0)


def synthetic_trace(
    jobs: int = 400, seed: int = 0, nodes: int = 40, node_cpu: float = 64.0, node_memory_mb: float = 256 * 1024, load: float = 1.3
) -> pd.DataFrame:
    """A production-like trace: recurring models, many small jobs and a few large ones,
    users over-requesting CPU (by :func:`cpu_over_requests`) and memory (and some
    under-requesting PS memory).

    Arrivals are Poisson, spread so that the *requested* CPU-time is ``load`` times what
    ``nodes`` nodes of ``node_cpu`` offer over the trace (over 1: a queue forms under
    the static policy, as on busy production clusters). Job lengths and the load are
    those of the saturating truth (the default's form for rows without a profile).
    """
    rng = np.random.default_rng(seed)
    n_sig = max(3, jobs // 15)
    # Per model: a truth scaled around BASE_TRUTH (heavier dense nets, bigger tables...).
    sig_scale = rng.lognormal(0.0, 0.35, size=(n_sig, len(TRUTH)))
    sig_sat = np.stack([rng.uniform(*SERIAL_WORKER_RANGE, n_sig), rng.uniform(*SERIAL_PS_RANGE, n_sig),
                        np.exp(rng.uniform(*np.log(HOT_SHARE_RANGE), n_sig))], axis=1)  # fmt: skip
    sig_batch = rng.choice([256, 512, 1024], size=n_sig, p=[0.25, 0.5, 0.25])
    sig_worker_mem = rng.uniform(1500, 6000, size=n_sig)
    sig_ps_mem = np.exp(rng.uniform(np.log(4_000), np.log(160_000), size=n_sig))  # embeddings + optimizer, MB
    pop = 1.0 / np.arange(1, n_sig + 1) ** 0.8  # Zipf-like popularity: a few models recur a lot
    sig_p = rng.choice(n_sig, size=jobs, p=pop / pop.sum())
    truths = [SaturatingTruth(SaturatingParams(PerfParams(*(np.asarray(BASE_TRUTH[: len(TRUTH)]) * sig_scale[s])), *sig_sat[s])) for s in range(n_sig)]

    def request(s: int, large: bool) -> tuple[int, int, float, float]:
        # Users ask for round, generous actor counts, PS above all ("to be safe"), and
        # CPUs per actor over what it keeps busy by a drawn over-request.
        if large:
            w, p = int(rng.choice([16, 24, 32])), int(rng.choice([8, 12, 16, 24]))
        else:
            w, p = int(rng.choice([2, 4, 8, 12])), int(rng.choice([2, 4, 8]))
        ow, op = cpu_over_requests(rng, 1)
        return (w, p, *request_for(truths[s], w, p, int(sig_batch[s]), float(ow[0]), float(op[0]), MAX_ACTOR_CPU))

    # A signature is one model on one dataset (a daily retrain): its jobs have about the
    # same size and mostly the same request (users re-submit their spec; 1 in 5 edit it).
    sig_large = rng.random(n_sig) < 0.12
    sig_req = [request(s, bool(x)) for s, x in enumerate(sig_large)]
    sig_hours = np.where(sig_large, rng.uniform(3.0, 12.0, n_sig), np.exp(rng.uniform(np.log(0.2), np.log(3.0), n_sig)))
    sig_epochs = rng.choice([1, 1, 2, 3], size=n_sig)
    out = []
    for j in range(jobs):
        s = int(sig_p[j])
        truth = truths[s]
        batch = int(sig_batch[s])
        w, p, cw, cp = request(s, bool(sig_large[s])) if rng.random() < 0.2 else sig_req[s]
        hours = float(sig_hours[s]) * rng.uniform(0.85, 1.15)
        thr = truth.throughput(Config(*sig_req[s]), batch)
        epochs = int(sig_epochs[s])
        samples = max(batch * w, int(thr * hours * 3600 / epochs))
        wmem_need, psmem_need = float(sig_worker_mem[s]), min(float(sig_ps_mem[s]), p * 0.4 * node_memory_mb)
        ps_share = psmem_need / p + 512
        # Users over-request memory (x1.5..x4; production memory utilisation is ~15%) except
        # ~15% of jobs that under-size PS memory.
        ps_req = ps_share * (rng.uniform(0.6, 0.95) if rng.random() < 0.15 else rng.uniform(1.5, 4.0))
        out.append({
            "job_id": f"job-{j:05d}", "submit_s": 0.0, "signature": f"model-{s:03d}", "batch_size": batch,
            "samples": samples, "epochs": epochs,
            "req_workers": w, "req_ps": p, "req_worker_cpu": cw, "req_ps_cpu": cp,
            "req_worker_memory_mb": _mb(wmem_need * rng.uniform(1.5, 4.0)), "req_ps_memory_mb": _mb(min(ps_req, 0.75 * node_memory_mb)),
            "budget_cpu": 2 * (w * cw + p * cp), "budget_memory_mb": math.nan,
            **dict(zip(TRUTH, map(float, truth.params.t))), "profile": None, **dict(zip(SAT_COLUMNS, map(float, sig_sat[s]))),
            "worker_memory_need_mb": round(wmem_need), "ps_memory_need_mb": round(psmem_need), "max_failures": DEFAULT_MAX_FAILURES,
            "_cpu_s": (w * cw + p * cp) * samples * epochs / truth.throughput(Config(w, p, cw, cp), batch),
        })  # fmt: skip
    df = pd.DataFrame(out)
    span = df["_cpu_s"].sum() / (load * nodes * node_cpu)
    gaps = rng.exponential(1.0, size=jobs)
    df["submit_s"] = np.round(np.cumsum(gaps) / gaps.sum() * span - gaps[0] / gaps.sum() * span, 1)
    req_mem = df["req_workers"] * df["req_worker_memory_mb"] + df["req_ps"] * df["req_ps_memory_mb"]
    df["budget_memory_mb"] = 2 * req_mem
    return validate_trace(df.drop(columns="_cpu_s"), source="synthetic")


def _mb(x: float) -> int:
    return int(math.ceil(x / 256.0) * 256)
