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

from dlrover.master.events import EventLog
from dlrover.ps.dynamic_tables import DynamicCounts
from dlrover.ps.ps_stats import PsStats
from dlrover.worker.window import MetricsWindow, WorkerReport

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
    row = log.add("metrics", actor="j/worker-0", **r.to_json())
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
