"""``dlrover simulate``: compare allocation policies on a trace without a cluster.

``--policies`` takes a comma-separated list; an entry is a policy name (its knobs from
``policies/cluster/<name>.yaml``), a policy YAML file (e.g. one ``dlrover tune`` wrote:
the name inside says which policy), and either may end in ``+pal`` for PAL's
variability-aware placement instead of best-fit packing. ``--truth`` picks the ground
truth (``dlrover.sim.truth``; a comma-separated list compares several) and ``--seeds N``
repeats the comparison on N synthetic traces (seeds ``--seed`` ..), printing mean and
spread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dlrover.errors import DLRoverError
from dlrover.paths import out_dir
from dlrover.sim.seeds import Entry as PolicyEntry
from dlrover.sim.truth import DEFAULT_TRUTH, TRUTHS


def parse_truths(text: str) -> list[str]:
    """``model,saturating`` -> the truths, each once; one-line errors."""
    out = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in out if x not in TRUTHS]
    if bad or not out:
        raise DLRoverError(f"--truth: expected one or more of {', '.join(TRUTHS)} (comma-separated), got {text!r}")
    return out


def parse_policies(text: str) -> list[PolicyEntry]:
    """``static,dlrover_rm+pal,policies/tuned.yaml`` -> entries; one-line errors."""
    from dlrover.resource.policy_config import KNOBS
    from dlrover.spec import read_yaml

    out = []
    for raw in [x.strip() for x in text.split(",") if x.strip()]:
        item, placement = (raw[: -len("+pal")], "pal") if raw.endswith("+pal") else (raw, "packed")
        if item.endswith((".yaml", ".yml")):
            doc = read_yaml(item, "policy")
            name = doc.get("name") if isinstance(doc, dict) else None
            if name not in KNOBS:
                raise DLRoverError(f"{item}: name: expected one of {', '.join(sorted(KNOBS))}, got {name!r}")
            out.append(PolicyEntry(Path(item).stem + ("+pal" if placement == "pal" else ""), name, item, placement))
        elif item in KNOBS and item != "scripted":
            out.append(PolicyEntry(raw, item, None, placement))
        else:
            known = ", ".join(sorted(k for k in KNOBS if k != "scripted"))
            raise DLRoverError(f"--policies: unknown policy {item!r} (known: {known}, or a policy .yaml file; +pal for PAL placement)")
    if not out:
        raise DLRoverError("--policies: empty list")
    labels = [e.label for e in out]
    if len(set(labels)) != len(labels):
        raise DLRoverError(f"--policies: listed twice: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    return out


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run ``dlrover simulate`` (``--truth`` and ``--seeds`` optional on ``args``)."""
    from dlrover.sim import ClusterSpec, read_trace, synthetic_trace

    if args.trace == "diurnal":
        return _diurnal(args)
    entries = parse_policies(args.policies)
    truths = parse_truths(getattr(args, "truth", None) or DEFAULT_TRUTH)
    n_seeds = int(getattr(args, "seeds", None) or 1)
    out = Path(out_dir(args.out or str(Path("runs") / f"sim-{time.strftime('%Y%m%d-%H%M%S')}")))
    cluster = ClusterSpec(
        nodes=args.nodes, node_cpu=args.node_cpu, node_memory_mb=args.node_memory_gb * 1024,
        failure_rate=0.0 if args.no_failures else args.failure_rate, p_slow=0.0 if args.no_stragglers else ClusterSpec.p_slow,
    )  # fmt: skip
    if n_seeds > 1 and args.trace != "synthetic":
        raise DLRoverError("--seeds: only with the synthetic trace (a trace file is one draw)")
    if args.trace == "synthetic":
        trace = synthetic_trace(args.jobs, args.seed, nodes=args.nodes, node_cpu=args.node_cpu, node_memory_mb=args.node_memory_gb * 1024)
        source = f"synthetic trace: {args.jobs} jobs, seed {args.seed}" + (f"..{args.seed + n_seeds - 1}" if n_seeds > 1 else "")
    else:
        trace = read_trace(args.trace)
        source = f"{args.trace}: {len(trace)} jobs"
    quiet = args.json
    if not quiet:
        print(f"{source}; cluster {args.nodes} nodes x {args.node_cpu:g} CPU / {args.node_memory_gb:g} GB; truth {', '.join(truths)}", file=sys.stderr)
    if n_seeds > 1:
        return _many_seeds(args, entries, truths, n_seeds, cluster, out)
    for truth in truths:
        _one_trace(args, entries, truth, trace, cluster, out / truth if len(truths) > 1 else out, quiet)
    return 0


DIURNAL_SEEDS = 5


def _diurnal(args: argparse.Namespace) -> int:
    """``--trace diurnal``: the stream stage against static-peak, ``--seeds`` seeds (default 5)."""
    from dlrover.sim.stream import compare, print_compare

    n = int(getattr(args, "seeds", None) or 1)
    result = compare(list(range(args.seed, args.seed + (n if n > 1 else DIURNAL_SEEDS))))
    if args.json:
        print(json.dumps(result, default=float))
    else:
        print_compare(result)
    return 0


def _one_trace(args: argparse.Namespace, entries: list[PolicyEntry], truth: str, trace, cluster, out: Path, quiet: bool) -> None:
    from tqdm import tqdm

    from dlrover.sim import SimSettings, simulate
    from dlrover.sim.report import JSON_KEYS, metrics, table, write_outputs

    results, rows = [], []
    for e in entries:
        settings = SimSettings(placement=e.placement, control_interval_s=args.tick, truth=truth)
        t0 = time.monotonic()
        with tqdm(total=len(trace), desc=f"{e.label:<16}", unit="job", file=sys.stderr, disable=quiet, leave=True) as bar:
            done = [0]

            def progress(frac: float, bar=bar, done=done) -> None:
                n = round(frac * len(trace))
                bar.update(n - done[0])
                done[0] = n

            r = simulate(trace, e.policy, e.config, cluster=cluster, settings=settings, seed=args.seed, progress=progress, label=e.label)
        results.append(r)
        m = metrics(r)
        m["sim_wall_s"] = time.monotonic() - t0
        rows.append(m)
    if args.json:
        print(json.dumps([{k: m[k] for k in JSON_KEYS} for m in rows]))
    else:
        print(f"truth: {truth}")
        print(table(rows))
    paths = write_outputs(results, rows, out)
    if not quiet:
        print(f"wrote {len(paths)} files to {out}/ (summary.csv, jobs_*.csv, timeline_*.csv, jct_cdf.png, utilisation.png)")


def _many_seeds(args: argparse.Namespace, entries: list[PolicyEntry], truths: list[str], n: int, cluster, out: Path) -> int:
    from dlrover.sim import synthetic_trace
    from dlrover.sim.seeds import run_seeds, seeds_frame, seeds_table

    def trace_of(seed: int):
        return synthetic_trace(args.jobs, seed, nodes=args.nodes, node_cpu=args.node_cpu, node_memory_mb=args.node_memory_gb * 1024)

    log = None if args.json else (lambda line: print(line, file=sys.stderr))
    rows = run_seeds(entries, truths, range(args.seed, args.seed + n), trace_of, cluster, args.tick, log)
    frame = seeds_frame(rows)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "summary_seeds.csv", index=False)
    if args.json:
        print(frame.to_json(orient="records"))
    else:
        print(seeds_table(rows))
        print(f"wrote {out / 'summary_seeds.csv'}")
    return 0
