"""What a tracker records of a job, as plain values: the spec as flat params, a progress
snapshot as one window's metrics, the metrics an event carries, the events worth a tag.

Pure functions of what the driver sees (no MLflow, TensorBoard or Ray here), so that both
trackers record the same things under the same names and the mapping is tested alone.
Every metric's step is the samples trained (``JobMaster.progress``'s ``samples_done``,
the summary's ``samples_trained``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from dlrover.runlogs.event_file import describe_event
from dlrover.runlogs.records import Event, JobSummary

# Events recorded as tagged events (MLflow tags, TensorBoard text): how the job was scaled
# and what failed; the evaluations and measured windows are metrics instead.
SCALE_EVENTS = frozenset({"initial_config", "scale", "scale_failed", "plan_rejected"})
FAILURE_EVENTS = frozenset({"failure", "recovered", "oom_kill", "rollback", "master_resumed", "bad_node", "checkpoint_corrupt", "chaos", "job_error"})
TAGGED_EVENTS = SCALE_EVENTS | FAILURE_EVENTS

# The metrics an event carries: {kind: {field: metric}}.
EVENT_METRICS: dict[str, dict[str, str]] = {
    "eval": {"auc": "auc", "logloss": "logloss", "best_auc": "best_auc"},
    "measurement": {"throughput": "measured_samples_per_s", "predicted": "predicted_samples_per_s"},
}

BAD_KEY_CHARS = re.compile(r"[^\w./\- ]")  # what MLflow takes in a key (and TensorBoard shows)


def flat_params(doc: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A spec's JSON document as ``{"data.batch_size": "1024", ...}``: sections as dotted
    keys, strings as they are, anything else (lists, numbers, null) as its JSON text;
    characters a key may not hold become ``_``."""
    out: dict[str, str] = {}
    for k, v in doc.items():
        key = BAD_KEY_CHARS.sub("_", f"{prefix}{k}")
        if isinstance(v, Mapping) and v:
            out.update(flat_params(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, default=str)
    return out


def samples_trained(p: Mapping[str, Any]) -> int:
    """A progress snapshot's step: the rows of the shards done so far."""
    return int(p["samples_done"])


def window_metrics(p: Mapping[str, Any]) -> dict[str, float]:
    """One window of a progress snapshot: the workers' mean loss (none before their first
    report), the throughput and the configuration's size."""
    out = {"samples_per_s": float(p["samples_per_s"]), "workers": float(p["workers"]), "ps": float(p["ps"])}
    if p["loss"] is not None:
        out["loss"] = float(p["loss"])
    return out


def event_metrics(e: Event) -> dict[str, float]:
    """The metrics an event carries: an evaluation's AUC and log loss (and the data's best
    AUC on synthetic data), a measured window's throughput against the model's prediction."""
    named = EVENT_METRICS.get(e.kind, {})
    return {m: float(e.fields[f]) for f, m in named.items() if isinstance(e.fields.get(f), (int, float)) and not isinstance(e.fields.get(f), bool)}


def event_text(e: Event) -> str:
    """A tagged event's text: ``t=12.3s scale: scale_out ...`` (the driver log's wording)."""
    return f"t={e.job_s:.1f}s {describe_event(e)}"


def summary_metrics(s: JobSummary) -> dict[str, float]:
    """The job's totals, logged once at its end (``summary/...``): runs compare on them."""
    values = {
        "throughput_samples_per_s": s.throughput_samples_per_s,
        "train_time_s": s.train_time_s,
        "wall_time_s": s.wall_time_s,
        "samples_trained": s.samples_trained,
        "samples_lost": s.samples_lost,
        "samples_replayed": s.samples_replayed,
        "updates_lost": s.updates_lost,
        "failures": len(s.failures),
        "scale_events": len(s.scale_events),
        "ettr": s.ettr,
    }
    return {f"summary/{k}": float(v) for k, v in values.items() if v is not None}


def event_key(e: Event) -> tuple[float, str]:
    """What tells an event seen live from the summary's copy of it."""
    return (e.at_s, e.kind)


@dataclass
class Windows:
    """Which progress snapshots become a window: one per ``every_s`` (the workers' report
    period: loss and throughput change no faster), and only once more samples were
    trained (a rollback's fewer count too); a changed configuration does not wait."""

    every_s: float
    last_step: int = 0
    last_config: tuple[int, int] | None = None
    last_at: float = -math.inf

    def due(self, p: Mapping[str, Any], now: float) -> bool:
        step, config = samples_trained(p), (int(p["workers"]), int(p["ps"]))
        if step == self.last_step or (config == self.last_config and now - self.last_at < self.every_s):
            return False
        self.last_step, self.last_config, self.last_at = step, config, now
        return True
