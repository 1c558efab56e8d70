"""Stage 2 of ``dlrover_rm`` (:mod:`dlrover.resource.dlrover_rm`): the search over
configurations for the utility's maximum, greedy (hill climbing) or over the whole grid.

A point of the search space is a :data:`Key` (counts and CPU sizes); memory does not
enter the performance model, so :func:`with_memory` gives a point its memory sizes.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from dlrover.resource.perf_model import throughput, throughput_rows
from dlrover.resource.configs import Budget, Config
from dlrover.resource.plan import JobView

Key = tuple[int, int, float, float]  # (workers, ps, worker_cpu, ps_cpu)


def config_key(c: Config) -> Key:
    return (c.workers, c.ps, float(c.worker_cpu), float(c.ps_cpu))


def with_memory(key: Key, like: Config, ps_rss_mb: float = 0.0, watermark: float = 0.9) -> Config:
    """``key`` with ``like``'s memory sizes; except that with fewer PS, when the tables the
    PS hold now (``ps_rss_mb`` each) spread over fewer would pass ``watermark`` of their
    memory, each PS gets enough. (Keeping the size otherwise lets the scaler keep the PS
    it has: a PS of another size is a new actor and a vshard migration.)"""
    ps_mem = like.ps_memory_mb
    if key[1] < like.ps and ps_rss_mb > 0:
        need = ps_rss_mb * like.ps / key[1] / watermark
        if need > ps_mem:
            ps_mem = int(math.ceil(need / 64) * 64)
    return Config(key[0], key[1], key[2], key[3], like.worker_memory_mb, ps_mem)


def ps_rss(view: JobView, horizon_s: float) -> float:
    """The largest PS RSS the job reports, extrapolated along its trend over ``horizon_s``
    as the memory correction does (MB; 0 when unknown)."""
    return max((a.rss_mb + max(0.0, a.rss_trend_mb_per_s) * horizon_s for a in view.actors.values() if a.role == "ps"), default=0.0)


class Scores:
    """Predicted throughput (x ``calib``; a measured point's measurement) and optimism
    (``explore`` x the model's doubt; 0 where measured) of search points, each computed
    once per search: the climb scores the points around every step, the proposal reads
    its ends again."""

    def __init__(self, model: Any, measured: dict[Key, float], calib: float, explore: float) -> None:
        self.model, self.measured, self.calib, self.explore = model, measured, calib, explore
        self._memo: dict[Key, tuple[float, float]] = {}

    def of(self, keys: list[Key]) -> tuple[np.ndarray, np.ndarray]:
        new = [x for x in dict.fromkeys(keys) if x not in self._memo]
        if new:
            m, rows = self.model, np.asarray(new, dtype=np.float64)
            pred = throughput_rows(m.params, rows, m.batch_size, m.cores, m.ids_per_sample) * self.calib  # memory does not enter the model
            sd = m.relative_sd(rows) if self.explore != 0 else np.zeros(len(new))
            for x, p, d in zip(new, pred, sd):
                self._memo[x] = (self.measured.get(x, float(p)), 0.0 if x in self.measured else self.explore * float(d))
        got = [self._memo[x] for x in keys]
        return np.array([g[0] for g in got], dtype=np.float64), np.array([g[1] for g in got], dtype=np.float64)


def feasible_grid(cur: Config, b: Budget, max_w: int, max_p: int, wcpus: list[float], pcpus: list[float], ps_rss_mb: float = 0.0, watermark: float = 0.9) -> np.ndarray:
    """Every configuration of the grid within budget ``b``, as ``[N, 4]`` rows
    ``(w, p, cw, cp)``, with ``cur``'s memory sizes as :func:`with_memory` gives them."""
    axes = (np.arange(1, max_w + 1.0), np.arange(1, max_p + 1.0), np.array(wcpus, dtype=np.float64), np.array(pcpus, dtype=np.float64))
    w, p, cw, cp = (x.ravel() for x in np.meshgrid(*axes, indexing="ij"))
    need = ps_rss_mb * cur.ps / p / watermark
    ps_mem = np.where((p < cur.ps) & (need > cur.ps_memory_mb), np.ceil(need / 64) * 64, cur.ps_memory_mb)  # as with_memory
    fit = (w * cw + p * cp <= b.cpu + 1e-9) & (w * cur.worker_memory_mb + p * ps_mem <= b.memory_mb)
    return np.stack([w, p, cw, cp], axis=1)[fit]


def grid_best(
    view: JobView, start: Key, max_w: int, max_p: int, wcpus: list[float], pcpus: list[float],
    measured: dict[Key, float], calib: float, t_now: float, bar: float, kappa: float = 0.0, ps_rss_mb: float = 0.0,
    watermark: float = 0.9, explore: float = 0.0,
) -> Key:
    """The grid point of highest utility (vectorised: the grid may hold ~10^5 points);
    ``explore``: each unmeasured point's log throughput gains ``explore`` x the model's
    relative uncertainty there."""
    w, p, cw, cp = feasible_grid(view.config, view.budget, max_w, max_p, wcpus, pcpus, ps_rss_mb, watermark).T
    cpu = w * cw + p * cp
    if len(w) == 0:
        return start
    batch = getattr(view.model, "batch_size", view.batch_size)
    thr = np.asarray(throughput(view.model.params, w, p, cw, cp, batch, view.model.cores, view.model.ids_per_sample), dtype=np.float64).ravel() * calib
    u = np.log(np.maximum(thr, 1e-12)) - bar * cpu - kappa * np.log(cpu)
    if explore != 0:
        u += explore * view.model.relative_sd(np.stack([w, p, cw, cp], axis=1))
    for x, thr_x in measured.items():  # a handful of points
        at = (w == x[0]) & (p == x[1]) & (cw == x[2]) & (cp == x[3])
        x_cpu = x[0] * x[2] + x[1] * x[3]
        u[at] = math.log(thr_x) - bar * x_cpu - kappa * math.log(x_cpu)
    i = int(np.argmax(u))
    start_cpu = start[0] * start[2] + start[1] * start[3]
    u_start = math.log(measured.get(start, t_now)) - bar * start_cpu - kappa * math.log(start_cpu)
    if u[i] <= u_start + 1e-12:
        return start
    return (int(w[i]), int(p[i]), float(cw[i]), float(cp[i]))


def hill_climb(
    start: Key, ok: Callable[[Key], bool], utility: Callable[[list[Key]], np.ndarray], wcpus: list[float], pcpus: list[float]
) -> Key:
    """Greedy marginal gain: take the best one-step move while it raises the utility."""

    def step(values: list[float], v: float, d: int) -> float | None:
        i = values.index(v) + d
        return values[i] if 0 <= i < len(values) else None

    x, ux = start, float(utility([start])[0])
    seen = {start}
    for _ in range(1000):
        moves: list[Key] = []
        w, p, cw, cp = x
        moves += [(w + 1, p, cw, cp), (w - 1, p, cw, cp), (w, p + 1, cw, cp), (w, p - 1, cw, cp)]
        for d in (1, -1):
            ncw, ncp = step(wcpus, cw, d), step(pcpus, cp, d)
            if ncw is not None:
                moves.append((w, p, ncw, cp))
            if ncp is not None:
                moves.append((w, p, cw, ncp))
        moves = [m for m in moves if m not in seen and ok(m)]
        if not moves:
            break
        u = utility(moves)
        i = int(np.argmax(u))
        if u[i] <= ux + 1e-12:
            break
        x, ux = moves[i], float(u[i])
        seen.add(x)
    return x
