"""``dlrover bench sim-speed``: how fast the simulator replays a large trace on one core.

10,000 jobs of the synthetic trace on 1,000 nodes (failures and stragglers on), once per
policy, with the ground truth ``dlrover simulate`` uses by default (``DEFAULT_TRUTH``):
what users run. ``static`` never reconfigures: its time is the simulator's own cost, the
named baseline; ``dlrover_rm`` adds the policy code (model fits, searches) on every tick.
Goal: each whole run (trace generation excluded) within 60 s of CPU time.
"""

from __future__ import annotations

import os
import time

GOAL_S = 60.0


def run_sim_speed(jobs: int = 10_000, nodes: int = 1_000, policies: tuple[str, ...] = ("static", "dlrover_rm"), seed: int = 0) -> dict:
    from dlrover.sim import ClusterSpec, simulate, synthetic_trace
    from dlrover.sim.job import SimSettings
    from dlrover.sim.report import metrics
    from dlrover.sim.truth import DEFAULT_TRUTH

    t0 = time.perf_counter()
    trace = synthetic_trace(jobs, seed, nodes=nodes)
    gen_s = time.perf_counter() - t0
    out = {"jobs": jobs, "nodes": nodes, "truth": DEFAULT_TRUTH, "trace_s": gen_s, "goal_s": GOAL_S, "cpu_count": os.cpu_count(), "runs": []}
    for policy in policies:
        t0 = time.perf_counter()
        c0 = time.process_time()
        r = simulate(trace, policy, cluster=ClusterSpec(nodes=nodes), settings=SimSettings(truth=DEFAULT_TRUTH), seed=seed)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        m = metrics(r)
        out["runs"].append({
            "policy": policy, "wall_s": wall, "cpu_s": cpu, "jobs_per_s": jobs / wall, "simulated_s": r.sim_time_s,
            "speedup_vs_real_time": r.sim_time_s / wall, "completion_rate": m["completion_rate"], "jct_mean_s": m["jct_mean_s"],
            "node_failures": r.node_failures, "within_goal": cpu <= GOAL_S,
        })  # fmt: skip
    base = out["runs"][0]["wall_s"]
    for run in out["runs"]:
        run["time_vs_static"] = run["wall_s"] / base
    return out


def print_sim_speed(r: dict) -> None:
    print(f"sim-speed: {r['jobs']:,} jobs on {r['nodes']:,} nodes, truth {r['truth']}, one process (trace generated in {r['trace_s']:.1f}s)")
    print(f"{'policy':<12}{'wall':>8}{'cpu':>8}{'jobs/s':>9}{'simulated':>12}{'x real time':>13}{'vs static':>11}{'done':>8}  goal <= {r['goal_s']:.0f}s of CPU")
    for x in r["runs"]:
        print(
            f"{x['policy']:<12}{x['wall_s']:>7.1f}s{x['cpu_s']:>7.1f}s{x['jobs_per_s']:>9.0f}{x['simulated_s'] / 86400:>10.1f}d"
            f"{x['speedup_vs_real_time']:>12,.0f}x{x['time_vs_static']:>10.2f}x{x['completion_rate']:>8.1%}  {'met' if x['within_goal'] else 'NOT met'}"
        )
