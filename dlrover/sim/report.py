"""Per-policy metrics of a simulation, the comparison table, CSV files and plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dlrover.sim.job import SimResult

# DLRover-RM (VLDB'24) abstract: its changes against the static request baseline.
PAPER = {"jct_mean_s": -0.31, "completion_rate": 0.06, "cpu_util": 0.15, "mem_util": 0.20}
JSON_KEYS = ["policy", "jct_mean_s", "jct_p95_s", "completion_rate", "cpu_util", "mem_util", "makespan_s", "ettr"]


def metrics(r: SimResult) -> dict:
    """JCT (completed jobs, queueing included), completion rate, utilisation (used /
    allocated, time-weighted over the cluster), makespan, mean ETTR, CPU-hours held."""
    jobs = r.jobs
    done = jobs[jobs["status"] == "completed"]
    jct = done["jct_s"].to_numpy(dtype=np.float64)
    first = float(jobs["submit_s"].min()) if len(jobs) else 0.0
    last = float(done["end_s"].max()) if len(done) else math.nan

    def q(p: float) -> float:
        return float(np.percentile(jct, p)) if len(jct) else math.nan

    return {
        "policy": r.policy,
        "jobs": int(len(jobs)),
        "jct_mean_s": float(jct.mean()) if len(jct) else math.nan,
        "jct_p50_s": q(50),
        "jct_p95_s": q(95),
        "completion_rate": float(len(done) / len(jobs)) if len(jobs) else math.nan,
        "cpu_util": float(r.totals["cpu_util"]),
        "mem_util": float(r.totals["mem_util"]),
        "makespan_s": last - first,
        "ettr": float(done["ettr"].mean()) if len(done) else math.nan,
        "queue_mean_s": float(done["queue_s"].mean()) if len(done) else math.nan,
        "cpu_hours": float(jobs["cpu_hours"].sum()),
        "failures": int(jobs["failures"].sum()),
        "oom_kills": int(jobs["oom_kills"].sum()),
        "node_failures": int(r.node_failures),
        "changes": int(jobs["changes"].sum()),
    }


def _h(s: float) -> str:
    return "n/a" if not math.isfinite(s) else f"{s / 3600:.2f}h"


def table(rows: list[dict]) -> str:
    """The per-policy table, then each policy against ``static`` next to the paper's figures."""
    head = f"{'policy':<16}{'JCT mean':>10}{'p50':>9}{'p95':>9}{'done':>8}{'CPU util':>10}{'mem util':>10}{'makespan':>10}{'ETTR':>7}{'CPU-h':>10}{'fail':>6}{'OOM':>5}"
    lines = [head, "-" * len(head)]
    for m in rows:
        lines.append(
            f"{m['policy']:<16}{_h(m['jct_mean_s']):>10}{_h(m['jct_p50_s']):>9}{_h(m['jct_p95_s']):>9}{m['completion_rate']:>8.1%}"
            f"{m['cpu_util']:>10.1%}{m['mem_util']:>10.1%}{_h(m['makespan_s']):>10}{m['ettr']:>7.3f}{m['cpu_hours']:>10.0f}{m['failures']:>6}{m['oom_kills']:>5}"
        )
    base = next((m for m in rows if m["policy"] == "static"), None)
    if base is not None and len(rows) > 1:
        lines.append("")
        lines.append(f"vs static        {'JCT':>10}{'done':>10}{'CPU util':>10}{'mem util':>10}")
        paper = PAPER
        lines.append(f"{'DLRover-RM paper':<16}{paper['jct_mean_s']:>+10.0%}{paper['completion_rate']:>+10.0%}{paper['cpu_util']:>+10.0%}{paper['mem_util']:>+10.0%}")
        for m in rows:
            if m is base:
                continue
            d = compare(m, base)
            lines.append(f"{m['policy']:<16}{d['jct_mean_s']:>+10.1%}{d['completion_rate']:>+10.1%}{d['cpu_util']:>+10.1%}{d['mem_util']:>+10.1%}")
        lines.append("(JCT: relative change; completion rate and utilisation: change in percentage points, as the paper reports them)")
    return "\n".join(lines)


def compare(m: dict, base: dict) -> dict:
    """``m`` against ``base``: JCT as a relative change, rates as percentage-point changes."""
    return {
        "jct_mean_s": m["jct_mean_s"] / base["jct_mean_s"] - 1 if base["jct_mean_s"] else math.nan,
        "completion_rate": m["completion_rate"] - base["completion_rate"],
        "cpu_util": m["cpu_util"] - base["cpu_util"],
        "mem_util": m["mem_util"] - base["mem_util"],
    }


def write_outputs(results: list[SimResult], rows: list[dict], out: str | Path) -> list[Path]:
    """``summary.csv``, ``jobs_<policy>.csv``, ``timeline_<policy>.csv``, ``jct_cdf.png``,
    ``utilisation.png`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.csv"]
    pd.DataFrame(rows).to_csv(paths[0], index=False)
    for r in results:
        for name, df in (("jobs", r.jobs), ("timeline", r.timeline), ("events", r.events)):
            p = out / f"{name}_{r.policy}.csv"
            df.to_csv(p, index=False)
            paths.append(p)
    paths += _plots(results, out)
    return paths


def _plots(results: list[SimResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in results:
        jct = np.sort(r.jobs.loc[r.jobs["status"] == "completed", "jct_s"].to_numpy() / 3600.0)
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(r.jobs), where="post", label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of jobs completed")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    cdf = out / "jct_cdf.png"
    fig.savefig(cdf, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(7.5, 5.6), sharex=True)
    for r in results:
        tl = r.timeline
        if tl.empty:
            continue
        h = tl["t_s"] / 3600.0
        (line,) = axes[0].plot(h, tl["cpu_alloc"], label=f"{r.policy} allocated")
        axes[0].plot(h, tl["cpu_used"], color=line.get_color(), linestyle="--", label=f"{r.policy} used")
        axes[1].plot(h, tl["mem_alloc"], color=line.get_color(), label=f"{r.policy} allocated")
        axes[1].plot(h, tl["mem_used"], color=line.get_color(), linestyle="--", label=f"{r.policy} used")
    axes[0].set_ylabel("CPU (fraction of cluster)")
    axes[1].set_ylabel("memory (fraction of cluster)")
    axes[1].set_xlabel("time (h)")
    axes[0].set_title("cluster utilisation over time")
    for a in axes:
        a.grid(alpha=0.3)
        a.set_ylim(bottom=0)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    util = out / "utilisation.png"
    fig.savefig(util, dpi=110)
    plt.close(fig)
    return [cdf, util]
