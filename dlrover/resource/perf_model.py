"""Resource-performance model of one job: step time as a function of its configuration.

The DLRover-RM / Optimus form, extended with CPU terms, for ``w`` workers of ``cw`` CPUs
each, ``p`` parameter servers of ``cp`` CPUs each, a per-worker batch of ``B`` and ``k``
ids a sample, on a host of ``cores`` physical cores::

    T_iter = t0 + t1 * B / cw + (k / 26) * (t2 * w / (p * cp) + t3 * w / p) + t4 * w
             + t5 * B * o + t6 * B * o**2,   o = max(0, w * cw + p * cp - cores)
    throughput = w * B / T_iter                                  (samples/s)

The PS's work (lookups, pooling, row updates, ids sent) grows with the ids a step carries,
so its terms scale with ``k`` over Criteo's 26 (``REFERENCE_IDS``): ``t2`` and ``t3`` are
per Criteo-equivalent sample, the same for a 26-id job and a 214-id one.

The last two terms are the host's: Ray's CPUs are a scheduling budget, and where a cluster advertises more of
them than its nodes have cores (a laptop, the 2-core dev machine, a node with ``--num-cpus`` above its core
count), every CPU asked beyond the cores slows each batch's compute (``t5``, contention for the cores), and
the threads asked beyond them also get in each other's way, pairwise (``t6``: the coherency term of Gunther's
Universal Scalability Law, quadratic in the excess: preempted OpenMP teams wait at their barriers, caches are
shared). Where the cores are unknown (``cores=inf``) both are zero.

``T_iter`` is linear in non-negative coefficients, so a handful of measured windows fit it with NNLS. Online
the data rarely vary every variable, so a term whose feature the measured configurations cannot separate from
the others is pinned to the prior instead of being fitted to noise: the job's terms (``t0..t4``) scaled as a
whole to the data, the host's (``t5``, ``t6``) as they are, because they describe the machine, not the job.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from dlrover.resource.configs import Config


class PerfParams(NamedTuple):
    """Coefficients of the step-time model, each tied to one term of ``T_iter`` (seconds)."""

    t0: float  # fixed per-step overhead (s)
    t1: float  # worker compute: t1 * B / cw
    t2: float  # PS compute:     (k / 26) * t2 * w / (p * cp), per Criteo-equivalent ids
    t3: float  # PS communication/contention: (k / 26) * t3 * w / p
    t4: float  # shared-resource contention: t4 * w
    t5: float = 0.0  # host over-commit: t5 * B * max(0, w * cw + p * cp - cores)
    t6: float = 0.0  # threads over the cores in each other's way: t6 * B * max(0, w * cw + p * cp - cores)**2


# Rough values for the 2-core CPU development machine; a history record's fit replaces it. The host terms are the
# fit of `dlrover bench perf-model`'s 60 windows of 2026-11-27 (3 runs x 10 configurations x 2; docs/ELASTIC.md).
DEFAULT_PRIOR = PerfParams(t0=0.004, t1=2.0e-5, t2=0.004, t3=0.003, t4=0.004, t5=4.4e-6, t6=3.3e-6)

REFERENCE_IDS = 26.0  # Criteo's layout (one id per sparse feature): the ids a sample the PS terms' prior was measured at

N_TERMS = len(PerfParams._fields)
# The host's terms: pinned to the prior as they are, not scaled with the job (``fit_params``).
HOST_TERMS = np.array([f in ("t5", "t6") for f in PerfParams._fields])

# A term is identifiable only if at least this fraction of its (unit-norm) feature column lies outside the
# span of the terms chosen before it; below that its coefficient would be set by noise, not by the data.
_IDENT_TOL = 1e-2

# The model's uncertainty (``PerfModel.relative_sd``): each coefficient is a priori the pinned value within this
# relative spread, and no fit is surer than a measured window's noise (repeated windows spread a few % here).
PRIOR_REL_SD = 0.5
NOISE_FLOOR = 0.05
ZERO_TERM_SHARE = 0.05  # what a term the prior sets to 0 may still bring to a step, a priori
MAX_REL_SD = 1.0

_POINT_COLUMNS = ["workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput", "weight"]


def _broadcast(w: Any, p: Any, cw: Any, cp: Any, batch: Any) -> np.ndarray:
    """The five variables as a ``[5, N]`` float array (1-D inputs of one length and scalars
    broadcast); all must be positive. A hot path (the simulator calls it millions of times)."""
    arrs = [np.asarray(x, dtype=np.float64) for x in (w, p, cw, cp, batch)]
    n = max(a.size for a in arrs)
    if all(a.ndim <= 1 and a.size in (1, n) for a in arrs):
        stacked = np.empty((5, n))
        for i, a in enumerate(arrs):
            stacked[i] = a.reshape(-1)
    else:
        stacked = np.stack(np.broadcast_arrays(*arrs)).reshape(5, -1)
    ok = np.isfinite(stacked) & (stacked > 0)
    if not ok.all():
        i = int(np.flatnonzero(~ok.all(axis=1))[0])
        name = ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size")[i]
        raise ValueError(f"{name} must be positive and finite, got {stacked[i][~ok[i]][0]!r}")
    return stacked


def over_commit(w: Any, p: Any, cw: Any, cp: Any, cores: float) -> Any:
    """CPUs a configuration asks beyond the host's physical ``cores`` (0 if within)."""
    return np.maximum(0.0, w * cw + p * cp - cores)


def _ps_share(ids_per_sample: float) -> float:
    """``k / REFERENCE_IDS``, the factor of the PS terms (``k`` validated)."""
    return _positive("ids_per_sample", ids_per_sample) / REFERENCE_IDS


def at_ids(params: PerfParams, ids_per_sample: float, reference: float = REFERENCE_IDS) -> PerfParams:
    """``params``, whose PS terms hold at ``reference`` ids a sample, with those terms scaled to
    ``ids_per_sample`` (for forms of ``T_iter`` without ``k``, as the simulator's truths)."""
    r = _positive("ids_per_sample", ids_per_sample) / _positive("reference", reference)
    return params._replace(t2=params.t2 * r, t3=params.t3 * r)


def features(w: Any, p: Any, cw: Any, cp: Any, batch: Any, cores: float = math.inf, ids_per_sample: float = REFERENCE_IDS) -> np.ndarray:
    """Design matrix ``[N, 7]`` of ``T_iter``, one row per configuration (inputs broadcast)."""
    return _features(*_broadcast(w, p, cw, cp, batch), cores, _ps_share(ids_per_sample))


def _features(w: np.ndarray, p: np.ndarray, cw: np.ndarray, cp: np.ndarray, b: Any, cores: float, r: float) -> np.ndarray:
    o = over_commit(w, p, cw, cp, cores)
    return np.stack([np.ones_like(w), b / cw, r * w / (p * cp), r * w / p, w, b * o, b * o * o], axis=1)


def _t_iter(params: PerfParams, w: Any, p: Any, cw: Any, cp: Any, b: Any, cores: float, r: float) -> Any:
    t0, t1, t2, t3, t4, t5, t6 = params
    o = over_commit(w, p, cw, cp, cores)
    return t0 + t1 * b / cw + r * t2 * w / (p * cp) + r * t3 * w / p + t4 * w + (t5 + t6 * o) * b * o  # r * t2 first: at k = 26 the k-free sum, bit for bit


def step_time(
    params: PerfParams, w: Any, p: Any, cw: Any, cp: Any, batch: Any, cores: float = math.inf, ids_per_sample: float = REFERENCE_IDS
) -> np.ndarray:
    """Seconds per step of one worker, shape ``[N]`` (``features @ params``, unrolled)."""
    return _t_iter(params, *_broadcast(w, p, cw, cp, batch), cores, _ps_share(ids_per_sample))


def throughput(
    params: PerfParams, w: Any, p: Any, cw: Any, cp: Any, batch: Any, cores: float = math.inf, ids_per_sample: float = REFERENCE_IDS
) -> np.ndarray:
    """Samples per second of the whole job (every worker finishes a batch per step), ``[N]``."""
    x = _broadcast(w, p, cw, cp, batch)
    return x[0] * x[4] / _t_iter(params, *x, cores, _ps_share(ids_per_sample))


def throughput_rows(params: PerfParams, rows: np.ndarray, batch: int, cores: float = math.inf, ids_per_sample: float = REFERENCE_IDS) -> np.ndarray:
    """:func:`throughput` of configurations given as ``[N, 4]`` rows ``(w, p, cw, cp)``,
    for the policies' searches (hot: called at every step of a search)."""
    r = _ps_share(ids_per_sample)
    rows = np.asarray(rows, dtype=np.float64)
    if not (rows > 0).all():
        raise ValueError("workers, ps, worker_cpu and ps_cpu must be positive")
    w, p, cw, cp = rows.T
    return w * batch / _t_iter(params, w, p, cw, cp, batch, cores, r)


def config_rows(configs: list[Config]) -> np.ndarray:
    """Configurations as the ``[N, 4]`` rows ``(w, p, cw, cp)`` the row functions take."""
    return np.array([c.model_row() for c in configs], dtype=np.float64).reshape(-1, 4)


def _positive(name: str, x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be positive and finite, got {x!r}")
    return v


def _identifiable(a: np.ndarray, max_free: int) -> np.ndarray:
    """Greedy rank check over the columns of ``a`` in term order (Gram-Schmidt): a column is kept if enough of it lies
    outside the span of those kept before it, so the overhead ``t0`` is always chosen first and later, collinear terms are pinned."""
    keep = np.zeros(a.shape[1], dtype=bool)
    basis: list[np.ndarray] = []
    for j in range(a.shape[1]):
        if len(basis) >= max_free:
            break
        norm = np.linalg.norm(a[:, j])
        if norm == 0.0:
            continue
        r = a[:, j] / norm
        for _ in range(2):  # re-orthogonalise once for numerical stability
            for q in basis:
                r = r - (q @ r) * q
        rn = np.linalg.norm(r)
        if rn > _IDENT_TOL:
            keep[j] = True
            basis.append(r / rn)
    return keep


def _relative_rows(X: np.ndarray, t: np.ndarray, wts: np.ndarray, theta_prior: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The regression on relative error, rows ``a = X sqrt(w) / t`` against ``b = sqrt(w)``, and the prior fitted to them (what
    a term the data cannot identify is pinned to): the host terms as the prior has them, the job's under one least-squares
    scale to what the host terms leave of each step (the whole prior, should its host terms alone exceed the steps)."""
    b = np.sqrt(wts)
    a = X * (b / t)[:, None]
    return a, b, _anchor(a, b, theta_prior)


def _anchor(a: np.ndarray, b: np.ndarray, theta_prior: np.ndarray) -> np.ndarray:
    """The pinned values (see ``_relative_rows``): the machine's terms as they are, the job's scaled."""

    def scale(f: np.ndarray, target: np.ndarray) -> float:
        return float(f @ target / (f @ f)) if f @ f > 0 else 1.0

    job = np.where(HOST_TERMS, 0.0, theta_prior)
    s = scale(a @ job, b - a @ (theta_prior - job))
    if s > 0:
        return np.where(HOST_TERMS, theta_prior, s * theta_prior)
    return scale(a @ theta_prior, b) * theta_prior


def fit_params(X: np.ndarray, t_iter: np.ndarray, prior: PerfParams, weights: np.ndarray | None = None) -> tuple[PerfParams, tuple[bool, ...]]:
    """NNLS fit of measured step times, minimising weighted squared *relative* errors (step
    times span orders of magnitude across configurations; a window's noise is roughly
    multiplicative). Terms the data cannot identify (``_identifiable``) are pinned to the
    prior fitted to the data (``_anchor``): a job twice as heavy as the prior's is likely
    twice as slow in each of its own terms, so one point already moves every prediction,
    and a second never undoes that for the directions it does not explore. The host terms
    are not scaled: what a CPU asked beyond the cores costs a sample is the machine's
    (scaled with a compute-heavy job's step, it came out 1.4x too high; docs/ELASTIC.md).
    Returns the params and, per term, whether the data identified it."""
    X = np.asarray(X, dtype=np.float64).reshape(-1, N_TERMS)
    t = np.asarray(t_iter, dtype=np.float64).ravel()
    wts = np.ones_like(t) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if len(t) != len(X) or len(wts) != len(X):
        raise ValueError(f"X has {len(X)} rows but t_iter {len(t)} and weights {len(wts)}")
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ValueError(f"step times must be positive and finite, got {t[~(np.isfinite(t) & (t > 0))][0]!r}")
    if not np.all(np.isfinite(wts) & (wts >= 0)):
        raise ValueError(f"weights must be non-negative and finite, got {wts[~(np.isfinite(wts) & (wts >= 0))][0]!r}")
    theta_prior = np.asarray(prior, dtype=np.float64)
    n_rows = int(np.count_nonzero(wts > 0))
    if n_rows == 0:
        return PerfParams(*map(float, theta_prior)), (False,) * N_TERMS

    a, b, anchor = _relative_rows(X, t, wts, theta_prior)
    free = _identifiable(a, max_free=n_rows)
    theta = np.where(free, 0.0, anchor)
    if free.any():
        # NNLS clips the free terms at zero where the pinned ones already overshoot. (scipy and pandas are
        # imported where used: every worker and PS loads this module with the master's actor handle.)
        from scipy.optimize import nnls

        theta[free], _ = nnls(a[:, free], b - a @ theta)
    return PerfParams(*map(float, theta)), tuple(bool(x) for x in free)


def coefficient_cov(X: np.ndarray, t_iter: np.ndarray, params: PerfParams, prior: PerfParams, weights: np.ndarray | None = None) -> np.ndarray:
    """Posterior covariance ``[N_TERMS, N_TERMS]`` of the coefficients, a Bayesian linear model of the relative-error
    regression :func:`fit_params` solves: each coefficient a priori the prior fitted to the data (as the fit pins it)
    give or take ``PRIOR_REL_SD`` of it (a term the prior sets to 0 may still bring ``ZERO_TERM_SHARE`` of a measured
    step), each window's relative error ``sigma`` the fit's residual spread per degree of freedom, at least
    ``NOISE_FLOOR``. Weights count relative to their mean (a window's length in seconds must not make it 30x surer).
    Measured directions shrink to ``sigma``, unmeasured ones keep the prior's spread. (The prediction stays the NNLS
    fit: the posterior mean would give up the non-negativity that keeps extrapolations sane.)"""
    X = np.asarray(X, dtype=np.float64).reshape(-1, N_TERMS)
    t = np.asarray(t_iter, dtype=np.float64).ravel()
    wts = np.ones_like(t) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if (wts > 0).any():
        wts = wts / wts[wts > 0].mean()
    theta_prior = np.asarray(prior, dtype=np.float64)
    a, b, anchor = _relative_rows(X, t, wts, theta_prior)
    resid = b - a @ np.asarray(params, dtype=np.float64)
    dof = int(np.count_nonzero(wts > 0)) - N_TERMS
    s2 = max(float(resid @ resid) / dof if dof > 0 else 0.0, NOISE_FLOOR**2)
    phi_ref = np.abs(X).max(axis=0) if len(X) else np.zeros(N_TERMS)
    floor = np.where(phi_ref > 0, ZERO_TERM_SHARE * (float(np.median(t)) if len(t) else 0.0) / np.maximum(phi_ref, 1e-300), 0.0)
    d = np.maximum(np.maximum(PRIOR_REL_SD * anchor, floor), 1e-12)
    # Whitened, so the matrix solved is I + (positive): well conditioned whatever the scales.
    m = np.eye(N_TERMS) + (d[:, None] * (a.T @ a) * d[None, :]) / s2
    cov = d[:, None] * np.linalg.solve(m, np.diag(d))
    return (cov + cov.T) / 2


def relative_sd_rows(
    cov: np.ndarray, params: PerfParams, rows: np.ndarray, batch: int, cores: float = math.inf, ids_per_sample: float = REFERENCE_IDS
) -> np.ndarray:
    """The model's relative uncertainty about the throughput of ``[N, 4]`` configurations
    ``(w, p, cw, cp)``: ``sqrt(phi^T cov phi)`` over the predicted step time ``phi^T theta``,
    at most ``MAX_REL_SD`` (the linearisation means nothing beyond). Small near measured
    configurations, the prior's spread where no window says anything."""
    rows = np.asarray(rows, dtype=np.float64)
    if not (rows > 0).all():  # (validated here, not per column: a search's hot path)
        raise ValueError("workers, ps, worker_cpu and ps_cpu must be positive")
    phi = _features(*rows.T, float(batch), cores, _ps_share(ids_per_sample))
    var = np.maximum(np.einsum("ni,ij,nj->n", phi, cov, phi), 0.0)
    sd = np.sqrt(var) / (phi @ np.asarray(params, dtype=np.float64))
    return np.clip(np.where(np.isfinite(sd), sd, MAX_REL_SD), 0.0, MAX_REL_SD)


class PerfModel:
    """Online-fitted model of one job: add a measured window, refit, predict configurations.

    With no points it predicts from the prior; each ``observe`` refits at once, so right
    after it ``predict`` of the measured configuration is close to the measurement (equal
    to it while the data identify no more terms than distinct configurations)."""

    def __init__(self, batch_size: int, prior: PerfParams | None = None, cores: float = math.inf, ids_per_sample: float = REFERENCE_IDS) -> None:
        """``cores``: physical cores of the nodes the job runs on (``inf``: unknown, or never
        over-committed), for the host terms ``t5`` and ``t6``; ``ids_per_sample``: the
        job's ``k``, for the PS terms (the prior's are Criteo's, ``REFERENCE_IDS``)."""
        if not (isinstance(batch_size, (int, np.integer)) and batch_size > 0):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not (isinstance(cores, (int, float, np.integer, np.floating)) and cores > 0):
            raise ValueError(f"cores must be a positive number (or inf), got {cores!r}")
        prior = DEFAULT_PRIOR if prior is None else PerfParams(*map(float, prior))
        if not all(math.isfinite(x) and x >= 0 for x in prior) or sum(prior) <= 0:
            raise ValueError(f"prior coefficients must be non-negative, finite, not all zero, got {prior!r}")
        self.batch_size = int(batch_size)
        self.prior = prior
        self.cores = float(cores)
        self.ids_per_sample = _positive("ids_per_sample", ids_per_sample)
        self._rows: list[tuple[int, int, float, float, float, float]] = []  # w, p, cw, cp, thr, weight
        self._params = prior
        self._identified: tuple[bool, ...] = (False,) * N_TERMS
        self._cov: np.ndarray | None = None  # the posterior, computed when first asked after a refit

    @property
    def params(self) -> PerfParams:
        return self._params

    @property
    def identified(self) -> tuple[bool, ...]:
        """Per term, whether the measured configurations determined it (else: pinned to the prior)."""
        return self._identified

    @property
    def n_points(self) -> int:
        return len(self._rows)

    def observe(self, config: Config, throughput: float, weight: float = 1.0) -> None:
        """Add one measured window (samples/s of the whole job) and refit."""
        self._add(*config.model_row(), throughput, weight)
        self._refit()

    def _add(self, w: int, p: int, cw: float, cp: float, thr: Any, weight: Any) -> None:
        thr, weight = _positive("throughput", thr), _positive("weight", weight)
        _broadcast(w, p, cw, cp, self.batch_size)  # validates the configuration
        self._rows.append((int(w), int(p), float(cw), float(cp), thr, weight))

    def _design(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The observations as the regression sees them: features, step times, weights."""
        if not self._rows:
            return np.zeros((0, N_TERMS)), np.zeros(0), np.zeros(0)
        w, p, cw, cp, thr, wt = (np.array(c, dtype=np.float64) for c in zip(*self._rows))
        return features(w, p, cw, cp, self.batch_size, self.cores, self.ids_per_sample), w * self.batch_size / thr, wt

    def _refit(self) -> None:
        self._cov = None
        X, t_iter, wt = self._design()  # no points: fit_params gives the prior back
        self._params, self._identified = fit_params(X, t_iter, self.prior, wt)

    def predict(self, config: Config) -> float:
        """Predicted throughput (samples/s) of ``config``."""
        return float(self.predict_many([config])[0])

    def predict_many(self, configs: list[Config]) -> np.ndarray:
        if not configs:
            return np.zeros(0)
        return throughput_rows(self._params, config_rows(configs), self.batch_size, self.cores, self.ids_per_sample)

    def relative_sd(self, rows: np.ndarray) -> np.ndarray:
        """How unsure the model is of each ``[N, 4]`` configuration's throughput (relative
        standard deviation; see :func:`relative_sd_rows`)."""
        if self._cov is None:
            X, t_iter, wt = self._design()
            self._cov = coefficient_cov(X, t_iter, self._params, self.prior, wt)
        return relative_sd_rows(self._cov, self._params, rows, self.batch_size, self.cores, self.ids_per_sample)

    def points(self) -> pd.DataFrame:
        """The observations, one row each, in the order they came."""
        import pandas as pd

        rows = [(w, p, cw, cp, self.batch_size, thr, wt) for w, p, cw, cp, thr, wt in self._rows]
        return pd.DataFrame(rows, columns=_POINT_COLUMNS)

    def to_dict(self) -> dict:
        """JSON-safe state; the fit is recomputed from the points on load."""
        return {
            "batch_size": self.batch_size,
            "cores": self.cores if math.isfinite(self.cores) else None,
            "ids_per_sample": self.ids_per_sample,
            "prior": dict(self.prior._asdict()),
            "points": self.points().to_dict("records"),
            "params": dict(self._params._asdict()),  # informational
        }

    @classmethod
    def from_dict(cls, d: dict) -> PerfModel:
        model = cls(int(d["batch_size"]), PerfParams(**d["prior"]), d.get("cores") or math.inf, d.get("ids_per_sample", REFERENCE_IDS))
        for pt in d.get("points", []):
            model._add(pt["workers"], pt["ps"], pt["worker_cpu"], pt["ps_cpu"], pt["throughput"], pt.get("weight", 1.0))
        model._refit()
        return model

    def __repr__(self) -> str:
        terms = ", ".join(f"{k}={v:.3g}{'' if ok else '*'}" for (k, v), ok in zip(self._params._asdict().items(), self._identified))
        return f"PerfModel(B={self.batch_size}, cores={self.cores:g}, k={self.ids_per_sample:g}, n={self.n_points}, {terms})  (* = pinned to the prior)"
