"""Reading and wording a run's event log (``events.jsonl``).

The master keeps the log (``dlrover.master.events.EventLog``) and the driver writes it;
the report, the simulator's profiles and the driver's log lines read it. This module sits
outside ``dlrover.master`` so that those readers do not depend on the live master.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from dlrover.errors import DataError
from dlrover.runlogs.records import Event


def read_events(path: str | Path) -> Iterator[tuple[int, Event]]:
    """``(line number, event)`` of a run's ``events.jsonl`` (nothing if the file is absent);
    a line that is not an event's JSON object is a one-line DataError naming ``file:line``."""
    path = Path(path)
    if not path.is_file():
        return
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise DataError(f"{path}:{n}: not a JSON object") from None
            if not Event.is_row(row):
                continue  # not an event: a line another tool added
            try:
                event = Event.from_json(row)
            except (KeyError, TypeError, ValueError):
                raise DataError(f"{path}:{n}: an event needs a numeric at_s and a kind") from None
            yield n, event


def config_text(c: Any) -> str:
    """A config dict of the event log as ``2w x 1cpu + 2ps x 1cpu``."""
    if not isinstance(c, dict):
        return str(c)
    return f"{c['workers']}w x {c['worker_cpu']:g}cpu + {c['ps']}ps x {c['ps_cpu']:g}cpu"


def _num(x: Any, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


# What one line says about each notable kind; others list their scalar fields.
_DESCRIBE: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "initial_config": lambda e: f"initial configuration {config_text(e['config'])} ({e.get('reason')})",
    "launched": lambda e: f"launched {e['config']}",
    "scale": lambda e: f"{e.get('scale_kind', 'scale')} {e.get('summary', '')} in {_num(e.get('duration_s'), '.1f')}s ({e.get('reason')})",
    "scale_failed": lambda e: f"scale failed: {e.get('error')} ({e.get('reason')})",
    "plan_rejected": lambda e: f"plan rejected ({e.get('why')}): {config_text(e.get('config'))}",
    "failure": lambda e: f"{e.get('failure_kind')} {e.get('actor')}: {e.get('cause')} [{e.get('cause_class')}]",
    "recovered": lambda e: f"recovered from {e.get('failure_kind')} of {e.get('actor')} after {_num(e.get('after_s'), '.1f')}s",
    "oom_kill": lambda e: f"{e.get('actor')} killed over its memory limit ({_num(e.get('rss_mb'))} > {e.get('limit_mb')} MB)",
    "chaos": lambda e: f"injected {e.get('action')} on {e.get('actor') or e.get('target')}",
    "measurement": lambda e: f"measured {config_text(e.get('config'))}: {_num(e.get('throughput'))} samples/s (model predicted {_num(e.get('predicted'))})",
    "waiting_for_nodes": lambda e: f"waiting for nodes: {e.get('why')}",
    "file_changed": lambda e: f"{e.get('path')} changed after it was taken ({_num(e.get('was_size'))} -> {_num(e.get('size'))} bytes): not trained again",
    "version_published": lambda e: f"version {e.get('version')} ({e.get('version_kind')}, {_num(e.get('changed_rows'))} rows, {_num(e.get('bytes'))} bytes) at {_num(e.get('rows_trained'))} samples trained",
    "follow_end": lambda e: f"no more files ({e.get('why')}): {_num(e.get('files'))} files, {_num(e.get('rows'))} rows",
    "eval": lambda e: f"{'final' if e.get('final') else 'periodic'} evaluation auc={_num(e.get('auc'), '.4f')} logloss={_num(e.get('logloss'), '.4f')}",
}


def describe_event(e: Event) -> str:
    """``<kind>: <what happened>`` for an event of the log (a driver log line); the
    templates read the kind's own fields."""
    try:
        what = _DESCRIBE[e.kind](e.fields)
    except Exception:  # noqa: BLE001 - no template or a field missing: list the fields
        what = " ".join(f"{k}={v}" for k, v in e.fields.items() if isinstance(v, (str, int, float, bool)))
    return f"{e.kind}: {what}"
