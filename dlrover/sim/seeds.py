"""Policies compared over several trace seeds and truths: one trace is one draw, so a
claim about a policy needs the mean and spread of its change against ``static``
(``dlrover simulate --seeds N --truth ...``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlrover.sim.cluster import ClusterSpec
from dlrover.sim.job import SimSettings
from dlrover.sim.report import compare, metrics


@dataclass(frozen=True)
class Entry:
    """One policy of the comparison: its label, name, knob file and placement."""

    label: str
    policy: str
    config: str | None
    placement: str


@dataclass(frozen=True)
class SeedRow:
    """One policy's metrics on one trace seed under one truth."""

    truth: str
    seed: int
    metrics: dict


def run_seeds(
    entries: Sequence[Entry],
    truths: Sequence[str],
    seeds: Sequence[int],
    trace_of: Callable[[int], pd.DataFrame],
    cluster: ClusterSpec,
    tick_s: float = 300.0,
    log: Callable[[str], None] | None = None,
) -> list[SeedRow]:
    """Simulate every policy on ``trace_of(seed)`` for every seed and truth (the
    simulator's seed is the trace's, as ``dlrover simulate`` does)."""
    from dlrover.sim import simulate

    out = []
    for seed in seeds:
        trace = trace_of(seed)
        for truth in truths:
            for e in entries:
                settings = SimSettings(placement=e.placement, control_interval_s=tick_s, truth=truth)
                m = metrics(simulate(trace, e.policy, e.config, cluster=cluster, settings=settings, seed=seed, label=e.label))
                out.append(SeedRow(truth, seed, m))
                if log is not None:
                    log(f"truth {truth}, seed {seed}: {e.label} JCT {m['jct_mean_s'] / 3600:.2f}h, CPU util {m['cpu_util']:.1%}")
    return out


def _spread(xs: list[float], fmt: str) -> str:
    a = np.array([x for x in xs if math.isfinite(x)])
    if not len(a):
        return "n/a"
    sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    return f"{format(a.mean(), fmt)} ±{format(sd, fmt.lstrip('+'))} [{format(a.min(), fmt)}, {format(a.max(), fmt)}]"


def seeds_table(rows: Sequence[SeedRow]) -> str:
    """Per truth: each policy's metrics (mean over seeds), then its change against
    ``static`` as mean ±sd [min, max] over the seeds (JCT relative, rates in points)."""
    lines = []
    for truth in dict.fromkeys(r.truth for r in rows):
        mine = [r for r in rows if r.truth == truth]
        seeds = sorted({r.seed for r in mine})
        labels = list(dict.fromkeys(r.metrics["policy"] for r in mine))
        lines.append(f"truth {truth}, seeds {', '.join(map(str, seeds))} (mean over seeds)")
        head = f"{'policy':<16}{'JCT mean':>10}{'done':>8}{'CPU util':>10}{'mem util':>10}{'ETTR':>7}{'OOM':>7}"
        lines += [head, "-" * len(head)]
        for label in labels:
            ms = [r.metrics for r in mine if r.metrics["policy"] == label]

            def avg(k: str, ms: list[dict] = ms) -> float:
                return float(np.nanmean([m[k] for m in ms]))

            lines.append(
                f"{label:<16}{avg('jct_mean_s') / 3600:>9.2f}h{avg('completion_rate'):>8.1%}{avg('cpu_util'):>10.1%}"
                f"{avg('mem_util'):>10.1%}{avg('ettr'):>7.3f}{avg('oom_kills'):>7.1f}"
            )
        base = {r.seed: r.metrics for r in mine if r.metrics["policy"] == "static"}
        if base and len(labels) > 1:
            lines.append("")
            lines.append(f"vs static, mean ±sd [min, max] over {len(seeds)} seeds")
            for label in labels:
                if label == "static":
                    continue
                d = [compare(r.metrics, base[r.seed]) for r in mine if r.metrics["policy"] == label and r.seed in base]
                lines.append(f"  {label:<15} JCT {_spread([x['jct_mean_s'] * 100 for x in d], '+.1f')} %")
                for key, name in (("completion_rate", "done"), ("cpu_util", "CPU util"), ("mem_util", "mem util")):
                    lines.append(f"  {'':<15} {name} {_spread([x[key] * 100 for x in d], '+.1f')} points")
        lines.append("")
    return "\n".join(lines).rstrip()


def seeds_frame(rows: Sequence[SeedRow]) -> pd.DataFrame:
    """One row per truth, seed and policy (for ``summary_seeds.csv``)."""
    return pd.DataFrame([{"truth": r.truth, "seed": r.seed, **r.metrics} for r in rows])
