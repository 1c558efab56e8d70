"""What the policy measures of each actor: the workers' latest reports and the PS's stats,
polled each control step, as the :class:`ActorMetrics` the policy driver takes."""

from __future__ import annotations

from typing import Callable

from dlrover.master.cluster import ActorDied, CallTimeout
from dlrover.master.job import Job
from dlrover.resource.plan import ActorMetrics

PS_STATS_TIMEOUT_S = 5.0


class ActorStats:
    def __init__(self, job: Job, rss: Callable[[str, float, float], None]) -> None:
        """``rss(actor, now, mb)``: each PS's resident memory goes to the driver's trends."""
        self.m = job
        self._rss = rss
        self.peak_rss = {"worker": 0.0, "ps_total": 0.0}  # for the history record (memory right-sizing)
        self._ps_prev: dict[int, tuple[float, float, int]] = {}  # PS id -> (uptime, busy seconds, ids served) at the last poll
        self._ps: dict[int, ActorMetrics] = {}

    def worker_rss(self, mb: float) -> None:
        self.peak_rss["worker"] = max(self.peak_rss["worker"], mb)

    def ps(self) -> dict[int, ActorMetrics]:
        """Each PS's metrics at the last poll."""
        return dict(self._ps)

    def poll(self, now: float) -> list[ActorMetrics]:
        """Every worker's latest report and every PS's stats (asked now)."""
        lz = self.m.launcher
        reports = {n: r for n, r in self.m.books.worker_reports().items() if n in lz.workers}
        out = []
        for name, r in reports.items():
            cpu, mem = lz.resources.get(name, (1.0, 0))
            out.append(
                ActorMetrics(
                    name=name,
                    role="worker",
                    cpu=cpu,
                    memory_limit_mb=mem,
                    rss_mb=r.rss_mb,
                    cpu_util=r.cpu_percent / 100.0 / max(cpu, 1e-9),
                    step_time_s=r.step_time_s,
                    samples_per_s=r.samples_per_s,
                    wait_ps_s=r.wait_ps_s,
                    queue_depth=r.queue_depth,
                    at_s=r.at_s if r.at_s is not None else now,
                )
            )
        return out + list(self._poll_ps(now).values())

    def _poll_ps(self, now: float) -> dict[int, ActorMetrics]:
        lz = self.m.launcher
        ids = list(lz.ps)
        try:
            stats = self.m.cluster.get([lz.ps[k].stats.remote() for k in ids], timeout=PS_STATS_TIMEOUT_S)
        except (CallTimeout, ActorDied):
            return self._ps  # a PS lost: recovery's probes find it
        out = {}
        for k, st in zip(ids, stats):
            name = lz.ps_name(k)
            prev = self._ps_prev.get(k)
            busy = us_per_id = 0.0
            served = st.ids
            if prev is not None and st.uptime_s > prev[0]:
                busy = (st.busy_s - prev[1]) / (st.uptime_s - prev[0])
                if served > prev[2]:
                    us_per_id = 1e6 * (st.busy_s - prev[1]) / (served - prev[2])
            self._ps_prev[k] = (st.uptime_s, st.busy_s, served)
            self._rss(name, now, st.rss_mb)
            cpu, mem = lz.resources.get(name, (1.0, 0))
            out[k] = ActorMetrics(
                name=name,
                role="ps",
                cpu=cpu,
                memory_limit_mb=mem,
                rss_mb=st.rss_mb,
                cpu_util=st.cpu_percent / 100.0 / max(cpu, 1e-9),
                busy=max(0.0, busy),
                us_per_id=max(0.0, us_per_id),
                queue_depth=st.pending,
                at_s=now,
            )
        self._ps = out
        if len(out) == len(ids):
            self.peak_rss["ps_total"] = max(self.peak_rss["ps_total"], sum(m.rss_mb for m in out.values()))
        for m in out.values():
            self.m.events.add("ps_metrics", actor=m.name, busy=m.busy, us_per_id=m.us_per_id, rss_mb=m.rss_mb, cpu_util=m.cpu_util, pending=m.queue_depth)
        return out
