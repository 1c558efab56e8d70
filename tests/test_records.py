"""The worker's report and the PS's stats are typed records
(``dlrover.worker.window.WorkerReport``, ``dlrover.ps.ps_stats.PsStats``): the report's JSON
form is the ``metrics`` row of ``events.jsonl``, and no code outside a record's module
reads its fields back by string key."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import psutil
import pytest

from dlrover.errors import DataError
from dlrover.master.events import EventLog
from dlrover.ps.dynamic_tables import DynamicCounts
from dlrover.ps.ps_stats import PsStats
from dlrover.runlogs.records import Event, JobSummary, read_summary
from dlrover.worker.window import MetricsWindow, WorkerReport

from summaries import a_summary

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlrover"
RECORD_MODULE = "dlrover/worker/window.py"

# The report's keys (today's events.jsonl ``metrics`` row, less the event's own kind and actor).
KEYS = [
    "samples", "steps", "samples_per_s", "loss", "step_time_s", "wait_ps_s", "pull_s", "push_s", "queue_depth",
    "rss_mb", "cpu_percent", "node_id", "step_median_s", "pull_ahead",
]  # fmt: skip

# Field names no other dict in the package has as a key: read by string anywhere but the
# record's module, they can only be a report read the old way. Left out, because other
# dicts legitimately have those keys:
#   samples_per_s, loss, step_time_s, pull_s  - the progress snapshot (master.progress and
#       its per-actor rows, read by telemetry, the driver's progress lines and status);
#   push_s                                    - the snapshot's actor rows and the PS
#       client's timings (dlrover.model.dlrm);
#   rss_mb, node_id                           - the PS's stats, the worker's exit stats,
#       events (ps_metrics, oom_kill), ProcessInfo replies;
#   samples, steps, at_s                      - checkpoints, history records, events.
FORBIDDEN = ("wait_ps_s", "queue_depth", "cpu_percent", "step_median_s", "pull_ahead")

# (file, function, key) reads that are not of a report (none now: the PS's stats are a
# record too, with its own ``cpu_percent``).
ALLOWED: set[tuple[str, str, str]] = set()


def a_report(**changes) -> WorkerReport:
    r = WorkerReport(
        samples=4096, steps=8, samples_per_s=2048.5, loss=0.4375, step_time_s=0.25, wait_ps_s=0.03125, pull_s=0.0625,
        push_s=0.015625, queue_depth=3, rss_mb=812.5, cpu_percent=187.5, node_id="ab12", step_median_s=0.2, pull_ahead=2,
    )  # fmt: skip
    return dataclasses.replace(r, **changes)


def test_report_round_trips_through_its_json() -> None:
    r = a_report()
    assert list(r.to_json()) == KEYS  # at_s only once the master has set it
    assert WorkerReport.from_json(r.to_json()) == r
    stamped = dataclasses.replace(r, at_s=12.75)
    assert list(stamped.to_json()) == [*KEYS, "at_s"]
    assert WorkerReport.from_json(json.loads(json.dumps(stamped.to_json()))) == stamped


def test_report_is_frozen_and_every_figure_is_required() -> None:
    r = a_report()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.rss_mb = 0.0  # type: ignore[misc]
    row = r.to_json()
    del row["rss_mb"]
    with pytest.raises(KeyError):
        WorkerReport.from_json(row)


def test_metrics_row_of_the_event_log_keeps_its_shape() -> None:
    """The master's ``metrics`` event: the log's at_s (overridden by the report's, in first
    place), kind, actor, then the report's keys; it reads back as the record."""
    log = EventLog(clock=lambda: 13.0)
    r = a_report(at_s=12.75)
    row = log.add("metrics", actor="j/worker-0", **r.to_json()).to_json()
    assert list(row) == ["at_s", "kind", "actor", *KEYS] and row["at_s"] == 12.75
    assert WorkerReport.from_json(json.loads(json.dumps(row))) == r


def test_a_window_makes_the_record() -> None:
    timings = {"issue_pull_s": 1.0, "wait_pull_s": 2.0, "push_s": 3.0}
    w = MetricsWindow(timings, now=100.0)
    w.add(512, 512 * 0.5)
    w.add(512, 512 * 0.25)
    w.step_s = 0.5
    later = {"issue_pull_s": 1.1, "wait_pull_s": 2.2, "push_s": 3.4}
    r = w.metrics(102.0, later, queue_depth=4, proc=psutil.Process(), node_id="n1", step_median_s=0.24, pull_ahead=1)
    assert (r.samples, r.steps, r.queue_depth, r.node_id, r.pull_ahead, r.at_s) == (1024, 2, 4, "n1", 1, None)
    assert r.samples_per_s == pytest.approx(512.0) and r.loss == pytest.approx(0.375) and r.step_time_s == pytest.approx(0.25)
    assert r.wait_ps_s == pytest.approx(0.1) and r.pull_s == pytest.approx(0.15) and r.push_s == pytest.approx(0.2)
    assert r.rss_mb > 0 and isinstance(r.cpu_percent, float)


def string_key_reads(tree: ast.AST, keys: set[str]) -> list[tuple[int, str, str]]:
    """``(line, enclosing function, key)`` of each ``x["key"]`` read, ``x.get("key")`` and
    ``"key" in x`` with ``key`` in ``keys``."""
    out: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            if isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            key = node.left.value
        if isinstance(key, str) and key in keys:
            out.append((node.lineno, func, key))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "")
    return out


def test_the_key_scan_finds_each_kind_of_read() -> None:
    source = 'def f(r, s):\n    a = r["wait_ps_s"]\n    b = r.get("queue_depth", 0)\n    c = "pull_ahead" in r\n    s["wait_ps_s"] = 1\n    return r.wait_ps_s\n'
    assert string_key_reads(ast.parse(source), set(FORBIDDEN)) == [(2, "f", "wait_ps_s"), (3, "f", "queue_depth"), (4, "f", "pull_ahead")]


def test_forbidden_keys_are_fields_of_the_report() -> None:
    names = {f.name for f in dataclasses.fields(WorkerReport)}
    assert set(FORBIDDEN) <= names and set(KEYS) | {"at_s"} == names


def test_no_string_key_reads_of_the_report_outside_its_module() -> None:
    bad, allowed_seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == RECORD_MODULE:
            continue
        for line, func, key in string_key_reads(ast.parse(path.read_text()), set(FORBIDDEN)):
            if (rel, func, key) in ALLOWED:
                allowed_seen.add((rel, func, key))
            else:
                bad.append(f"{rel}:{line} ({func or 'module'}) reads {key!r} by string: use WorkerReport's attribute")
    assert not bad, "\n".join(bad)
    assert allowed_seen == ALLOWED, f"exceptions that match nothing any more (take them off): {ALLOWED - allowed_seen}"


PS_STATS_MODULE = "dlrover/ps/ps_stats.py"
# PsStats fields no other dict of the package has as a key (``duplicates``, ``rss_mb``,
# ``node_id``, ``pid`` and ``ids`` are keys of the dense PS's stats, events or id maps too).
PS_FORBIDDEN = ("pulls", "pushes", "rows_updated", "ids_updated", "busy_s", "uptime_s", "dynamic_ids", "applied_log", "pending")


def test_ps_stats_round_trip_through_their_json() -> None:
    s = PsStats(pulls=3, pushes=2, ids=40, rows_updated=7, ids_updated=30, busy_s=0.5, dynamic=DynamicCounts(lookups=9, hits=4), pid=12, node_id="n1")
    assert PsStats.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert set(PS_FORBIDDEN) <= {f.name for f in dataclasses.fields(PsStats)}


def test_no_string_key_reads_of_ps_stats_outside_their_module() -> None:
    bad = [
        f"{path.relative_to(ROOT).as_posix()}:{line} ({func or 'module'}) reads {key!r} by string: use PsStats' attribute"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(ROOT).as_posix() != PS_STATS_MODULE
        for line, func, key in string_key_reads(ast.parse(path.read_text()), set(PS_FORBIDDEN))
    ]
    assert not bad, "\n".join(bad)


# The run's files: ``events.jsonl`` rows are ``Event`` records, ``summary.json`` a
# ``JobSummary`` (``dlrover.runlogs.records``). Keys only a summary has; and an event's
# header (``kind``, ``at_s``), which the records of faults, scale events, reports and the
# history read in their own modules, and a few other documents have too (listed below).
RUN_RECORD_MODULES = {
    "dlrover/runlogs/records.py", "dlrover/runlogs/scale_record.py", "dlrover/faults/records.py", "dlrover/worker/window.py",
    "dlrover/resource/history.py",
}  # fmt: skip
SUMMARY_KEYS = {
    "samples_trained", "samples_lost", "bad_lines_skipped", "ids_expected", "long_bags_truncated", "eval_rows",
    "throughput_samples_per_s", "train_time_s", "wall_time_s", "ps_bags_updated", "ps_ids_updated", "dynamic_tables",
    "dense_updates_per_shard", "dense_updates", "dense_rounds", "duplicate_updates_skipped", "initial_plan", "configurations",
    "final_config", "history_record", "reliability", "samples_replayed", "updates_lost", "oom_kills", "bad_nodes",
    "node_speeds_probed", "checkpoints",
}  # fmt: skip
EVENT_KEYS = {"kind", "at_s"}
# (file, function, key) reads of documents that are neither an event nor a summary, and
# the one reader that must take summaries of any version apart field by field.
RUN_ALLOWED: set[tuple[str, str, str]] = {
    ("dlrover/master/checkpoint.py", "load_durable", "at_s"),  # a durable checkpoint's manifest
    ("dlrover/sim/report.py", "metrics", "oom_kills"),  # the simulator's per-job table
    ("dlrover/sim/report.py", "table", "oom_kills"),
    # Profiles are built from run directories of older versions too (no ids_per_sample, a
    # partial summary): the reader checks each field it needs and names the one missing.
    ("dlrover/sim/profile.py", "_run_points", "configurations"),
    ("dlrover/bench/checkpoint.py", "written", "kind"),  # a durable checkpoint's manifest: its meta's link
    ("dlrover/bench/perf_model.py", "run_perf_model_bench", "at_s"),  # a measured window (a summary's configurations row)
    # A bench's own result (what its --json prints), read back by its printer.
    ("dlrover/bench/bigtable.py", "print_bigtable", "ps_bags_updated"),
    ("dlrover/bench/bigtable.py", "print_bigtable", "kind"),
    ("dlrover/bench/bigtable.py", "print_bigtable", "checkpoints"),
    ("dlrover/bench/bigtable.py", "print_bigtable", "at_s"),
    ("dlrover/bench/checkpoint.py", "print_checkpoint", "kind"),
    ("dlrover/bench/recovery.py", "print_recovery", "at_s"),
    ("dlrover/bench/recovery.py", "print_recovery", "samples_replayed"),
    ("dlrover/bench/recovery.py", "print_recovery", "updates_lost"),
    ("dlrover/bench/recovery.py", "print_recovery", "wall_time_s"),
    ("dlrover/bench/recovery.py", "print_recovery", "samples_trained"),
    ("dlrover/bench/recovery.py", "print_recovery", "train_time_s"),
    ("dlrover/bench/slow_link.py", "print_slow_link", "at_s"),
    ("dlrover/bench/slow_ps.py", "print_slow_ps", "samples_lost"),
}


def test_an_event_round_trips_through_its_row() -> None:
    row = {"at_s": 3.5, "kind": "failure", "failure_kind": "worker_death", "actor": "j/worker-1"}
    e = Event.from_json(json.loads(json.dumps(row)))
    assert (e.at_s, e.kind, e.actor, e.job_s) == (3.5, "failure", "j/worker-1", 3.5)
    assert list(e.to_json().items()) == list(row.items())
    assert Event(0.5, "chaos", {"job_s": 9.5, "action": "kill"}).job_s == 9.5  # fired at 9.5 s of the job


def test_the_event_log_makes_records_whose_rows_keep_their_shape() -> None:
    log = EventLog(clock=lambda: 13.0)
    e = log.add("scale_begin", reason="r", ops=["launch"])
    assert e == Event(13.0, "scale_begin", {"reason": "r", "ops": ["launch"]}) and log.rows() == [e]
    stamped = log.add("failure", at_s=11.5, actor="j/ps-0")  # a failure's own time stands for the log's
    assert stamped.to_json() == {"at_s": 11.5, "kind": "failure", "actor": "j/ps-0"}


def test_a_summary_round_trips_through_its_json_in_the_files_order() -> None:
    s = a_summary()
    doc = json.loads(json.dumps(s.to_json(), default=float))
    assert list(doc)[:3] == ["job_id", "status", "samples_expected"] and list(doc)[-1] == "checkpoints"
    assert "events" not in doc and "reason" not in doc and "dense_updates" not in doc  # unset optional fields are left out
    assert JobSummary.from_json(doc) == dataclasses.replace(s, events=[])
    failed = dataclasses.replace(s, reason="2 failures (checkpoint.max_failures: 1)", dense_updates=4, dense_updates_per_shard=[4, 5])
    doc = failed.to_json()
    assert list(doc).index("reason") == list(doc).index("failures") + 1 and JobSummary.from_json(doc) == dataclasses.replace(failed, events=[])


def test_a_summary_missing_a_field_is_one_line_naming_it(tmp_path) -> None:
    doc = a_summary().to_json()
    del doc["samples_trained"], doc["wall_time_s"]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError) as e:
        read_summary(path)
    assert str(e.value) == f"{path}: missing fields samples_trained, wall_time_s"
    path.write_text(json.dumps({**a_summary().to_json(), "config": {"workers": 2}}))
    with pytest.raises(DataError, match=r"summary.json: malformed: TypeError: .*missing"):
        read_summary(path)


def test_summary_keys_are_fields_of_the_summary() -> None:
    assert SUMMARY_KEYS <= {f.name for f in dataclasses.fields(JobSummary)}


def test_no_string_key_reads_of_an_event_or_a_summary_outside_their_records() -> None:
    bad, allowed_seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in RUN_RECORD_MODULES:
            continue
        for line, func, key in string_key_reads(ast.parse(path.read_text()), SUMMARY_KEYS | EVENT_KEYS):
            if (rel, func, key) in RUN_ALLOWED:
                allowed_seen.add((rel, func, key))
            else:
                what = "JobSummary" if key in SUMMARY_KEYS else "Event (or the record the document has)"
                bad.append(f"{rel}:{line} ({func or 'module'}) reads {key!r} by string: use {what}'s attribute")
    assert not bad, "\n".join(bad)
    assert allowed_seen == RUN_ALLOWED, f"exceptions that match nothing any more (take them off): {RUN_ALLOWED - allowed_seen}"
