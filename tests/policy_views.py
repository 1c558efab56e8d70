"""Hand-built job views for the allocation-policy tests: configs, a performance model
whose prior is the test's ground truth (with no points it predicts the prior), actor
metrics and history records. No Ray."""

from __future__ import annotations

from dlrover.resource.configs import Budget, Config
from dlrover.resource.dlrover_rm import DLRoverRMPolicy
from dlrover.resource.history import HistoryRecord
from dlrover.resource.perf_model import PerfModel, PerfParams
from dlrover.resource.plan import ActorMetrics, JobView, Measurement
from dlrover.resource.policy_config import DLRoverRMKnobs

B = 512
# Worker-compute bound: throughput ~ linear in worker CPUs (adding CPU pays off).
COMPUTE_BOUND = PerfParams(t0=0.001, t1=2e-4, t2=1e-5, t3=1e-5, t4=1e-5)
# Saturating in workers (contention), as in DLRover-RM's Fig. 6: an interior optimum.
SATURATING = PerfParams(t0=0.004, t1=2e-5, t2=0.004, t3=0.003, t4=0.004)
BIG = Budget(cpu=64, memory_mb=1_000_000, max_workers=32, max_ps=16)


def cfg(w=2, p=1, cw=1.0, cp=1.0, wm=2048, pm=2048) -> Config:
    return Config(w, p, float(cw), float(cp), wm, pm)


def key(c: Config) -> tuple:
    return (c.workers, c.ps, c.worker_cpu, c.ps_cpu)


def truth(params: PerfParams, c: Config) -> float:
    return PerfModel(B, params).predict(c)


def mk_view(config=None, prior=COMPUTE_BOUND, measured=None, **kw) -> JobView:
    """A view whose running config has been measured for 120 s (at ``measured`` or the truth)."""
    config = config or cfg()
    model = PerfModel(B, prior)
    thr = truth(prior, config) if measured is None else measured
    defaults = dict(
        now_s=1000.0,
        config=config,
        budget=BIG,
        batch_size=B,
        signature="m-x",
        model=model,
        current=Measurement(config, thr, duration_s=120.0, at_s=1000.0),
        progress=0.2,
        remaining_s=4000.0,
        last_change_s=0.0,
        requested=config,
    )
    defaults.update(kw)
    return JobView(**defaults)


def rm(**knobs) -> DLRoverRMPolicy:
    return DLRoverRMPolicy(DLRoverRMKnobs(**knobs))


def worker(name, **kw) -> ActorMetrics:
    return ActorMetrics(name=name, role="worker", cpu=1.0, memory_limit_mb=2048, **kw)


def ps(name, **kw) -> ActorMetrics:
    return ActorMetrics(name=name, role="ps", cpu=1.0, memory_limit_mb=2048, **kw)


def record(job_id, best, thr, finished_at, sig="m-x", measurements=(), **kw) -> HistoryRecord:
    return HistoryRecord(
        signature=sig,
        dataset=kw.pop("dataset", "d-1"),
        job_id=job_id,
        finished_at=finished_at,
        final_config=kw.pop("final", best),
        best_config=best,
        best_throughput=thr,
        measurements=[{"config": c.to_dict(), "throughput": t, "duration_s": 60.0} for c, t in measurements],
        **kw,
    )

