"""Metrics, dashboards and ``dlrover status`` against the real thing.

The module fixture runs what ``dlrover dashboards check`` runs: a Ray head on loopback, a
real Prometheus (Debian ``prometheus``) configured from ``dashboards/prometheus.yml``, and
``jobs/observe.yaml`` (a scale-out and a worker kill) submitted through Ray Jobs. The tests
then read Prometheus, the Grafana dashboard's queries, the Ray dashboard's state API and
``dlrover status`` while that head is still up. The pure parts (metric publishing, log
line parsing, dashboard consistency) are tested without Ray.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import sleepy
from dlrover.driver.dashboards import (
    CHECK_JOB,
    DASHBOARD,
    check_dashboard,
    dashboard_queries,
    load_dashboard,
    metric_names,
    observed_job,
    prometheus_config,
    render,
    variable_query,
)
from dlrover.faults.records import Failure, FailureKind
from dlrover.runlogs.event_file import describe_event
from dlrover.runlogs.records import Event
from dlrover.runlogs.scale_record import ScaleEvent, ScaleKind
from dlrover.metrics.telemetry import METRICS, Telemetry
from dlrover.runlogs.driver_log import event_line, parse_log, progress_line, result_line

from summaries import CONFIG, a_summary

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def dlrover(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "dlrover", *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


# -- pure parts -----------------------------------------------------------------------------
class FakeSink:
    """Records what Ray's Gauge.set / Counter.inc would receive."""

    values: dict = {}

    def __init__(self, m):
        self.m = m

    def set(self, value, tags):
        assert self.m.kind == "gauge" and set(tags) == set(self.m.tags), (self.m.name, tags)
        FakeSink.values[(self.m.name, tuple(sorted(tags.items())))] = value

    def inc(self, value, tags):
        assert self.m.kind == "counter" and set(tags) == set(self.m.tags) and value > 0, (self.m.name, tags, value)
        key = (self.m.name, tuple(sorted(tags.items())))
        FakeSink.values[key] = FakeSink.values.get(key, 0.0) + value


def _snapshot(actors, scale_events=(), failures=()):
    return {
        "samples_per_s": 1200.0, "progress": 0.5, "ettr": 0.9, "predicted": 1500.0, "measured": None,
        "checkpoint_age_s": {"memory": 3.0}, "actors": actors, "scale_events": list(scale_events), "failures": list(failures),
    }


def test_telemetry_sets_tagged_gauges_and_counts_each_event_once():
    FakeSink.values = {}
    t = Telemetry("job-a", sink=FakeSink)
    w0 = {"name": "job-a/worker-0", "role": "worker", "cpus": 1.0, "memory_limit_mb": 2048, "rss_mb": 900.0, "cpu_util": 0.8, "step_time_s": 0.05, "pull_s": 0.01, "push_s": 0.002}
    ps0 = {"name": "job-a/ps-0", "role": "ps", "cpus": 2.0, "memory_limit_mb": 1024, "rss_mb": 300.0, "cpu_util": 0.4}
    fail = Failure(FailureKind.WORKER_DEATH, "job-a/worker-0", at_s=10.0, detected_s=10.5)
    out = ScaleEvent(ScaleKind.SCALE_OUT, 5.0, "model", "more", CONFIG, dataclasses.replace(CONFIG, workers=3))
    t.publish(_snapshot([w0, ps0], [out], [fail]))
    v = FakeSink.values
    assert v[("dlrover_throughput_samples_per_s", (("job_id", "job-a"),))] == 1200.0
    assert v[("dlrover_actors", (("job_id", "job-a"), ("role", "worker")))] == 1
    assert v[("dlrover_actor_memory_mb", (("actor", "worker-0"), ("job_id", "job-a"), ("role", "worker")))] == 900.0
    assert v[("dlrover_pull_latency_s", (("actor", "worker-0"), ("job_id", "job-a")))] == 0.01
    assert ("dlrover_measured_throughput_samples_per_s", (("job_id", "job-a"),)) not in v  # None: not set
    assert v[("dlrover_failures", (("cause_class", "system"), ("job_id", "job-a"), ("kind", "worker_death")))] == 1
    assert not any(k[0] == "dlrover_recovery_time_s" for k in v)  # not recovered yet
    # Next snapshot: the same events plus one more; worker-0 gone, its replacement trains.
    w1 = dict(w0, name="job-a/worker-1")
    recovered = dataclasses.replace(fail, recovered_s=16.0)
    t.publish(_snapshot([w1, ps0], [out, out], [recovered]))
    assert v[("dlrover_scale_events", (("job_id", "job-a"), ("kind", "scale_out")))] == 2  # counted once each
    assert v[("dlrover_failures", (("cause_class", "system"), ("job_id", "job-a"), ("kind", "worker_death")))] == 1
    assert v[("dlrover_recovery_time_s", (("job_id", "job-a"), ("kind", "worker_death")))] == pytest.approx(6.0)
    assert v[("dlrover_actor_memory_mb", (("actor", "worker-0"), ("job_id", "job-a"), ("role", "worker")))] == 0.0  # gone
    assert v[("dlrover_actor_memory_mb", (("actor", "worker-1"), ("job_id", "job-a"), ("role", "worker")))] == 900.0


def test_dashboard_queries_only_declared_metrics_and_shows_every_one():
    dash = load_dashboard()
    declared = {m.prometheus_name for m in METRICS}
    used = set().union(*(metric_names(q.expr) for q in dashboard_queries(dash)))
    assert used <= declared, used - declared
    assert declared <= used, f"metrics on no panel: {declared - used}"
    for q in dashboard_queries(dash):
        assert 'job_id=~"$job_id"' in q.expr, q  # every query follows the job variable
    assert variable_query(dash).startswith("label_values(ray_dlrover_")
    readme = (ROOT / "dashboards" / "README.md").read_text()
    assert all(m.prometheus_name in readme for m in METRICS)  # documented names
    cfg = prometheus_config(Path("/x/sd.json"))
    assert cfg["scrape_configs"][0]["file_sd_configs"][0]["files"] == ["/x/sd.json"]


def test_log_lines_round_trip_through_status_parsing():
    p = {"progress": 0.412, "samples_done": 41_200, "samples_expected": 100_000, "samples_per_s": 12345.6, "loss": 0.4567, "auc": None,
         "ettr": 0.93, "status": "training", "config": "3w x 1cpu + 2ps x 1.5cpu"}
    ev = Event(12.3, "scale", {"scale_kind": "scale_out", "summary": "+1 worker", "duration_s": 2.0, "reason": "model says so"})
    summary = a_summary(status="succeeded", auc=0.77, throughput_samples_per_s=4000.0, samples_trained=10, samples_expected=10, samples_lost=0,
                        ettr=1.0, wall_time_s=9.5, final_config={"workers": 3, "worker_cpu": 1.0, "ps": 2, "ps_cpu": 1.5})
    text = "\n".join(["noise", progress_line("j-1", p), event_line("j-1", ev), progress_line("other", dict(p, status="x")), result_line("j-1", summary)])
    log = parse_log(text, "j-1")
    assert log.progress == {"progress": "41.2%", "samples": "41,200/100,000", "throughput": "12,346/s", "loss": "0.4567", "auc": "-",
                            "ettr": "0.930", "status": "training", "config": "3w x 1cpu + 2ps x 1.5cpu"}
    assert log.events == ["event t=12.3s scale: scale_out +1 worker in 2.0s (model says so)".split(" ", 1)[1]]
    assert log.result["config"] == "3w x 1cpu + 2ps x 1.5cpu" and log.result["auc"] == "0.7700"
    # an event kind without a template still reads as its fields
    assert describe_event(Event(1.0, "worker_unneeded", {"actor": "w-3"})) == "worker_unneeded: actor=w-3"


def test_status_of_unreachable_address_is_one_line_error():
    proc = dlrover("status", "--address", "http://127.0.0.1:9", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")], proc.stderr[-1000:]


def test_a_server_that_exits_or_never_gets_ready_is_a_one_line_error(tmp_path, monkeypatch):
    from dlrover.errors import DLRoverError
    from dlrover.driver.localhead import wait_until

    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(DLRoverError, match="^server exited with code 3$"):
        wait_until(lambda: False, proc, 30, lambda why: f"server {why}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(DLRoverError, match="was not ready after 1s"):
            wait_until(lambda: 1 / 0, sleeper, 1, lambda why: f"server {why}")
    finally:
        sleeper.kill()
        sleeper.wait()
    if shutil.which("prometheus"):  # a config Prometheus rejects: its own reason, nothing left behind
        from dlrover.driver.dashboards import Prometheus

        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its own directory: another test's Prometheus may run meanwhile
        # The message ends with Prometheus's own reason (its start may be cut: the paths are long).
        with pytest.raises(DLRoverError, match=r"^prometheus exited with code \d+: .*cannot unmarshal !!str `not a list`"):
            with Prometheus({"scrape_configs": [{"job_name": "x", "static_configs": "not a list"}]}):
                pass
        assert not list(tmp_path.glob("dlrover-prometheus-*"))


# -- against a live head --------------------------------------------------------------------
@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (scripts/install.sh installs the Debian package as root)")
    from dlrover.spec import JobSpec

    runs = tmp_path_factory.mktemp("runs")
    # The check's own job, 2 epochs of its 5 with both workers sleeping twice their step
    # time (sleepy): as long as 6 epochs, so its worker kill at 8 s and its scale-out's
    # worker come long before the end on a quiet machine too (at 2 epochs, one ended first).
    base = JobSpec.from_yaml(CHECK_JOB)
    spec = base.with_overrides({"data.epochs": 2, "chaos": [c.model_dump() for c in base.chaos] + sleepy(3)})
    with observed_job(spec, runs_dir=str(runs), quiet=True) as job:
        assert job.rc == 0, f"check job {job.job_id} failed"
        yield job, runs


def test_every_documented_metric_reaches_prometheus_with_the_job_id(observed):
    job, _ = observed
    for m in METRICS:
        series = job.prom.query_range(f'{m.prometheus_name}{{job_id="{job.job_id}"}}', job.start, job.end)
        assert series, f"{m.prometheus_name}: no data for {job.job_id}"
    kinds = {s["metric"]["kind"] for s in job.prom.query_range(f'ray_dlrover_failures_total{{job_id="{job.job_id}"}}', job.start, job.end)}
    assert "worker_death" in kinds
    actors = job.prom.query_range(f'max by (role) (ray_dlrover_actors{{job_id="{job.job_id}"}})', job.start, job.end)
    peak = {s["metric"]["role"]: max(float(v) for _, v in s["values"]) for s in actors}
    assert peak == {"worker": 3.0, "ps": 2.0}  # the scale-out to 3 workers shows


def test_every_dashboard_query_returns_data(observed):
    job, _ = observed
    rows = check_dashboard(job.prom, load_dashboard(DASHBOARD), job.job_id, job.start, job.end)
    empty = [r["where"] for r in rows if not r["series"]]
    assert not empty, empty
    assert len(rows) == len(dashboard_queries(load_dashboard())) + 1
    # and the job filter works: with another job id the same panel query selects nothing
    first = dashboard_queries(load_dashboard())[0].expr
    assert not job.prom.query_range(render(first, "no-such-job"), job.start, job.end)


def test_status_lists_the_job_with_its_configuration(observed):
    job, runs = observed
    proc = dlrover("status", "--address", job.head.address)
    assert proc.returncode == 0, proc.stderr[-2000:]
    final = json.loads((runs / job.job_id / "summary.json").read_text())["final_config"]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(job.job_id))
    assert "SUCCEEDED" in line and "scripted" in line and "100.0%" in line, line
    assert line.endswith(f"{final['workers']}w x 1cpu + {final['ps']}ps x 1cpu"), line


def test_status_of_one_job_shows_model_throughput_and_last_events(observed):
    job, runs = observed
    proc = dlrover("status", job.job_id, "--address", job.head.address, "--events", "50")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = dict(ln.split(":", 1) for ln in out.splitlines() if ln and not ln.startswith(" ") and ":" in ln)
    assert rows["model"].strip() == "DLRM 26x5000x8 dense 32-8 over 64-32-1"
    assert rows["policy"].strip() == "scripted" and rows["requested"].strip() == "2w x 1cpu + 2ps x 1cpu"
    assert rows["throughput"].strip().endswith("samples/s") and rows["result"].strip().startswith("succeeded: auc 0.")
    assert str(runs) in rows["run directory"]
    events = [ln.strip() for ln in out.splitlines() if ln.startswith("  ")]
    assert any("scale: scale_out" in e for e in events), events
    assert any("failure: worker_death" in e for e in events), events
    assert any("chaos: injected kill" in e for e in events), events
    bad = dlrover("status", "no-such-job", "--address", job.head.address)
    assert bad.returncode == 2 and "no job 'no-such-job'" in bad.stderr


def test_ray_dashboard_names_actors_per_job_and_role_and_shows_metadata(observed):
    job, _ = observed
    from dlrover.driver.submit import auth_headers, client

    # the Ray dashboard's state API (what its Actors page shows), over HTTP
    req = urllib.request.Request(f"{job.head.address}/api/v0/actors?limit=1000", headers=auth_headers())
    with urllib.request.urlopen(req, timeout=60) as r:
        actors = json.loads(r.read())["data"]["result"]["result"]
    names = {a.get("name") for a in actors if a.get("ray_namespace") == "dlrover"}
    roles = defaultdict(int)
    for n in names:
        if n.startswith(job.job_id + "/"):
            roles[n.split("/", 1)[1].split("-")[0]] += 1  # worker-3 -> worker, dense-ps-0-g0 -> dense
    assert roles["master"] == 1 and roles["ps"] == 2 and roles["worker"] >= 3 and roles["dense"] == 1, dict(roles)
    meta = client(job.head.address).get_job_info(job.job_id).metadata
    assert meta["model"].startswith("DLRM ") and meta["policy"] == "scripted" and meta["dlrover_job"] == job.job_id
    logs = client(job.head.address).get_job_logs(job.job_id)
    assert f"[dlrover] {job.job_id} progress " in logs and f"[dlrover] {job.job_id} result progress=100.0% status=succeeded" in logs
