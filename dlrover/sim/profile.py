"""Measured performance profiles: the simulator's ground truth, filled from real dlrover runs.

A profile is what one model + batch size does on one machine: a list of measured
configurations and their throughput. The simulator uses it in place of a trace row's
``t0..t4`` (trace column ``profile``): :meth:`Profile.truth` fits all five terms of
``T_iter`` (:mod:`dlrover.resource.perf_model`) to the points, so a simulated job runs at
the rate this machine really showed, and at the model's interpolation elsewhere.

File format: one CSV per profile, ``<name>.csv`` (the file's stem is the profile's name),
a header line then one line per measured window::

    workers,ps,worker_cpu,ps_cpu,batch_size,throughput,duration_s,source
    1,1,1.0,1.0,2048,10523.7,12.01,bench-perf-model-20261121-130501-ab12
    2,1,1.0,1.0,2048,17170.2,12.30,bench-perf-model-20261121-130501-ab12

==============  =============================================================  =========
column          meaning                                                        required
==============  =============================================================  =========
workers, ps     actor counts (integers >= 1)                                   yes
worker_cpu,     CPUs per worker / per PS (> 0)                                 yes
ps_cpu
batch_size      per-worker batch (samples); the same on every line             yes
throughput      measured samples/s of the whole job (> 0)                      yes
duration_s      length of the measured window (s, > 0; the fit's weight;       no
                empty: weight 1)
source          where the point comes from (a run id)                          no
ids_per_sample  mean ids a sample of the measured job's data (> 0); the same   no
                on every line; empty: 26, Criteo's layout. The fit's PS
                terms are per Criteo-equivalent sample
                (:mod:`dlrover.resource.perf_model`'s ``k``)
node_cores      physical cores of the machine measured on; the same on every   no
                line. Given, the fit removes the over-commit (a job whose
                actors hold more logical CPUs than there are cores runs
                cores / CPUs as fast) and the simulator puts it back on nodes
                with ``ClusterSpec.node_cores``
==============  =============================================================  =========

Blank lines are skipped. Every problem is a one-line :class:`~dlrover.errors.DataError`
naming ``file:line`` and the column (the header is line 1).

* :func:`load_profile` reads a file, or a bare name from ``benchmarks/profiles/`` of the
  checkout (:data:`PROFILES_DIR`); :func:`save_profile` writes one.
* :func:`profile_from_runs` builds one from run directories (``runs/<job id>``): the
  ``measurement`` events of ``events.jsonl`` plus the windows that ``summary.json`` lists
  under ``configurations`` (the last window closes when the job ends, after the event log
  was written), the batch size from ``spec.json`` (else ``summary.json``) and the ids a
  sample from ``summary.json`` (``ids_per_sample``; absent: 26).
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dlrover.errors import DataError
from dlrover.runlogs.event_file import read_events
from dlrover.resource.perf_model import DEFAULT_PRIOR, REFERENCE_IDS, PerfParams, features, fit_params, throughput

PROFILES_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"

POINT_COLUMNS = ["workers", "ps", "worker_cpu", "ps_cpu", "throughput", "duration_s", "source"]
FILE_COLUMNS = ["workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput", "duration_s", "source", "ids_per_sample", "node_cores"]
_ONE_PER_FILE = {"node_cores": "one machine", "ids_per_sample": "one data layout"}  # optional, the same on every line
_REQUIRED = ["workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput"]
_INTS = ("workers", "ps", "batch_size")


@dataclass
class Profile:
    """Measured points of one model + batch size (see the module docstring).

    ``points``: a DataFrame with :data:`POINT_COLUMNS` (``duration_s`` may be NaN:
    weight 1; ``source`` may be empty). ``prior``: what a term the points cannot
    identify is pinned to, scaled to the data (as the online model does).
    """

    name: str
    batch_size: int
    points: pd.DataFrame
    prior: PerfParams = DEFAULT_PRIOR
    cores: float | None = None  # physical cores of the machine measured on (None: no over-commit)
    ids_per_sample: float = REFERENCE_IDS  # mean ids a sample of the measured job's data

    def __post_init__(self) -> None:
        if not (isinstance(self.batch_size, (int, np.integer)) and self.batch_size > 0):
            raise ValueError(f"profile {self.name}: batch_size must be a positive int, got {self.batch_size!r}")
        self.batch_size = int(self.batch_size)
        if not 0 < self.ids_per_sample < math.inf:
            raise ValueError(f"profile {self.name}: ids_per_sample must be positive and finite, got {self.ids_per_sample!r}")
        self.ids_per_sample = float(self.ids_per_sample)
        df = pd.DataFrame(self.points).reset_index(drop=True).copy()
        if "duration_s" not in df.columns:
            df["duration_s"] = np.nan
        if "source" not in df.columns:
            df["source"] = ""
        missing = [c for c in POINT_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"profile {self.name}: points lack column(s) {', '.join(missing)}")
        df = df[POINT_COLUMNS]
        for c in POINT_COLUMNS[:6]:
            df[c] = pd.to_numeric(df[c], errors="raise").astype(np.float64)
        for c in ("workers", "ps"):
            df[c] = df[c].astype(np.int64)
        df["source"] = df["source"].fillna("").astype(str)
        self.points = df

    def __len__(self) -> int:
        return len(self.points)

    def weights(self) -> np.ndarray:
        """Fit weight of each point: its window's length (a longer window is less noisy)."""
        d = self.points["duration_s"].to_numpy(dtype=np.float64)
        return np.where(np.isfinite(d) & (d > 0), d, 1.0)

    def fit(self) -> tuple[PerfParams, tuple[bool, ...]]:
        """NNLS fit of all five ``T_iter`` terms to the points, relative errors weighted by
        window length (:func:`~dlrover.resource.perf_model.fit_params`), at the profile's ids a
        sample (so the PS terms come out per Criteo-equivalent sample); a term the points
        cannot identify is pinned to the scaled prior. The host terms ``t5`` and ``t6`` stay zero: the
        over-commit is divided out of the points here, and the simulated cluster puts it
        back on its own nodes' cores. Returns (params, identified)."""
        if len(self.points) == 0:
            raise ValueError(f"profile {self.name}: no points")
        p = self.points
        w, ps, cw, cp, thr = (p[c].to_numpy(dtype=np.float64) for c in ("workers", "ps", "worker_cpu", "ps_cpu", "throughput"))
        t_iter = w * self.batch_size / (thr * self.overcommit(w, ps, cw, cp))  # the job's speed on cores of its own
        x = features(w, ps, cw, cp, self.batch_size, ids_per_sample=self.ids_per_sample)
        return fit_params(x, t_iter, self.prior._replace(t5=0.0, t6=0.0), self.weights())

    def overcommit(self, w: Any, p: Any, cw: Any, cp: Any) -> np.ndarray:
        """How much slower than on cores of its own a configuration ran here: logical
        CPUs / physical cores when above 1 (1 without ``cores``)."""
        cpu = np.asarray(w, dtype=np.float64) * cw + np.asarray(p, dtype=np.float64) * cp
        return np.maximum(1.0, cpu / self.cores) if self.cores else np.ones_like(cpu)

    def truth(self) -> PerfParams:
        """The simulator's ground truth for a job of this profile."""
        return self.fit()[0]

    def predict(self, w: Any, p: Any = None, cw: Any = None, cp: Any = None) -> float | np.ndarray:
        """Throughput (samples/s) of a configuration at the profile's ids a sample: a ``Config``
        (anything with ``workers, ps, worker_cpu, ps_cpu``) or ``w, p, cw, cp`` (scalars or arrays)."""
        if hasattr(w, "workers"):
            w, p, cw, cp = w.workers, w.ps, w.worker_cpu, w.ps_cpu
        if p is None or cw is None or cp is None:
            raise TypeError("predict(config) or predict(workers, ps, worker_cpu, ps_cpu)")
        thr = throughput(self.truth(), w, p, cw, cp, self.batch_size, ids_per_sample=self.ids_per_sample)
        out = thr / self.overcommit(w, p, cw, cp).ravel()
        return float(out[0]) if all(np.ndim(x) == 0 for x in (w, p, cw, cp)) else out

    def without(self, index: int) -> Profile:
        """The profile less one point (leave-one-out)."""
        return Profile(self.name, self.batch_size, self.points.drop(index=index), self.prior, self.cores, self.ids_per_sample)


# ----------------------------------------------------------------------------- storage


def resolve_profile(name_or_path: str | os.PathLike) -> Path:
    """A path to an existing file as is; a bare name (no directory, ``.csv`` optional)
    from :data:`PROFILES_DIR`."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    s = str(name_or_path)
    if s and os.sep not in s and "/" not in s:
        q = PROFILES_DIR / (s if s.endswith(".csv") else f"{s}.csv")
        if q.is_file():
            return q
        known = sorted(x.stem for x in PROFILES_DIR.glob("*.csv")) if PROFILES_DIR.is_dir() else []
        raise DataError(f"{name_or_path}: no such profile file, nor {q} (known: {', '.join(known) or 'none'})")
    raise DataError(f"{name_or_path}: profile file not found")


def load_profile(name_or_path: str | os.PathLike) -> Profile:
    """Read and validate a profile CSV (see the module docstring)."""
    path = resolve_profile(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read profile: {e.__class__.__name__}: {e}") from None
    rows = [(n, r) for n, r in enumerate(csv.reader(text.splitlines()), start=1) if any(x.strip() for x in r)]
    if not rows:
        raise DataError(f"{path}:1: empty profile file (expected a header: {','.join(FILE_COLUMNS)})")
    head_line, header = rows[0]
    header = [h.strip() for h in header]
    unknown = [h for h in header if h not in FILE_COLUMNS]
    if unknown:
        raise DataError(f"{path}:{head_line}: unknown column(s) {', '.join(unknown)} (known: {', '.join(FILE_COLUMNS)})")
    dup = [h for i, h in enumerate(header) if h in header[:i]]
    if dup:
        raise DataError(f"{path}:{head_line}: duplicate column {dup[0]}")
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise DataError(f"{path}:{head_line}: missing column(s) {', '.join(missing)}")
    if len(rows) == 1:
        raise DataError(f"{path}:{head_line + 1}: no points (only a header)")
    out: dict[str, list] = {c: [] for c in FILE_COLUMNS}
    for line, r in rows[1:]:
        if len(r) != len(header):
            raise DataError(f"{path}:{line}: {len(r)} fields, the header has {len(header)}")
        rec = dict(zip(header, (x.strip() for x in r)))
        for c in FILE_COLUMNS:
            raw = rec.get(c, "")
            if c == "source":
                out[c].append(raw)
                continue
            if raw == "" and c in ("duration_s", *_ONE_PER_FILE):
                out[c].append(math.nan)
                continue
            try:
                v = float(raw)
            except ValueError:
                raise DataError(f"{path}:{line}: {c}: not a number: {raw!r}") from None
            if not math.isfinite(v) or v <= 0:  # every numeric column is positive
                raise DataError(f"{path}:{line}: {c}: must be a positive number, got {raw!r}")
            if c in _INTS and v != round(v):
                raise DataError(f"{path}:{line}: {c}: must be an integer, got {raw!r}")
            out[c].append(v)
    batch = out["batch_size"]
    for (line, _), b in zip(rows[1:], batch):
        if b != batch[0]:
            raise DataError(f"{path}:{line}: batch_size: {b:g} differs from the first point's {batch[0]:g} (one profile, one batch size)")
    for c, one in _ONE_PER_FILE.items():
        vals = out[c]
        for (line, _), x in zip(rows[1:], vals):
            if not (x == vals[0] or (math.isnan(x) and math.isnan(vals[0]))):
                raise DataError(f"{path}:{line}: {c}: {x:g} differs from the first point's {vals[0]:g} (one profile, {one})")
    cores, ids = out["node_cores"][0], out["ids_per_sample"][0]
    points = pd.DataFrame({c: out[c] for c in POINT_COLUMNS})
    return Profile(path.stem, int(batch[0]), points, cores=None if math.isnan(cores) else cores, ids_per_sample=REFERENCE_IDS if math.isnan(ids) else ids)


def save_profile(profile: Profile, path: str | os.PathLike) -> Path:
    """Write ``profile`` as CSV (the format :func:`load_profile` reads); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    df = profile.points.copy()
    df.insert(4, "batch_size", profile.batch_size)
    df["node_cores"] = profile.cores if profile.cores else math.nan
    df["ids_per_sample"] = profile.ids_per_sample
    df[FILE_COLUMNS].to_csv(p, index=False, float_format="%.10g")
    return p


# ----------------------------------------------------------------------------- from runs


def _point(cfg: Any, thr: Any, dur: Any, where: str) -> tuple[int, int, float, float, float, float]:
    if not isinstance(cfg, dict):
        raise DataError(f"{where}: measurement: config is not an object")
    vals = []
    for k in ("workers", "ps", "worker_cpu", "ps_cpu"):
        v = cfg.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise DataError(f"{where}: measurement: config.{k}: expected a positive number, got {v!r}")
        vals.append(v)
    for k, v in (("throughput", thr), ("duration_s", dur)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise DataError(f"{where}: measurement: {k}: expected a positive number, got {v!r}")
    return int(vals[0]), int(vals[1]), float(vals[2]), float(vals[3]), float(thr), float(dur)


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{path}: expected a JSON object")
    return doc


def _run_points(run_dir: Path) -> tuple[int, str, float, list[tuple]]:
    """(batch size, run id, ids a sample, measured points) of one run directory."""
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: not a run directory")
    spec, summary = _read_json(run_dir / "spec.json"), _read_json(run_dir / "summary.json")
    batch = None
    if spec is not None:
        batch = (spec.get("data") or {}).get("batch_size")
        where = f"{run_dir / 'spec.json'}: data.batch_size"
    if batch is None and summary is not None:
        batch = (summary.get("config") or {}).get("batch_size")
        where = f"{run_dir / 'summary.json'}: config.batch_size"
    if batch is None:
        raise DataError(f"{run_dir}: no batch size (no spec.json with data.batch_size, nor summary.json with config.batch_size)")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise DataError(f"{where}: expected a positive integer, got {batch!r}")
    run_id = str((summary or {}).get("job_id") or run_dir.name)
    ids = (summary or {}).get("ids_per_sample", REFERENCE_IDS)
    if not isinstance(ids, (int, float)) or isinstance(ids, bool) or not 0 < ids < math.inf:
        raise DataError(f"{run_dir / 'summary.json'}: ids_per_sample: expected a positive number, got {ids!r}")
    points: list[tuple] = []
    ev = run_dir / "events.jsonl"
    for n, e in read_events(ev):
        if e.kind == "measurement":
            points.append(_point(e.fields.get("config"), e.fields.get("throughput"), e.fields.get("duration_s"), f"{ev}:{n}"))
    # The window open when the job ends is closed after the event log is taken: it is
    # only in summary.json's ``configurations`` (which lists every window).
    for i, c in enumerate((summary or {}).get("configurations") or []):
        if not isinstance(c, dict):
            continue
        pt = _point(c.get("config"), c.get("measured_throughput"), c.get("duration_s"), f"{run_dir / 'summary.json'}: configurations[{i}]")
        if not any(q[:4] == pt[:4] and math.isclose(q[4], pt[4], rel_tol=1e-9) for q in points):
            points.append(pt)
    if not points:
        raise DataError(f"{run_dir}: no measurements (no 'measurement' events in events.jsonl, no configurations in summary.json)")
    return batch, run_id, float(ids), points


def profile_from_runs(run_dirs: list[str | os.PathLike], name: str, min_duration_s: float = 0.0) -> Profile:
    """A profile of the measured windows of these runs (one model, one batch size, one data
    layout). Windows shorter than ``min_duration_s`` are left out."""
    if not run_dirs:
        raise DataError(f"profile {name}: no run directories given")
    rows: list[dict] = []
    first: tuple[Path, int, float] | None = None
    for d in map(Path, run_dirs):
        batch, run_id, ids, points = _run_points(d)
        if first is None:
            first = (d, batch, ids)
        elif batch != first[1]:
            raise DataError(f"{d}: batch_size {batch} differs from {first[0]}'s {first[1]} (one profile, one batch size)")
        elif ids != first[2]:
            raise DataError(f"{d}: ids_per_sample {ids:g} differs from {first[0]}'s {first[2]:g} (one profile, one data layout)")
        kept = [p for p in points if p[5] >= min_duration_s]
        if not kept:
            raise DataError(f"{d}: no measurement of at least {min_duration_s:g}s (longest: {max(p[5] for p in points):.1f}s)")
        rows += [dict(zip(POINT_COLUMNS, (*p, run_id))) for p in kept]
    assert first is not None
    return Profile(name, first[1], pd.DataFrame(rows, columns=POINT_COLUMNS), ids_per_sample=first[2])
