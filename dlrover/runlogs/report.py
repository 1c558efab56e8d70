"""``dlrover report RUN_DIR``: one self-contained HTML page of what happened to a job.

Reads the run directory the master wrote (``summary.json``, ``events.jsonl``) and draws,
with matplotlib into inline PNGs (no scripts, no network: the page opens anywhere):

- throughput over time, with scale events, failures and injected faults marked;
- the allocation timeline per role (workers, PS, their CPUs);
- memory per actor against its limit;
- the performance model's predicted vs the measured throughput of each configuration;

plus the summary, the scale events and the failures as tables.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from dlrover.errors import DataError
from dlrover.runlogs.event_file import read_events
from dlrover.runlogs.records import Event, JobSummary, read_summary

# Event markers: colour, legend label, line style (failures dotted and thicker: they often
# coincide with the scale event that handles them).
MARKS = {"scale": ("#1f77b4", "scale", "--"), "failure": ("#d62728", "failure", ":"), "chaos": ("#9467bd", "fault injected", "-.")}


def load_run(run_dir: str | Path) -> tuple[JobSummary, list[Event]]:
    """``(summary, events)`` of a run directory; one-line errors naming the file (and line)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise DataError(f"{run_dir}: not a run directory")
    return read_summary(d / "summary.json"), [e for _, e in read_events(d / "events.jsonl")]


def _plt() -> Any:
    """pyplot on the file-only backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, ax: Any, events: list[Event], ylabel: str, title: str, **legend: Any) -> str:
    """Event markers, axis labels, grid and legend of a job-time plot; the PNG as base64."""
    _marks(ax, events)
    ax.set_xlabel("job time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(**legend)
    return _png(fig)


def _step(ax: Any, steps: list[tuple[float, dict]], end: float, value: Any, **kw: Any) -> None:
    """A configuration quantity (``value(config)``) as a step line from its changes to ``end``."""
    ys = [value(c) for _, c in steps]
    ax.step([t for t, _ in steps] + [end], ys + ys[-1:], where="post", **kw)


def _png(fig: Any) -> str:
    plt = _plt()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _marks(ax: Any, events: list[Event]) -> None:
    """Vertical lines at scale events, failures and injected faults (one legend entry each)."""
    seen = set()
    for e in events:
        kind = e.kind
        if kind not in MARKS:
            continue
        color, label, style = MARKS[kind]
        t = e.job_s
        ax.axvline(t, color=color, linestyle=style, linewidth=2.2 if kind == "failure" else 1.4, label=None if kind in seen else label)
        seen.add(kind)


def _short(actor: str) -> str:
    return actor.rsplit("/", 1)[-1]


def throughput_plot(events: list[Event]) -> str:
    import numpy as np

    plt = _plt()
    pts = [(e.at_s, e.actor, e.fields["samples_per_s"]) for e in events if e.kind == "metrics" and "samples_per_s" in e.fields]
    fig, ax = plt.subplots(figsize=(9, 3.4))
    if pts:
        t = np.array([p[0] for p in pts])
        bins = np.arange(0.0, t.max() + 1.0, 1.0)
        latest: dict[str, float] = {}
        total = np.zeros(len(bins))
        j = 0
        order = sorted(pts)
        for i, b in enumerate(bins):  # job throughput = sum of each worker's latest report
            while j < len(order) and order[j][0] <= b:
                latest[order[j][1]] = order[j][2]
                j += 1
            total[i] = sum(latest.values())
        ax.plot(bins, total, color="black", linewidth=1.2, label="samples/s (sum of workers)")
    return _finish(fig, ax, events, "samples/s", "throughput", fontsize=8, loc="lower right")


def _config_steps(summary: JobSummary, events: list[Event]) -> list[tuple[float, dict]]:
    steps = []
    for e in events:
        if e.kind == "initial_config" and isinstance(e.fields.get("config"), dict):
            steps.append((e.at_s, e.fields["config"]))
        elif e.kind == "scale" and isinstance(e.fields.get("to"), dict):
            steps.append((e.at_s, e.fields["to"]))
    if not steps and summary.final_config:
        steps.append((0.0, summary.final_config))
    return steps


def allocation_plot(summary: JobSummary, events: list[Event]) -> str:
    steps = _config_steps(summary, events)
    end = float(summary.wall_time_s or (steps[-1][0] + 1 if steps else 1))
    fig, ax = _plt().subplots(figsize=(9, 3.0))
    if steps:
        _step(ax, steps, end, lambda c: c["workers"], label="workers")
        _step(ax, steps, end, lambda c: c["ps"], label="PS")
        _step(ax, steps, end, lambda c: c["workers"] * c["worker_cpu"] + c["ps"] * c["ps_cpu"], linestyle=":", label="CPUs")
    return _finish(fig, ax, events, "actors / CPUs", "allocation per role", fontsize=8, loc="upper left")


def memory_plot(summary: JobSummary, events: list[Event]) -> str:
    series: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.kind in ("metrics", "ps_metrics") and "rss_mb" in e.fields and e.actor:
            series.setdefault(_short(e.actor), []).append((e.at_s, e.fields["rss_mb"]))
    fig, ax = _plt().subplots(figsize=(9, 3.4))
    for name, pts in sorted(series.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=1.0, label=name)
    steps = _config_steps(summary, events)
    end = float(summary.wall_time_s or 1)
    for key, label, style in (("worker_memory_mb", "worker limit", "--"), ("ps_memory_mb", "PS limit", "-.")):
        if steps and all(key in c for _, c in steps):
            _step(ax, steps, end, lambda c, key=key: c[key], color="grey", linestyle=style, label=label)
    return _finish(fig, ax, events, "RSS (MB)", "memory per actor vs its limit", fontsize=7, ncol=4, loc="upper left")


def model_plot(summary: JobSummary) -> str | None:
    rows = [c for c in summary.configurations if c.get("measured_throughput")]
    if not rows:
        return None
    fig, ax = _plt().subplots(figsize=(9, 3.0))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [c["measured_throughput"] for c in rows], width=0.4, label="measured")
    pred = [c.get("predicted_throughput") or 0 for c in rows]
    sd = [p * (c.get("predicted_sd") or 0) for p, c in zip(pred, rows)]  # the model's own +/- 1 sd
    ax.bar([i + 0.2 for i in x], pred, yerr=sd, capsize=3, width=0.4, label="model predicted (+/- its uncertainty)")
    ax.set_xticks(list(x), [c.get("summary", "")[:40] for c in rows], fontsize=7, rotation=10)
    ax.set_ylabel("samples/s")
    ax.set_title("performance model: predicted vs measured throughput per configuration")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def _table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return "" if v is None else str(v)


def render(run_dir: str | Path) -> str:
    """The report page of ``run_dir`` as an HTML string."""
    s, events = load_run(run_dir)
    facts = {
        "job": s.job_id, "status": s.status, "policy": s.policy, "auc": s.auc,
        "throughput (samples/s)": s.throughput_samples_per_s, "wall time (s)": s.wall_time_s,
        "samples trained / expected": f"{s.samples_trained:,} / {s.samples_expected:,}",
        "samples lost": s.samples_lost, "ETTR": s.ettr, "failures": len(s.failures), "scale events": len(s.scale_events),
    }  # fmt: skip
    images = [("throughput", throughput_plot(events)), ("allocation", allocation_plot(s, events)), ("memory", memory_plot(s, events))]
    model = model_plot(s)
    if model:
        images.append(("model", model))
    figs = "".join(f'<figure id="{k}"><img alt="{k}" src="data:image/png;base64,{v}"></figure>' for k, v in images)
    scale_rows = [dict(e.to_dict(), at_s=round(e.at_s, 1)) for e in s.scale_events]
    fail_rows = [dict(f.to_dict(), actor=_short(f.actor)) for f in s.failures]
    style = (
        "body{font-family:sans-serif;margin:24px;max-width:1000px}table{border-collapse:collapse;font-size:13px;margin:8px 0 20px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}img{max-width:100%}figure{margin:0 0 12px}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>dlrover report {html.escape(s.job_id)}</title>"
        f"<style>{style}</style></head><body><h1>dlrover job {html.escape(s.job_id)}</h1>"
        + _table([facts], list(facts))
        + figs
        + "<h2>Scale events</h2>" + _table(scale_rows, ["at_s", "kind", "summary", "pause_s", "duration_s"])
        + "<h2>Failures</h2>" + _table(fail_rows, ["kind", "actor", "at_s", "detected_s", "recovered_s", "cause_class"])
        + "</body></html>"
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``); returns its path."""
    path = Path(out) if out else Path(run_dir) / "report.html"
    text = render(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
