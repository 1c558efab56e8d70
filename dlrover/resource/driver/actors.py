"""Per-actor inputs of a policy's runtime corrections: straggler marks and memory trends.

Both come from the actors' own reports, kept over time: a worker is slow *since* the
first report that showed it over the bar, and an RSS trend is a slope over recent
samples. Part of :class:`dlrover.resource.driver.PolicyDriver`, so the live master and
the simulator mark stragglers and fit trends the same way.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from dlrover.resource.plan import ActorMetrics


class TrendParams(NamedTuple):
    """How an actor's memory trend is estimated: the least-squares slope (MB/s) of its
    RSS samples of the last ``span_s``, once there are ``min_points`` spanning ``min_span_s``."""

    warmup_s: float = 15.0  # an actor's RSS grows while it warms up: not a leak, so not in the trend
    every_s: float = 1.0  # at most one sample per this many seconds
    span_s: float = 60.0  # only samples this recent count
    min_points: int = 5
    min_span_s: float = 10.0


DEFAULT_TREND = TrendParams()


class ActorWatch:
    """Straggler marks and RSS samples of a job's actors, by actor name."""

    DEFAULT_FACTOR = 1.5  # "slow": over this x the median of the actor's role

    def __init__(self, factor: float = DEFAULT_FACTOR, trend: TrendParams = DEFAULT_TREND) -> None:
        self.factor = factor
        self.params = trend
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._first_seen: dict[str, float] = {}
        self._slow_since: dict[str, float] = {}

    def rss(self, name: str, at_s: float, rss_mb: float) -> None:
        """Record an RSS sample; those of the actor's first ``warmup_s`` are skipped."""
        p = self.params
        first = self._first_seen.setdefault(name, at_s)
        points = self._samples.setdefault(name, deque())
        if at_s - first < p.warmup_s or (points and at_s - points[-1][0] < p.every_s):
            return
        points.append((at_s, rss_mb))
        while points[0][0] < at_s - p.span_s:
            points.popleft()

    def trend(self, name: str, now: float | None = None) -> float:
        """Least-squares slope (MB/s) of the actor's RSS samples of the last ``span_s``
        before ``now`` (else before its latest sample); 0 until there are enough."""
        p = self.params
        points = self._samples.get(name)
        while points and now is not None and points[0][0] < now - p.span_s:
            points.popleft()
        if not points or len(points) < p.min_points or points[-1][0] - points[0][0] < p.min_span_s:
            return 0.0
        return _slope(points)

    def note_steps(self, reports: Iterable[ActorMetrics]) -> None:
        """Mark the workers whose step time (the PS whose time per id served) is over
        ``factor`` x the median of their role's actors reporting one (at least two), from
        the report's time on; unmark the others. A report without a time (no step or call
        in its window: parked for a cut) changes nothing. Per id, not per call: a PS
        holding more of the hot ids is busier per call without being slow (the hot-PS
        path rebalances it), while a slow host or link costs every id it serves."""
        reports = list(reports)
        for role, time_of in (("worker", _step_time), ("ps", _time_per_id)):
            actors = [a for a in reports if a.role == role and time_of(a) > 0]
            median = statistics.median(time_of(a) for a in actors) if len(actors) >= 2 else 0.0
            for a in actors:
                if median > 0 and time_of(a) > self.factor * median:
                    self._slow_since.setdefault(a.name, a.at_s)
                else:
                    self._slow_since.pop(a.name, None)

    def slow_since(self, name: str, default: float | None = None) -> float | None:
        """Since when the actor has been marked slow (``default``: it is not)."""
        return self._slow_since.get(name, default)

    def metrics(self, reports: Iterable[ActorMetrics]) -> dict[str, ActorMetrics]:
        """``reports`` by name, with straggler marks (updated from them) and RSS trends."""
        reports = list(reports)
        self.note_steps(reports)
        out = {}
        for a in reports:
            m = out[a.name] = object.__new__(ActorMetrics)  # a shallow copy, ~8x cheaper than dataclasses.replace (hot in the simulator)
            m.__dict__.update(vars(a))
            m.slow_since_s = self._slow_since.get(a.name)
            m.rss_trend_mb_per_s = self.trend(a.name, a.at_s)
        return out

    def forget(self, name: str) -> None:
        self._samples.pop(name, None)
        self._first_seen.pop(name, None)
        self._slow_since.pop(name, None)

    def clear(self) -> None:
        self._samples.clear()
        self._first_seen.clear()
        self._slow_since.clear()


def _step_time(a: ActorMetrics) -> float:
    return a.step_time_s


def _time_per_id(a: ActorMetrics) -> float:
    return a.us_per_id


def _slope(points: deque[tuple[float, float]]) -> float:
    """Least-squares slope of ``y`` on ``t`` (``np.polyfit(t, y, 1)[0]``) in one pass of
    plain floats, times taken from the first sample's (the simulator fits millions)."""
    t0 = points[0][0]
    n = st = sy = stt = sty = 0.0
    for t, y in points:
        t -= t0
        n += 1
        st += t
        sy += y
        stt += t * t
        sty += t * y
    den = n * stt - st * st
    return (n * sty - st * sy) / den if den > 0 else 0.0
