"""Experiment tracking (``dlrover.tracking``): the mapping from what the driver sees to
params, metrics and tagged events, without Ray; then real jobs tracked to a real MLflow
tracking server (``.venv-mlflow``, which ``scripts/install.sh`` makes) on loopback and to
TensorBoard event files, read back through ``MlflowClient`` and TensorBoard's own reader."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover.errors import DLRoverError, SpecError
from dlrover.runlogs.records import Event
from dlrover.tracking import trackers
from dlrover.tracking.mapping import TAGGED_EVENTS, Windows, event_metrics, event_text, flat_params, summary_metrics, window_metrics
from dlrover.tracking.tracker import Tracker

from conftest import sleepy, small_spec
from mlflow_server import free_port, start_mlflow_server, stop_server
from summaries import a_summary

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR", "RAY_IGNORE_UNHANDLED_ERRORS": "1"}


def snapshot(samples_done: int, loss: float | None = 0.5, workers: int = 2, ps: int = 2) -> dict:
    """The fields of ``JobMaster.progress`` a tracker reads."""
    return {"samples_done": samples_done, "samples_per_s": 1000.0, "loss": loss, "workers": workers, "ps": ps}


class RecordingSink:
    """Keeps what a tracker writes; raises from ``fail_on`` on."""

    name = "recording"

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_on = fail_on

    def _call(self, *call) -> None:
        if self.fail_on == call[0]:
            raise ConnectionError("server went away\nsecond line")
        self.calls.append(call)

    def params(self, params):
        self._call("params", dict(params))

    def metrics(self, step, values):
        self._call("metrics", step, dict(values))

    def event(self, step, e, text):
        self._call("event", step, e.kind, text)

    def end(self, summary, run_dir):
        self._call("end", summary.status if summary else None)


# -- the mapping, without Ray -----------------------------------------------------------------
def test_a_spec_is_flattened_to_dotted_params_with_json_values():
    doc = {"name": "j", "data": {"paths": ["a.tsv"], "synth": None, "epochs": 2}, "model": {"tables": {"C1:x": {"kind": "dynamic"}}, "dcn": {}}}
    assert flat_params(doc) == {
        "name": "j", "data.paths": '["a.tsv"]', "data.synth": "null", "data.epochs": "2",
        "model.tables.C1_x.kind": "dynamic", "model.dcn": "{}",
    }  # fmt: skip


def test_a_progress_snapshot_is_a_window_of_loss_throughput_and_configuration():
    assert window_metrics(snapshot(4096, loss=0.25, workers=3, ps=1)) == {"samples_per_s": 1000.0, "workers": 3.0, "ps": 1.0, "loss": 0.25}
    assert "loss" not in window_metrics(snapshot(4096, loss=None))  # before the workers' first report


def test_windows_come_once_per_period_and_only_when_samples_moved_on():
    w = Windows(every_s=2.0)
    assert not w.due(snapshot(0), 0.0)  # nothing trained yet
    assert w.due(snapshot(100), 0.0)
    assert not w.due(snapshot(200), 1.0)  # within the period
    assert not w.due(snapshot(100), 5.0)  # no new samples
    assert w.due(snapshot(300), 5.0)
    assert w.due(snapshot(400, workers=3), 5.5)  # a new configuration does not wait
    assert w.due(snapshot(200, workers=3), 8.0)  # a rollback's fewer samples are a window too


def test_events_carry_metrics_or_become_tagged_events():
    e = Event(12.5, "eval", {"step": 8, "periodic": True, "rows": 400, "auc": 0.71, "logloss": 0.52, "best_auc": 0.78})
    assert event_metrics(e) == {"auc": 0.71, "logloss": 0.52, "best_auc": 0.78}
    assert event_metrics(Event(1.0, "eval", {"rows": 0})) == {}  # one class only: no AUC
    m = Event(3.0, "measurement", {"config": {}, "throughput": 900.0, "predicted": None})
    assert event_metrics(m) == {"measured_samples_per_s": 900.0}
    f = Event(7.25, "failure", {"failure_kind": "worker_death", "actor": "j/worker-1", "cause": "killed", "cause_class": "system"})
    assert event_metrics(f) == {} and event_text(f) == "t=7.2s failure: worker_death j/worker-1: killed [system]"
    s = summary_metrics(a_summary())
    assert s["summary/wall_time_s"] == 40.0 and s["summary/failures"] == 1.0 and s["summary/ettr"] == 0.9


def test_a_tracker_logs_windows_events_and_at_the_end_what_it_never_saw():
    sink = RecordingSink()
    t = Tracker(sink, "j", {"a.b": "1"}, every_s=0.0)
    periodic = Event(5.0, "eval", {"auc": 0.6, "logloss": 0.6})
    failure = Event(6.0, "failure", {"failure_kind": "worker_death", "actor": "j/worker-0"})
    t.progress(snapshot(1000))
    t.event(periodic)  # seen live: logged at the samples trained by then
    t.event(Event(5.5, "launched", {"config": "2w"}))  # neither a metric nor a tagged kind
    t.event(failure)
    t.progress(snapshot(2000, loss=0.4))
    final = Event(9.0, "eval", {"final": True, "auc": 0.7, "logloss": 0.5})
    summary = a_summary(samples_trained=3000, events=[periodic, failure, Event(8.0, "scale", {"scale_kind": "scale_in"}), final])
    t.finished(summary, Path("/nowhere"))
    t.close()
    assert sink.calls[0] == ("params", {"a.b": "1"})
    assert sink.calls[1] == ("metrics", 1000, window_metrics(snapshot(1000)))
    assert sink.calls[2] == ("metrics", 1000, {"auc": 0.6, "logloss": 0.6})
    assert sink.calls[3][:3] == ("event", 1000, "failure")
    assert sink.calls[4] == ("metrics", 2000, window_metrics(snapshot(2000, loss=0.4)))
    assert sink.calls[5][:3] == ("event", 3000, "scale")  # not seen live: at the summary's samples trained
    assert sink.calls[6] == ("metrics", 3000, {"auc": 0.7, "logloss": 0.5})
    assert sink.calls[7] == ("metrics", 3000, summary_metrics(summary))
    assert sink.calls[8:] == [("end", "succeeded")]


def test_a_tracker_that_ended_without_a_summary_tells_its_sink():
    sink = RecordingSink()
    t = Tracker(sink, "j", {}, every_s=0.0)
    t.close()  # the job raised, or was interrupted: no finished()
    assert sink.calls[-1] == ("end", None)


def test_a_failing_sink_is_turned_off_with_one_warning_line_and_never_raises(capfd):
    sink = RecordingSink(fail_on="metrics")
    t = Tracker(sink, "j-1", {"a": "1"}, every_s=0.0)
    for n in range(1, 5):
        t.progress(snapshot(n * 100))
    t.finished(a_summary(), Path("/nowhere"))
    t.close()
    assert sink.calls == [("params", {"a": "1"})]  # nothing after the failure, not even the end
    assert t.failed == "ConnectionError: server went away"
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "tracking" in ln]
    assert lines == ["[dlrover] j-1 tracking: recording: ConnectionError: server went away; tracking off, the job goes on"]


def test_tracking_is_off_by_default_and_a_typo_in_it_is_a_one_line_error(synth_dir):
    spec = small_spec(synth_dir)
    assert spec.tracking.mlflow is None and spec.tracking.tensorboard is None and trackers(spec, "j") == []
    with pytest.raises(SpecError) as e:
        small_spec(synth_dir, tracking={"mlfow": "http://127.0.0.1:5000"})
    assert str(e.value) == "<spec>: tracking.mlfow: unknown field"
    with pytest.raises(SpecError, match=r"^<spec>: tracking.tensorboard: s3://b/tb: expected a local directory"):
        small_spec(synth_dir, tracking={"tensorboard": "s3://b/tb"})


def test_an_unreachable_mlflow_uri_is_an_error_before_anything_is_made(synth_dir, tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = small_spec(synth_dir, tracking={"mlflow": uri, "tensorboard": str(tmp_path / "tb")})
    with pytest.raises(DLRoverError) as e:
        trackers(spec, "j")
    assert str(e.value).startswith(f"tracking.mlflow: {uri}: cannot reach the MLflow server (") and "\n" not in str(e.value)
    assert not (tmp_path / "tb").exists()  # no TensorBoard run begun


def dlrover(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "dlrover", *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "tracking,needle",
    [
        ("{mlflow: http://127.0.0.1:PORT}", "tracking.mlflow: http://127.0.0.1:PORT: cannot reach the MLflow server"),
        ("{mlflow: http://127.0.0.1:PORT, experment: x}", "tracking.experment: unknown field"),
    ],
)
def test_dlrover_run_with_a_bad_tracking_section_is_one_error_line(synth_dir, tmp_path, tracking, needle):
    port = str(free_port())
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"data: {{paths: ['{synth_dir}/*.tsv'], batch_size: 1024, shard_rows: 4096}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        f"tracking: {tracking.replace('PORT', port)}\n"
    )
    proc = dlrover("run", spec, "--runs-dir", tmp_path / "runs")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert needle.replace("PORT", port) in errors[0], errors[0]
    assert not list((tmp_path / "runs").glob("*")), "a run directory written for a job that never started"


# -- real jobs, a real MLflow server ------------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    uri, proc = start_mlflow_server(tmp_path_factory.mktemp("mlflow"))
    yield uri
    stop_server(proc)


class KillsAWorkerAfterTheScale:
    """Kills a worker (``ray.kill``, as a crash would) once the scale event is seen: a
    failure that comes after the rescale, which a pending replacement would hold up."""

    def __init__(self) -> None:
        self.scaled, self.killed = False, None

    def progress(self, p: dict) -> None:
        workers = [a["name"] for a in p["actors"] if a["role"] == "worker"]
        if self.scaled and self.killed is None and workers:
            import ray

            self.killed = workers[0]
            ray.kill(ray.get_actor(self.killed, namespace="dlrover"), no_restart=True)

    def event(self, e: Event) -> None:
        self.scaled = self.scaled or e.kind == "scale"

    def finished(self, summary, run_dir) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tracked_job(ray_local, synth_dir, mlflow_server, tmp_path_factory):
    """A job tracked to both: a live scale-in (2 PS to 1, a scale event), then a worker
    killed (a failure), periodic evaluations; ``(summary, run_dir, tb_dir)``."""
    from dlrover.driver.runner import run_job
    from dlrover.runlogs.report import load_run

    tmp = tmp_path_factory.mktemp("tracked")
    spec = small_spec(
        synth_dir, name="tracked", data__epochs=3, chaos=sleepy(3), data__eval_every_steps=60, train__log_every_s=0.5, checkpoint__memory_interval_s=2.0,
        policy={"name": "scripted", "knobs": {"steps": [{"at_progress": 0.1, "ps": 1}]}, "interval_s": 0.2, "warmup_s": 0.2, "history_dir": str(tmp / "h")},
        tracking={"mlflow": mlflow_server, "tensorboard": str(tmp / "tb"), "experiment": "dlrover-tests"},
    )  # fmt: skip
    killer = KillsAWorkerAfterTheScale()
    _, path = run_job(spec, runs_dir=str(tmp / "runs"), progress="none", observers=[killer])
    summary, events = load_run(path.parent)
    assert summary.status == "succeeded" and killer.killed, (summary.reason, killer.killed)
    return dataclasses.replace(summary, events=events), path.parent, tmp / "tb" / summary.job_id


def mlflow_run(uri: str, job_id: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("dlrover-tests")
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{job_id}'")
    return client, run


def test_a_tracked_jobs_params_metrics_and_events_read_back_from_mlflow(tracked_job, mlflow_server):
    summary, run_dir, _ = tracked_job
    client, run = mlflow_run(mlflow_server, summary.job_id)
    assert run.info.status == "FINISHED" and run.data.tags["dlrover.job_id"] == summary.job_id and run.data.tags["dlrover.status"] == "succeeded"
    assert run.data.params == flat_params(json.loads((run_dir / "spec.json").read_text()))  # the resolved spec, every field
    assert run.data.params["data.epochs"] == "3" and run.data.params["policy.name"] == "scripted"

    loss = client.get_metric_history(run.info.run_id, "loss")
    steps = [m.step for m in loss]
    assert len(loss) >= 2 and steps == sorted(steps) and 0 < steps[0] and steps[-1] <= summary.samples_trained, steps
    assert all(math.isfinite(m.value) and m.value > 0 for m in loss)
    ps = {m.value for m in client.get_metric_history(run.info.run_id, "ps")}
    assert {1.0, 2.0} <= ps, ps  # before and after the scale-in
    evals = [e for e in summary.events if e.kind == "eval"]
    auc = client.get_metric_history(run.info.run_id, "auc")
    assert len(evals) >= 2 and [m.value for m in auc] == pytest.approx([e.fields["auc"] for e in evals])
    assert auc[-1].step == summary.samples_trained and auc[-1].value == pytest.approx(summary.auc)
    logloss = client.get_metric_history(run.info.run_id, "logloss")
    assert logloss[-1].value == pytest.approx(summary.logloss)
    assert run.data.metrics["summary/wall_time_s"] == pytest.approx(summary.wall_time_s)

    tagged = {k: v for k, v in run.data.tags.items() if k.startswith("event.")}
    assert len(tagged) == sum(e.kind in TAGGED_EVENTS for e in summary.events), tagged  # each once
    for kind in ("initial_config", "scale", "failure"):
        n = sum(e.kind == kind for e in summary.events)
        assert n >= 1 and sum(k.endswith(f".{kind}") for k in tagged) == n, (kind, tagged)
    failure = next(v for k, v in tagged.items() if k.endswith(".failure"))
    assert failure.startswith("samples=") and "worker_death" in failure, failure

    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "events.jsonl", "spec.json"} <= files, files
    local = client.download_artifacts(run.info.run_id, "summary.json", str(run_dir.parent / "downloaded"))
    assert json.loads(Path(local).read_text()) == json.loads((run_dir / "summary.json").read_text())


def test_a_tracked_jobs_tensorboard_scalars_and_events_read_back(tracked_job, mlflow_server):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary, _, tb_dir = tracked_job
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    client, run = mlflow_run(mlflow_server, summary.job_id)
    for name in ("loss", "samples_per_s", "workers", "ps", "auc", "logloss"):
        tb = [(s.step, s.value) for s in acc.Scalars(name)]
        ml = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
        assert tb and [s for s, _ in tb] == [s for s, _ in ml] and [v for _, v in tb] == pytest.approx([v for _, v in ml], rel=1e-6), name
    tensors = acc.Tags()["tensors"]
    assert {"params/text_summary", "events/failure/text_summary", "events/scale/text_summary", "status/text_summary"} <= set(tensors), tensors
    (status,) = acc.Tensors("status/text_summary")
    assert status.step == summary.samples_trained and status.tensor_proto.string_val == [b"succeeded"]
    failures = acc.Tensors("events/failure/text_summary")
    assert len(failures) == sum(e.kind == "failure" for e in summary.events) and b"worker_death" in failures[0].tensor_proto.string_val[0]


def test_the_report_and_the_exported_model_are_uploaded_when_the_run_has_them(tracked_job, mlflow_server, tmp_path):
    """``dlrover report`` and ``dlrover export`` into the run directory, then a tracker's
    end: the page and the model directory are artifacts too."""
    import shutil

    from dlrover.runlogs.report import write_report
    from dlrover.serving.export import export_run
    from dlrover.tracking.mlflow_tracker import MlflowSink

    summary, run_dir, _ = tracked_job
    copy = tmp_path / summary.job_id
    shutil.copytree(run_dir, copy)
    write_report(copy)
    export_run(copy, copy / "model")
    sink = MlflowSink(mlflow_server, "dlrover-tests", "with-report")
    t = Tracker(sink, "with-report", {}, every_s=1.0)
    t.finished(summary, copy)
    t.close()
    assert t.failed is None
    client, run = mlflow_run(mlflow_server, "with-report")
    assert {"report.html", "summary.json", "model"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    model = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {f"model/{p.name}" for p in (copy / "model").iterdir()} == model and "model/model.json" in model


def test_a_tracking_server_that_dies_mid_run_costs_one_warning_and_not_the_job(ray_local, synth_dir, tmp_path, capfd):
    from dlrover.driver.runner import run_job

    uri, proc = start_mlflow_server(tmp_path / "mlflow")

    class KillsTheServer:
        """Kills the server (SIGKILL: it crashes) once training has begun."""

        def progress(self, p: dict) -> None:
            if p["samples_done"] > 0:
                stop_server(proc, signal.SIGKILL)

        def event(self, e: Event) -> None:
            pass

        def finished(self, summary, run_dir) -> None:
            pass

        def close(self) -> None:
            pass

    try:
        spec = small_spec(synth_dir, name="orphan", data__epochs=2, train__log_every_s=0.5, tracking={"mlflow": uri})
        doc, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", observers=[KillsTheServer()])
    finally:
        stop_server(proc)
    assert doc["status"] == "succeeded"
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "tracking" in ln]
    assert len(lines) == 1 and lines[0].startswith("[dlrover] orphan-") and lines[0].endswith("; tracking off, the job goes on"), lines
