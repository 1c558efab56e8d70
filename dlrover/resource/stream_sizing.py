"""Stage 2 of ``dlrover_rm`` for a job following arriving data (``JobView.stream``): not
the most samples/s per CPU, but the least CPU that keeps the lag under its bound.

What the stream needs is its arrival rate with headroom, plus the backlog drained before
its oldest row passes the bound::

    need = arrival x (1 + stream_headroom) + lag_rows / max(max_lag_s - lag_s, max_lag_s / 10)

The candidates are every configuration within the budget (vectorised, as the grid
search), valued at the model's prediction calibrated by the running configuration's
measurement. Training that keeps up measures the arrivals, not its capacity: then the
calibration is left out (the model alone, fit on windows that were busy), and nothing
scales out, since whatever runs is keeping up. Falling behind, a configuration measured
below the need scales out to the cheapest one predicted to meet it (the fastest when
none does). Keeping up, a cheaper one predicted to meet the need with
``stream_scale_in_margin`` to spare scales in.
"""

from __future__ import annotations

import numpy as np

from dlrover.resource.perf_model import throughput_rows
from dlrover.resource.plan import JobView, ResourcePlan, StreamView
from dlrover.resource.rm_search import Key, config_key, with_memory


def key(row: np.ndarray) -> Key:
    return (int(row[0]), int(row[1]), float(row[2]), float(row[3]))


def stream_need(s: StreamView, headroom: float) -> float:
    """Samples/s that keep the lag under ``s.max_lag_s``."""
    return s.arrival_per_s * (1 + headroom) + s.lag_rows / max(s.max_lag_s - s.lag_s, s.max_lag_s / 10)


def stream_step(view: JobView, t_now: float | None, rows: np.ndarray, headroom: float, margin: float, ps_rss_mb: float, watermark: float) -> ResourcePlan | None:
    """The plan that keeps ``view.stream``'s lag bound at the least CPU among ``rows``
    (:func:`~dlrover.resource.rm_search.feasible_grid`), or None (stay). ``t_now``: the running window's throughput
    (None: not measured yet, the model's prediction stands in)."""
    s, cur = view.stream, view.config
    assert s is not None
    if not len(rows):
        return None
    need = stream_need(s, headroom)
    m = view.model
    cpu = rows[:, 0] * rows[:, 2] + rows[:, 1] * rows[:, 3]
    pred = throughput_rows(m.params, rows, m.batch_size, m.cores, m.ids_per_sample)
    start = config_key(cur)
    pred_cur = float(throughput_rows(m.params, np.asarray([start], dtype=np.float64), m.batch_size, m.cores, m.ids_per_sample)[0])
    t_now = pred_cur if t_now is None else t_now
    calib = 1.0 if s.caught_up or pred_cur <= 0 else t_now / pred_cur
    thr = pred * calib
    state = f"arrivals {s.arrival_per_s:,.0f}/s, {s.lag_rows:,.0f} rows behind ({s.lag_s:.0f}s, bound {s.max_lag_s:g}s)"
    if not s.caught_up and t_now < need:
        meets = np.flatnonzero(thr >= need)
        i = int(meets[np.argmin(cpu[meets])]) if len(meets) else int(np.argmax(thr))
        if key(rows[i]) == start or thr[i] <= t_now:
            return None
        new = with_memory(key(rows[i]), cur, ps_rss_mb, watermark)
        return ResourcePlan(new, f"stream: {state} need {need:,.0f} samples/s, {cur.short()} trains {t_now:,.0f}: "
                                 f"-> {new.short()}, predicted {thr[i]:,.0f}", stage="stream", predicted_throughput=float(thr[i]))  # fmt: skip
    if s.caught_up:
        cheaper = np.flatnonzero((thr >= need * (1 + margin)) & (cpu < cur.cpu - 1e-9))
        if not len(cheaper):
            return None
        i = int(cheaper[np.argmin(cpu[cheaper])])
        new = with_memory(key(rows[i]), cur, ps_rss_mb, watermark)
        return ResourcePlan(new, f"stream: {state} need {need:,.0f} samples/s: {new.short()} predicted {thr[i]:,.0f} "
                                 f"frees {cur.cpu - new.cpu:g} CPU", stage="stream", predicted_throughput=float(thr[i]))  # fmt: skip
    return None
