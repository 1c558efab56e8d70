"""Stage 3 of ``dlrover_rm`` (:mod:`dlrover.resource.dlrover_rm`): runtime correction.

Checked every tick, before any model-driven change: memory pressure (RSS plus trend over
``oom_horizon_s`` reaches ``mem_high_watermark`` of the limit), stragglers (workers by
step time, PS by time per id served, slow for ``straggler_window_s``) and hot PS. Whatever is found at one tick is merged into one
:class:`Fix`; the policy counts it and keeps the cooldowns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dlrover.resource.configs import Config, describe_change
from dlrover.resource.plan import Correction, CorrectionKind, JobView
from dlrover.resource.policy_config import DLRoverRMKnobs


@dataclass
class Fix:
    """The configuration that fixes what was found, and what else the runtime must do."""

    config: Config
    reasons: list[str]  # one per problem found, for the plan's reason
    replace: list[str]  # actors to replace (a straggler, an actor below its role's new memory)
    rebalance_ps: bool  # move vshards by load between the PS
    marks: list[str]  # cooldown keys of the corrections made
    fixes: list[Correction]  # the stragglers and memory pressure it handles


def find_correction(view: JobView, knobs: DLRoverRMKnobs, ready: Callable[[str], bool]) -> Fix | None:
    """What the running job needs fixed now, merged into one target configuration; None
    when nothing is. ``ready(key)``: whether correction ``key`` (``mem:<actor>``,
    ``straggler:<actor>``, ``ps:rebalance``, ``ps:scale``) is out of its cooldown."""
    k = knobs
    now = view.now_s
    config = view.config
    reasons: list[str] = []
    replace: list[str] = []
    rebalance = False
    marks: list[str] = []
    fixes: list[Correction] = []

    # Memory pressure first: an OOM kill costs the most.
    for name, a in sorted(view.actors.items()):
        if a.memory_limit_mb <= 0 or a.role not in ("worker", "ps"):
            continue
        trend = max(0.0, a.rss_trend_mb_per_s)
        high = a.memory_limit_mb * k.mem_high_watermark
        if a.rss_mb + trend * k.oom_horizon_s < high or not ready(f"mem:{name}"):
            continue
        field = "worker_memory_mb" if a.role == "worker" else "ps_memory_mb"
        crossing = 0.0 if a.rss_mb >= high else (high - a.rss_mb) / trend
        pressure = (
            f"memory: {name} RSS {a.rss_mb:.0f} MB"
            + (f" rising {trend:.1f} MB/s" if trend > 0 else "")
            + (f" reaches {k.mem_high_watermark:.0%} of its {a.memory_limit_mb} MB limit in ~{crossing:.0f}s" if crossing > 0 else f" is over {k.mem_high_watermark:.0%} of its {a.memory_limit_mb} MB limit")
        )
        role_mem = getattr(config, field)
        if role_mem > a.memory_limit_mb:  # the role already got more memory; this actor still has the old size
            replace.append(name)
            reasons.append(f"{pressure}: move it to the planned {role_mem} MB")
            marks.append(f"mem:{name}")
            fixes.append(Correction(CorrectionKind.MEMORY_PRESSURE, name))
            continue
        target = min(math.ceil(a.memory_limit_mb * k.mem_growth_factor), a.memory_limit_mb + k.mem_max_step_mb)
        target = int(math.ceil(target / 64) * 64)
        grown = config.replace(**{field: max(role_mem, target)})
        if not grown.fits(view.budget):
            count = config.workers if a.role == "worker" else config.ps
            others = config.memory_mb - count * role_mem
            affordable = int((view.budget.memory_mb - others) // count // 64 * 64)
            grown = config.replace(**{field: affordable}) if affordable > a.memory_limit_mb else None
        if grown is not None and grown.fits(view.budget):
            config = grown
            replace.append(name)
            new_mem = getattr(grown, field)
            reasons.append(f"{pressure}: {a.role} memory {role_mem} -> {new_mem} MB" + (" (budget cap)" if new_mem < target else ""))
            marks.append(f"mem:{name}")
            fixes.append(Correction(CorrectionKind.MEMORY_PRESSURE, name))
            continue
        more_ps = config.replace(ps=config.ps + 1)
        if a.role == "ps" and more_ps.fits(view.budget):
            config = more_ps
            reasons.append(f"{pressure}: no budget for more PS memory, add a PS to spread the embeddings")
            marks.append(f"mem:{name}")
            fixes.append(Correction(CorrectionKind.MEMORY_PRESSURE, name))

    # Stragglers: the one slow the longest, if there is a healthy median to compare with.
    workers = [a for a in view.actors.values() if a.role == "worker"]
    if max(config.workers, len(workers)) >= 2:
        slow = [
            a
            for a in workers
            if a.slow_since_s is not None
            and now - a.slow_since_s >= k.straggler_window_s
            and a.name not in replace
            and ready(f"straggler:{a.name}")
        ]
        if slow and len(slow) < len(workers):
            a = min(slow, key=lambda x: (x.slow_since_s, x.name))
            times = [w.step_time_s for w in workers if w.step_time_s > 0]
            median = float(np.median(times)) if times else 0.0
            detail = f" (step {a.step_time_s:.3f}s vs median {median:.3f}s)" if a.step_time_s > 0 and median > 0 else ""
            replace.append(a.name)
            reasons.append(f"straggler: {a.name} slow for {now - a.slow_since_s:.0f}s{detail}: replace it")
            marks.append(f"straggler:{a.name}")
            fixes.append(Correction(CorrectionKind.STRAGGLER, a.name))

    # Slow PS (a slow host, or a slow link to it: slow per id it serves, see ActorWatch):
    # every step waits on it whatever share of the vshards it holds, so moving some of them
    # away does not help; it is replaced (a new PS takes all its vshards, migrated live).
    ps = [a for a in view.actors.values() if a.role == "ps"]
    marked = [a for a in ps if a.slow_since_s is not None]
    slow_ps = [a for a in marked if now - a.slow_since_s >= k.straggler_window_s and a.name not in replace and ready(f"straggler:{a.name}")]
    if slow_ps and len(marked) < len(ps):
        a = min(slow_ps, key=lambda x: (x.slow_since_s, x.name))
        median = float(np.median([p.us_per_id for p in ps if p.us_per_id > 0] or [0.0]))
        replace.append(a.name)
        reasons.append(f"slow PS: {a.name} {a.us_per_id:.2f} us per id vs median {median:.2f} us for {now - a.slow_since_s:.0f}s: replace it")
        marks.append(f"straggler:{a.name}")
        fixes.append(Correction(CorrectionKind.STRAGGLER, a.name))

    # Hot PS; not while a PS is marked slow: its own slowness is what makes it look hot.
    if ps and not marked:
        hot = max(ps, key=lambda x: x.busy)
        mean = float(np.mean([a.busy for a in ps]))
        if hot.busy >= k.hot_ps_busy:
            if len(ps) > 1 and mean > 0 and hot.busy / mean >= k.hot_ps_imbalance:
                if ready("ps:rebalance"):
                    rebalance = True
                    reasons.append(f"hot PS: {hot.name} busy {hot.busy:.0%} vs mean {mean:.0%}: rebalance vshards by load")
                    marks.append("ps:rebalance")
            elif ready("ps:scale"):
                grown_ps = bigger_ps(view, config, k)
                why = "the only PS" if len(ps) == 1 else f"all PS hot (mean {mean:.0%})"
                if grown_ps is not None:
                    reasons.append(f"hot PS: {hot.name} busy {hot.busy:.0%}, {why}: {describe_change(config, grown_ps)}")
                    config = grown_ps
                    marks.append("ps:scale")

    if not reasons:
        return None
    return Fix(config, reasons, replace, rebalance, marks, fixes)


def bigger_ps(view: JobView, config: Config, knobs: DLRoverRMKnobs) -> Config | None:
    """One more PS, or the next PS CPU size, whichever the model predicts faster."""
    max_ps = min(view.budget.max_ps, knobs.max_ps or view.budget.max_ps)
    options = []
    if config.ps + 1 <= max_ps:
        options.append(config.replace(ps=config.ps + 1))
    bigger = [c for c in knobs.ps_cpu_choices if c > config.ps_cpu + 1e-9]
    if bigger:
        options.append(config.replace(ps_cpu=bigger[0]))
    options = [c for c in options if c.fits(view.budget)]
    if not options:
        return None
    pred = view.model.predict_many(options)
    return options[int(np.argmax(pred))]  # ties: the first, i.e. one more PS
