"""The ``profile`` truth: throughput interpolated from measured points, and the factory of
every truth kind for a trace row.

A profile (:mod:`dlrover.sim.profile`) measures a handful of configurations of one model
on one machine. Between and beyond them the saturating truth fills in:

1. the saturating form (:class:`~dlrover.sim.truth.SaturatingTruth`) is fitted to the
   points (least squares on log throughput, weighted by window length, after removing
   the machine's over-commit as ``Profile.fit`` does): its five coefficients. The serial
   fractions and the PS hot spot stay at their defaults: the 8 points of
   ``dev_machine`` cannot tell them apart (freed, the PS's serial fraction swings from 0
   to 0.95 as one point is left out, and the fit's leave-one-out error grows from 17%
   to 22%);
2. its residuals (log measured / log fitted, one per measured configuration: repeats
   averaged, weighted by window length) are interpolated with Gaussian radial basis
   functions over ``log2`` of the four variables, width ``RBF_WIDTH`` doublings. The
   interpolant is exact at the measured configurations and fades to the fitted form
   about one doubling away from all of them.

So the measured configurations run at their measured rate, configurations near them at
a blend, and far ones (a cluster's 32 workers against a 2-core machine's 3) at the
fitted saturating form alone. A job of other ids a sample than the profile's
(:meth:`ProfileTruth.at_ids`) runs the fitted form's PS terms scaled by the ratio of the
two, its residuals as measured.
"""

from __future__ import annotations

import copy
import math
from functools import cache

import numpy as np
from scipy.optimize import least_squares

from dlrover.resource.configs import Config
from dlrover.resource.perf_model import REFERENCE_IDS, PerfParams, at_ids
from dlrover.sim.profile import Profile, load_profile, resolve_profile
from dlrover.sim.truth import (
    HOT_SHARE, SAT_COLUMNS, SERIAL_PS, SERIAL_WORKER, TRUTH_TERMS, TRUTHS, Contention, ModelTruth, SaturatingParams, SaturatingTruth, Truth,
)  # fmt: skip

RBF_WIDTH = 0.5  # doublings: a residual's weight falls to e^-2 one doubling away


def fit_saturating(profile: Profile) -> SaturatingParams:
    """The saturating form fitted to ``profile``'s points (see the module docstring); its
    coefficients hold at the profile's ids a sample (the form has no ``k``)."""
    pts = profile.points
    w, p, cw, cp, thr = (pts[c].to_numpy(dtype=np.float64) for c in ("workers", "ps", "worker_cpu", "ps_cpu", "throughput"))
    own = np.log(thr * profile.overcommit(w, p, cw, cp))
    weight = np.sqrt(profile.weights() / profile.weights().mean())
    configs = [Config(int(a), int(b), float(c), float(d)) for a, b, c, d in zip(w, p, cw, cp)]
    start = at_ids(profile.truth(), profile.ids_per_sample)
    scale = np.maximum(np.array(start), 1e-7)

    def params(x: np.ndarray) -> SaturatingParams:
        return SaturatingParams(PerfParams(*(float(v) for v in x * scale)), SERIAL_WORKER, SERIAL_PS, HOT_SHARE, 1.0, 0.0)

    def resid(x: np.ndarray) -> np.ndarray:
        truth = SaturatingTruth(params(x))
        return weight * (np.log([truth.throughput(c, profile.batch_size) for c in configs]) - own)

    x0 = np.maximum(np.array(start) / scale, 1e-3)
    return params(least_squares(resid, x0, bounds=(0.0, np.inf), x_scale="jac").x)


class ProfileTruth(Truth):
    """A measured profile, exact at its points, the fitted saturating form elsewhere.

    Contention is by CPUs held, as the profile's over-commit was removed (``Profile.cores``
    and ``ClusterSpec.node_cores``), so a one-node simulation on the measured machine's
    cores puts back what was measured."""

    kind = "profile"

    def __init__(self, profile: Profile, width: float = RBF_WIDTH) -> None:
        self.profile = profile
        self.ids_per_sample = profile.ids_per_sample  # what ``base`` holds at
        self.base = SaturatingTruth(fit_saturating(profile))
        pts = profile.points.assign(weight=profile.weights())
        own = pts["throughput"] * profile.overcommit(pts["workers"], pts["ps"], pts["worker_cpu"], pts["ps_cpu"])
        pts = pts.assign(log_thr=np.log(own.to_numpy(dtype=np.float64)))
        rows = []
        for key, g in pts.groupby(["workers", "ps", "worker_cpu", "ps_cpu"], sort=True):
            c = Config(int(key[0]), int(key[1]), float(key[2]), float(key[3]))
            measured = float(np.average(g["log_thr"], weights=g["weight"]))
            rows.append((self._coords(c), measured - np.log(self.base.throughput(c, profile.batch_size))))
        self.centers = np.array([r[0] for r in rows])
        self.width = width
        gram = self._kernel(self.centers)
        self.alpha = np.linalg.solve(gram, np.array([r[1] for r in rows]))
        self._memo: dict[tuple, float] = {}
        self._at: dict[float, ProfileTruth] = {}

    def at_ids(self, ids_per_sample: float) -> ProfileTruth:
        """This truth for a job of ``ids_per_sample`` ids a sample: the fitted form's PS terms
        scaled from the profile's ids, the measured residuals kept (they are the machine's)."""
        if ids_per_sample == self.ids_per_sample:
            return self
        got = self._at.get(ids_per_sample)
        if got is None:
            got = self._at[ids_per_sample] = copy.copy(self)  # shares the residuals and their memo
            sp = self.base.params
            got.base = SaturatingTruth(sp._replace(t=at_ids(sp.t, ids_per_sample, self.ids_per_sample)))
            got.ids_per_sample = ids_per_sample
        return got

    @staticmethod
    def _coords(c: Config) -> np.ndarray:
        return np.log2([c.workers, c.ps, c.worker_cpu, c.ps_cpu])

    def _kernel(self, x: np.ndarray) -> np.ndarray:
        d2 = ((np.atleast_2d(x)[:, None, :] - self.centers[None, :, :]) ** 2).sum(axis=2)
        return np.exp(-d2 / (2.0 * self.width**2))

    def correction(self, c: Config) -> float:
        """Measured / fitted throughput near ``c`` (1 far from every measured point)."""
        key = (c.workers, c.ps, c.worker_cpu, c.ps_cpu)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = float(np.exp(self._kernel(self._coords(c))[0] @ self.alpha))
        return got

    def throughput(self, c: Config, batch: int) -> float:
        return self.base.throughput(c, batch) * self.correction(c)

    def used_cpu(self, c: Config, batch: int) -> float:
        return min(c.cpu, self.base.used_cpu(c, batch) * self.correction(c))  # the same work per step, more or fewer steps

    def contention(self, c: Config, batch: int) -> Contention:
        return Contention(c.worker_cpu, c.ps_cpu, None, 0.0)


def profile_truth(name_or_path: str) -> ProfileTruth:
    """The profile truth of a profile file (read and fitted once per file version)."""
    path = resolve_profile(name_or_path)
    st = path.stat()
    return _fitted(str(path.resolve()), st.st_mtime_ns, st.st_size)


@cache
def _fitted(path: str, mtime_ns: int, size: int) -> ProfileTruth:
    return ProfileTruth(load_profile(path))


def saturating_params(row: dict, t: PerfParams) -> SaturatingParams:
    """The saturating truth of a trace row: its ``t0..t4`` and the optional columns
    ``serial_worker, serial_ps, ps_hot_share`` (empty: the defaults)."""
    vals = [row.get(c) for c in SAT_COLUMNS]
    defaults = (SERIAL_WORKER, SERIAL_PS, HOT_SHARE)
    got = [d if v is None or math.isnan(float(v)) else float(v) for v, d in zip(vals, defaults)]
    return SaturatingParams(t, *got)


def ids_per_sample_of(row: dict) -> float:
    """A trace row's ids a sample: its ``ids_per_sample``, empty: its profile's, else
    Criteo's 26 (what ``t0..t4`` hold at)."""
    k = row.get("ids_per_sample")
    if k is not None and not math.isnan(float(k)):
        return float(k)
    name = row.get("profile")
    return profile_truth(name).ids_per_sample if isinstance(name, str) and name else REFERENCE_IDS


def make_truth(kind: str, row: dict) -> Truth:
    """The ``kind`` truth of one trace row (``t0..t4`` or a ``profile``), its PS terms at
    the row's ids a sample (:func:`ids_per_sample_of`).

    ``model``: the row's ``t0..t4``, or the model form fitted to its profile (as before).
    ``saturating``: the saturating form with the row's ``t0..t4``, or fitted to its profile.
    ``profile``: a row's profile, interpolated; a row without one has nothing measured,
    and runs on the saturating truth."""
    if kind not in TRUTHS:
        raise ValueError(f"truth: expected one of {', '.join(TRUTHS)}, got {kind!r}")
    k = ids_per_sample_of(row)
    name = row.get("profile")
    if isinstance(name, str) and name:
        pt = profile_truth(name)
        if kind == "model":
            return ModelTruth(at_ids(pt.profile.truth(), k))
        return pt.at_ids(k) if kind == "profile" else pt.at_ids(k).base
    t = at_ids(PerfParams(*(float(row[c]) for c in TRUTH_TERMS)), k)
    return ModelTruth(t) if kind == "model" else SaturatingTruth(saturating_params(row, t))
