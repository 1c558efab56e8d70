"""dlrover_rm's stream stage without Ray: the least CPU that keeps a followed stream's lag
under its bound, scaling out only when behind and in only with a margin; and the diurnal
simulation against a static allocation sized for the peak."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlrover.resource.configs import Budget, Config
from dlrover.resource.dlrover_rm import DLRoverRMPolicy
from dlrover.resource.perf_model import PerfModel, PerfParams
from dlrover.resource.plan import JobView, Measurement, StreamView
from dlrover.resource.policy_config import DLRoverRMKnobs
from dlrover.resource.stream_sizing import stream_need
from dlrover.sim.stream import StreamSettings, compare

PRIOR = PerfParams(t0=0.01, t1=6e-4, t2=0.03, t3=0.004, t4=3e-4)
KNOBS = DLRoverRMKnobs(cooldown_s=0.0, worker_cpu_choices=[2.0], ps_cpu_choices=[2.0], max_workers=16, max_ps=8)
CUR = Config(4, 2, 2.0, 2.0, 4096, 8192)


def view(stream: StreamView, measured: float, config: Config = CUR) -> JobView:
    model = PerfModel(512, prior=PRIOR)
    window = Measurement(config, measured, 600.0, 1000.0)
    return JobView(
        now_s=1000.0, config=config, budget=Budget(cpu=64, memory_mb=10**6, max_workers=16, max_ps=8), batch_size=512, signature="s",
        model=model, current=window, last_change_s=0.0, stream=stream,
    )  # fmt: skip


def predicted(c: Config) -> float:
    return PerfModel(512, prior=PRIOR).predict(c)


def test_what_a_stream_needs_is_its_arrivals_with_headroom_and_its_backlog_drained_within_the_bound():
    s = StreamView(arrival_per_s=10_000, lag_rows=300_000, lag_s=100, max_lag_s=400)
    assert stream_need(s, headroom=0.2) == pytest.approx(12_000 + 300_000 / 300)
    late = StreamView(arrival_per_s=10_000, lag_rows=300_000, lag_s=390, max_lag_s=400)
    assert stream_need(late, headroom=0.2) == pytest.approx(12_000 + 300_000 / 40)  # at least a tenth of the bound


def test_falling_behind_it_scales_out_to_the_cheapest_configuration_predicted_to_keep_up():
    thr = predicted(CUR)
    s = StreamView(arrival_per_s=1.5 * thr, lag_rows=0.5 * thr * 60, lag_s=60, max_lag_s=600)
    plan = DLRoverRMPolicy(KNOBS).decide(view(s, measured=thr))
    assert plan is not None and plan.stage == "stream" and plan.config.cpu > CUR.cpu
    need = stream_need(s, KNOBS.stream_headroom)
    assert predicted(plan.config) >= need
    smaller = [Config(w, p, 2.0, 2.0) for w in range(1, 17) for p in range(1, 9) if (w + p) * 2.0 < plan.config.cpu]
    assert all(predicted(c) < need for c in smaller)  # none cheaper would do
    assert "behind" in plan.reason and "need" in plan.reason


def test_keeping_up_it_never_scales_out_and_scales_in_only_with_a_margin():
    thr = predicted(CUR)
    busy = StreamView(arrival_per_s=0.95 * thr, lag_rows=100, lag_s=1, max_lag_s=600)
    assert DLRoverRMPolicy(KNOBS).decide(view(busy, measured=0.95 * thr)) is None  # measures the arrivals, not a shortfall
    quiet = StreamView(arrival_per_s=0.2 * thr, lag_rows=10, lag_s=1, max_lag_s=600)
    plan = DLRoverRMPolicy(KNOBS).decide(view(quiet, measured=0.2 * thr))
    assert plan is not None and plan.config.cpu < CUR.cpu and "frees" in plan.reason
    assert predicted(plan.config) >= stream_need(quiet, KNOBS.stream_headroom) * (1 + KNOBS.stream_scale_in_margin)


def test_the_stream_stage_saves_cpu_hours_against_a_static_allocation_for_the_peak_within_the_lag_bound():
    r = compare([0, 1], StreamSettings(days=1.0))
    assert all(v > 0.15 for v in r["cpu_hours_saved"]), r["cpu_hours_saved"]
    assert r["over_bound_s"]["dlrover_rm"] == [0.0, 0.0] and r["over_bound_s"]["static-peak"] == [0.0, 0.0]
    assert all(x["trained_fraction"] > 0.99 for x in r["runs"])


def test_simulate_diurnal_prints_five_seeds_as_json():
    proc = subprocess.run([sys.executable, "-m", "dlrover", "simulate", "--trace", "diurnal", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert sorted({x["seed"] for x in r["runs"]}) == [0, 1, 2, 3, 4] and r["cpu_hours_saved_mean"] > 0.15
