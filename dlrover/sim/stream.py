"""``dlrover simulate --trace diurnal``: one job following a stream whose arrivals follow a
day/night cycle, sized by ``dlrover_rm``'s stream stage (the policy object and the
``PolicyDriver`` the live master runs) against a static allocation sized for the peak.

Time advances in steps of ``step_s``. Rows arrive at ``arrival_per_s(t)`` (a cosine
between ``trough x peak`` at night and ``peak`` by day, each seed with its own phase and
peak); the job trains at the truth's throughput of its configuration (``T_iter`` with
the cluster prior's terms, each drawn within +/-40% per seed: the policy's model has to
learn them), never more than has arrived. The lag is the age of the oldest row not
trained. A change takes ``rescale_s`` (the old configuration trains on meanwhile, as a
live rescale does). Windows that kept up measured the arrivals, not the capacity: they
are dropped unmeasured, so the model learns only from busy windows.

Reported per run: CPU-hours held, seconds (and fraction of the run) over the lag bound,
the largest lag, and the changes made.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from dlrover.resource.configs import Budget, Config
from dlrover.resource.driver import PolicyDriver, Progress
from dlrover.resource.perf_model import PerfParams, throughput_rows
from dlrover.resource.plan import StreamView
from dlrover.resource.policies import policy_factory
from dlrover.resource.rm_search import feasible_grid

DAY_S = 86_400.0


@dataclass(frozen=True)
class StreamSettings:
    days: float = 3.0
    step_s: float = 60.0
    control_interval_s: float = 300.0
    peak_per_s: float = 60_000.0  # arrivals at the day's peak (samples/s)
    trough: float = 0.2  # the night's rate, as a fraction of the peak
    max_lag_s: float = 900.0
    rescale_s: float = 120.0
    batch_size: int = 512
    budget: Budget = Budget(cpu=512, memory_mb=2_000_000, max_workers=64, max_ps=32)
    start: Config = Config(4, 2, 4.0, 4.0, 8192, 16384)
    headroom: float = 0.2  # static: sized for the peak x (1 + this), as the stream stage sizes


def arrival_per_s(t: float, s: StreamSettings, peak: float, phase: float) -> float:
    day = 0.5 - 0.5 * math.cos(2 * math.pi * (t / DAY_S + phase))
    return peak * (s.trough + (1 - s.trough) * day)


def truth_of(prior: PerfParams, seed: int) -> PerfParams:
    rng = np.random.default_rng([seed, 7])
    return PerfParams(*(float(v) * float(rng.uniform(0.6, 1.4)) for v in prior))


def true_thr(truth: PerfParams, c: Config, batch: int) -> float:
    return float(throughput_rows(truth, np.array([[c.workers, c.ps, c.worker_cpu, c.ps_cpu]], dtype=np.float64), batch)[0])


def peak_config(truth: PerfParams, s: StreamSettings, peak: float, knobs) -> Config:  # noqa: ANN001 - DLRoverRMKnobs
    """The least CPU whose true throughput meets the peak with headroom (what a team sizes
    a static job for, knowing the truth)."""
    rows = feasible_grid(s.start, s.budget, s.budget.max_workers, s.budget.max_ps, list(knobs.worker_cpu_choices), list(knobs.ps_cpu_choices))
    thr = throughput_rows(truth, rows, s.batch_size)
    cpu = rows[:, 0] * rows[:, 2] + rows[:, 1] * rows[:, 3]
    ok = np.flatnonzero(thr >= peak * (1 + s.headroom))
    i = int(ok[np.argmin(cpu[ok])]) if len(ok) else int(np.argmax(thr))
    w, p, cw, cp = rows[i]
    return Config(int(w), int(p), float(cw), float(cp), s.start.worker_memory_mb, s.start.ps_memory_mb)


def simulate_stream(policy: str, seed: int, s: StreamSettings = StreamSettings(), config_path: str | None = None) -> dict:
    """One run: ``policy`` is ``dlrover_rm`` (its stream stage) or ``static-peak``."""
    from dlrover.sim import cluster_policy_config

    make = policy_factory("dlrover_rm", cluster_policy_config("dlrover_rm", config_path), {}, overrides_source="simulate")
    pol = make()
    rng = np.random.default_rng(seed)
    peak, phase = s.peak_per_s * float(rng.uniform(0.8, 1.2)), float(rng.uniform(0, 1))
    truth = truth_of(pol.model_prior() or PerfParams(0.01, 6e-4, 0.03, 0.004, 3e-4), seed)
    static = policy == "static-peak"
    config = peak_config(truth, s, peak, pol.knobs) if static else s.start
    driver = PolicyDriver(pol, budget=s.budget, requested=config, batch_size=s.batch_size, signature="stream", warmup_s=s.step_s)
    driver.open(config, 0.0)
    chunks: deque[list[float]] = deque()  # [arrival time, rows left], oldest first
    done = arrived = cpu_s = over_s = max_lag = 0.0
    busy, changes, pending, next_tick = True, 0, None, s.control_interval_s
    for k in range(int(s.days * DAY_S / s.step_s)):
        t = k * s.step_s
        if pending is not None and t >= pending[0]:
            config, pending = pending[1], None
            (driver.close if busy else lambda: None)()
            driver.open(config, t)
            busy = True
        new = arrival_per_s(t, s, peak, phase) * s.step_s
        arrived += new
        chunks.append([t, new])
        can = true_thr(truth, config, s.batch_size) * s.step_s * float(np.exp(rng.normal(0, 0.03)))
        left = can
        while chunks and left > 0:
            take = min(left, chunks[0][1])
            chunks[0][1] -= take
            left -= take
            if chunks[0][1] <= 1e-9:
                chunks.popleft()
        done += can - left
        busy = busy and left <= 0
        lag_s = t + s.step_s - chunks[0][0] if chunks else 0.0
        max_lag = max(max_lag, lag_s)
        over_s += s.step_s if lag_s > s.max_lag_s else 0.0
        cpu_s += config.cpu * s.step_s
        driver.observe(t + s.step_s, done)
        if static or t + s.step_s < next_tick:
            continue
        next_tick += s.control_interval_s
        if not busy:  # it kept up: the window measured the arrivals, not the capacity
            driver.open(config, t + s.step_s)
            busy = True
        if pending is not None:
            continue
        view = driver.view(t + s.step_s, config, Progress(done, max(arrived, 1.0)), budget=s.budget,
                           stream=StreamView(arrival_per_s(t, s, peak, phase), arrived - done, lag_s, s.max_lag_s))  # fmt: skip
        decision = driver.decide(view)
        if decision.plan is not None and decision.kind.value == "apply":
            pending, changes = (t + s.rescale_s, decision.plan.config), changes + 1
    hours = s.days * DAY_S
    return {
        "policy": policy, "seed": seed, "cpu_hours": cpu_s / 3600, "over_bound_s": over_s, "over_bound_fraction": over_s / hours,
        "max_lag_s": max_lag, "changes": changes, "peak_per_s": peak, "trained_fraction": done / max(arrived, 1.0),
    }  # fmt: skip


def compare(seeds: list[int], s: StreamSettings = StreamSettings(), config_path: str | None = None) -> dict:
    """``dlrover_rm``'s stream stage against ``static-peak`` over ``seeds``."""
    runs = [simulate_stream(p, seed, s, config_path) for seed in seeds for p in ("static-peak", "dlrover_rm")]
    by = {p: [r for r in runs if r["policy"] == p] for p in ("static-peak", "dlrover_rm")}
    saved = [1 - d["cpu_hours"] / st["cpu_hours"] for st, d in zip(by["static-peak"], by["dlrover_rm"])]
    return {
        "days": s.days, "max_lag_s": s.max_lag_s, "runs": runs,
        "cpu_hours_saved_mean": float(np.mean(saved)), "cpu_hours_saved": saved,
        "over_bound_s": {p: [r["over_bound_s"] for r in rs] for p, rs in by.items()},
    }  # fmt: skip


def print_compare(r: dict) -> None:
    print(f"diurnal stream, {r['days']:g} days, lag bound {r['max_lag_s']:g}s")
    print(f"{'policy':<12}{'seed':>5}{'CPU-h':>10}{'over bound':>12}{'max lag':>10}{'changes':>9}")
    for x in r["runs"]:
        print(f"{x['policy']:<12}{x['seed']:>5}{x['cpu_hours']:>10,.0f}{x['over_bound_s']:>11,.0f}s{x['max_lag_s']:>9,.0f}s{x['changes']:>9}")
    saved = ", ".join(f"{v:.0%}" for v in r["cpu_hours_saved"])
    print(f"CPU-hours saved by the stream stage: {r['cpu_hours_saved_mean']:.0%} on average ({saved})")
