"""``dlrover`` command line: run | submit | status | dashboards | data synth | simulate | simulate-coding | tune | report | export | predict | bench ....

User errors (bad spec, data or arguments) print one ``error:`` line and exit 2; a bug keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Callable

from dlrover.cli_data import add_data_parsers, cmd_data
from dlrover.cli_serving import SERVING_COMMANDS, add_serving_parsers
from dlrover.errors import DLRoverError
from dlrover.paths import out_dir

EXIT_USER_ERROR = 2
DEFAULT_DASHBOARD = "http://127.0.0.1:8265"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR)


def _number(cast: type, low: float, strict: bool, what: str):
    """An argparse type: ``cast(v)``, finite, above ``low`` (``strict``) or at least it."""

    def parse(v: str):
        try:
            x = cast(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v!r}") from None
        if not math.isfinite(x) or (x <= low if strict else x < low):
            raise argparse.ArgumentTypeError(f"expected {what}, got {v!r}")
        return x

    return parse


_positive_int = _number(int, 0, True, "a positive integer")
_nonneg_int = _number(int, 0, False, "an integer >= 0")
_positive_float = _number(float, 0.0, True, "a positive number")
_rate = _number(float, 0.0, False, "a finite number >= 0")
_tick_s = _number(float, 1.0, False, "at least 1 second")


def _int_list(text: str) -> list[int]:
    """An argparse type: ``1,2,4`` (positive integers)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas (e.g. 1,2,4), got {text!r}")
    return values


def _grid(v: str) -> list[tuple[int, int]]:
    """An argparse type: ``WxP,...`` (``dlrover bench scaling --grid``)."""
    from dlrover.bench.scaling import parse_grid

    try:
        return parse_grid(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dlrover", description="Elastic DLRM training on Ray.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="train a job spec (embedded local Ray unless --address)")
    r.add_argument("spec")
    r.add_argument("--address", help="Ray cluster address (default: start a local Ray on 127.0.0.1)")
    r.add_argument("--runs-dir", default="runs")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field, e.g. data.epochs=2")
    r.add_argument("--dashboard", action="store_true", help="start the Ray dashboard with the embedded cluster")
    r.add_argument("--quiet", action="store_true", help="no progress bar (progress lines every few seconds instead)")
    r.add_argument("--job-id", help=argparse.SUPPRESS)

    s = sub.add_parser("submit", help="submit a job spec through Ray Jobs")
    s.add_argument("spec")
    s.add_argument("--address", default=DEFAULT_DASHBOARD)
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--wait", action="store_true", help="follow the logs until the job ends; exit code follows the job")
    s.add_argument("--runs-dir", default="runs")

    st = sub.add_parser("status", help="jobs on a Ray cluster: configuration, throughput, last events")
    st.add_argument("job", nargs="?", help="one job's details and last events (default: list the recent jobs)")
    st.add_argument("--address", default=DEFAULT_DASHBOARD, help="Ray dashboard URL (as for dlrover submit)")
    st.add_argument("--events", type=_nonneg_int, default=10, help="how many of the job's last events to show")

    dr = sub.add_parser("drain", help="move a job's actors off a node before it goes away (asks Ray to drain it)")
    dr.add_argument("job", help="the job id (its master is the actor <job>/master)")
    dr.add_argument("--node", required=True, help="the Ray node id (hex, as `ray list nodes` shows it)")
    dr.add_argument("--deadline-s", type=float, help="seconds until the node goes away (default: none)")
    dr.add_argument("--address", required=True, help="the Ray cluster (GCS address, as for `ray start --address`)")

    db = sub.add_parser("dashboards", help="the Grafana dashboard: check it against a real job, or install it next to Ray's")
    dbsub = db.add_subparsers(dest="dash_cmd", required=True, parser_class=_Parser)
    dc = dbsub.add_parser("check", help="Ray head + Prometheus + a short job: every dashboard query must return data")
    dc.add_argument("--spec", default="jobs/observe.yaml")
    dc.add_argument("--runs-dir", default="runs")
    di = dbsub.add_parser("install", help="copy dashboards/dlrover.json next to the Grafana dashboards Ray wrote for a session")
    di.add_argument("--session-dir", default="/tmp/ray/session_latest")

    add_data_parsers(sub.add_parser, _positive_int)

    sim = sub.add_parser("simulate", help="compare allocation policies on a job trace in the cluster simulator")
    sim.add_argument("--trace", default="synthetic", help="trace CSV/Parquet, or 'synthetic' (default)")
    sim.add_argument("--jobs", type=_positive_int, default=400, help="jobs of the synthetic trace")
    sim.add_argument("--nodes", type=_positive_int, default=40)
    sim.add_argument("--node-cpu", type=_positive_float, default=64.0)
    sim.add_argument("--node-memory-gb", type=_positive_float, default=256.0)
    sim.add_argument("--seed", type=_nonneg_int, default=0)
    sim.add_argument("--policies", default="static,dlrover_rm", help="comma-separated names or policy YAML files, each optionally +pal")
    sim.add_argument("--tick", type=_tick_s, default=300.0, help="seconds between a job's policy decisions (>= 1)")
    sim.add_argument("--truth", default="profile", help="ground truth: model, saturating, profile (comma-separated: several)")
    sim.add_argument("--seeds", type=_positive_int, default=1, help="synthetic traces of seeds --seed.. (mean and spread)")
    sim.add_argument("--failure-rate", type=_rate, default=6.5e-3, help="node failures per node-day (RSC-1: 6.5e-3)")
    sim.add_argument("--no-failures", action="store_true")
    sim.add_argument("--no-stragglers", action="store_true")
    sim.add_argument("--json", action="store_true", help="print only a JSON list of per-policy metrics")
    sim.add_argument("--out", help="directory for CSV and PNG outputs (default runs/sim-<time>)")

    cg = sub.add_parser("simulate-coding", help="gradient coding schemes under slow/active stragglers: step time, decoding error (no Ray)")
    cg.add_argument("--workers", type=_positive_int, default=12, help="workers = data partitions")
    cg.add_argument("--stragglers", type=_nonneg_int, default=2, help="stragglers tolerated, s < workers")
    cg.add_argument("--rates", default="0.01,0.05,0.1,0.2", help="straggler rates (active -> slow per step), comma-separated")
    cg.add_argument("--d", type=_positive_int, help="partitions per cyclic worker (default stragglers + 1)")
    cg.add_argument("--slow-factor", type=_positive_float, default=0.4, help="speed of a slow node (0 < f <= 1)")
    cg.add_argument("--steps", type=_positive_int, default=2000)
    cg.add_argument("--seed", type=_nonneg_int, default=0)
    cg.add_argument("--json", action="store_true", help="print only a JSON list of per-scheme, per-rate results")

    tu = sub.add_parser("tune", help="tune a policy's knobs with Optuna on the cluster simulator")
    tu.add_argument("--policy", default="dlrover_rm")
    tu.add_argument("--trace", default="synthetic", help="trace CSV/Parquet, or 'synthetic' (default)")
    tu.add_argument("--jobs", type=_positive_int, default=400, help="jobs of the synthetic traces (as dlrover simulate)")
    tu.add_argument("--nodes", type=_positive_int, default=40)
    tu.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the synthetic tuning trace and of the simulator")
    tu.add_argument("--holdout", default=None, help="held-out trace to evaluate on (default with a synthetic trace: synthetic, seed + 1000)")
    tu.add_argument("--trials", type=_positive_int, default=30)
    tu.add_argument("--objectives", default="jct", help="comma-separated: jct, cost (several: Pareto front)")
    tu.add_argument("--storage", default=None, help="Optuna storage URL, e.g. sqlite:///tune.db (resumable)")
    tu.add_argument("--study", default=None, help="study name in the storage")
    tu.add_argument("--base", default=None, help="policy YAML to start from (default policies/cluster/<policy>.yaml)")
    tu.add_argument("--out", default="policies/tuned.yaml", help="where the best configuration is written")
    tu.add_argument("--json", action="store_true")

    rp = sub.add_parser("report", help="an HTML report of a finished run: throughput, allocation, memory, model, events")
    rp.add_argument("run_dir")
    rp.add_argument("--out", help="output file (default RUN_DIR/report.html)")
    add_serving_parsers(sub.add_parser)

    b = sub.add_parser("bench", help="benchmarks, printed as ratios against a baseline")
    bsub = b.add_subparsers(dest="bench_cmd", required=True, parser_class=_Parser)
    tp = bsub.add_parser("throughput", help="dlrover (each actor layout that fits the cores) vs single-process TorchRec")
    tp.add_argument("--json", action="store_true")
    tp.add_argument("--rows", type=_positive_int, default=1_000_000, help="at most this many training rows")
    tp.add_argument("--batch-size", type=_positive_int, default=2048)
    tp.add_argument("--steps", type=_positive_int, default=300, help="timed baseline steps; dlrover trains the same rows")
    el = bsub.add_parser("elastic", help="live rescale (plan -> first step, PS migration pause) vs stop-checkpoint-restart")
    el.add_argument("--json", action="store_true")
    el.add_argument("--rows", type=_positive_int, default=1_500_000)
    el.add_argument("--num-embeddings", type=_positive_int, default=400_000, help="rows per table (26 tables of dim 16)")
    rc = bsub.add_parser("recovery", help="fault recovery: partial PS recovery vs rollback vs restart-from-checkpoint (ETTR, detect/recover, replayed, lost)")
    rc.add_argument("--json", action="store_true")
    rc.add_argument("--quick", action="store_true", help="a shorter job with 2 faults (smoke run)")
    ck = bsub.add_parser("checkpoint", help="bytes per durable checkpoint (full, delta, delta+int8) and AUC after an int8 resume")
    ck.add_argument("--json", action="store_true")
    ck.add_argument("--quick", action="store_true", help="smaller tables and data (smoke run)")
    sc = bsub.add_parser("sim-calibration", help="simulator throughput vs real runs of the same configurations on this machine")
    sc.add_argument("--json", action="store_true")
    sc.add_argument("--quick", action="store_true", help="6 configurations, 6 s windows (smoke run)")
    sc.add_argument("--save-profile", help="where the measured profile goes (default benchmarks/profiles/dev_machine.csv)")
    sc.add_argument("--from-profile", help="compare against this saved profile instead of measuring (no Ray)")
    ss = bsub.add_parser("sim-speed", help="simulator speed: 10,000 jobs on 1,000 nodes, jobs simulated per second")
    ss.add_argument("--json", action="store_true")
    ss.add_argument("--jobs", type=_positive_int, default=10_000)
    ss.add_argument("--nodes", type=_positive_int, default=1_000)
    sg = bsub.add_parser("scaling", help="samples/s over a grid of workers x PS (1 CPU each), per-step breakdown, efficiency")
    sg.add_argument("--json", action="store_true")
    sg.add_argument("--quick", action="store_true", help="a few steps per point (smoke run)")
    sg.add_argument("--grid", type=_grid, metavar="WxP,...", help="points to run, e.g. 1x1,2x2 (default: from the machine's cores)")
    sg.add_argument("--steps", type=_positive_int, help="steps per worker at the grid's largest worker count (default 150, 20 with --quick)")
    dn = bsub.add_parser("dense", help="dense exchange: dense PS (1 or more shards) vs gloo allreduce at 1, 2, 4 workers")
    dn.add_argument("--json", action="store_true")
    dn.add_argument("--workers", type=_int_list, default=[1, 2, 4], metavar="N,...", help="worker counts (default 1,2,4)")
    dn.add_argument("--shards", type=_int_list, default=[1, 2], metavar="N,...", help="dense PS shard counts (default 1,2)")
    dn.add_argument("--steps", type=_positive_int, default=40, help="measured steps per worker (default 40)")
    bt = bsub.add_parser("bigtable", help="a 4.4 GB-table job over 4 PS: trains, rescales PS 4->6->4, checkpoints; RSS, pre-copy GB/s, pause")
    bt.add_argument("--json", action="store_true")
    bt.add_argument("--quick", action="store_true", help="tables 100x smaller (smoke run)")
    pm = bsub.add_parser("perf-model", help="measure real configurations, fit the model on some, predict the rest (MAPE)")
    pm.add_argument("--json", action="store_true")
    pm.add_argument("--window-s", type=float, default=12.0, help="measured seconds per configuration")
    pm.add_argument("--repeats", type=_positive_int, default=2, help="times the sweep runs (the spread of a configuration's windows is the noise floor)")
    sp = bsub.add_parser("slow-ps", help="one PS answering late (chaos delay): samples/s before detection and after its replacement vs fault-free, AUC")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--rows", type=_positive_int, default=819_200)
    sp.add_argument("--delay-ms", type=_positive_float, default=50.0, help="added to each pull and push of ps:1 (default 50)")
    ds = bsub.add_parser("dense-sync", help="async vs sync vs coded dense rounds, fault-free and with a slow worker: time, AUC, time to target AUC")
    ds.add_argument("--json", action="store_true")
    ds.add_argument("--rows", type=_positive_int, default=960_000)
    ds.add_argument("--workers", type=_positive_int, default=4)
    ds.add_argument("--slow-factor", type=_number(float, 1.0, True, "a number above 1"), default=4.0, help="how many times slower worker:0 runs (default 4)")
    pl = bsub.add_parser("pal", help="PAL placement vs Ray's default on a loopback cluster with a slow node: where workers land, samples/s")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--rows", type=_positive_int, default=120_000)
    pl.add_argument("--epochs", type=_positive_int, default=4)
    pl.add_argument("--slowdown", type=_number(float, 1.0, True, "a number above 1"), default=3.0, help="how many times the CPU per step workers on the slow node spend (default 3)")
    em = bsub.add_parser("embeddings", help="hashed vs dynamic large tables at equal memory on high-cardinality data: AUC, samples/s, memory, evictions")
    em.add_argument("--json", action="store_true")
    em.add_argument("--quick", action="store_true", help="60k rows, 4k-row tables (smoke run)")
    return p


def cmd_run(args) -> int:
    from dlrover.runner import run_job
    from dlrover.spec import load_spec, parse_overrides

    spec = load_spec(args.spec, parse_overrides(args.set))
    summary, path = run_job(
        spec, runs_dir=args.runs_dir, address=args.address, progress="lines" if args.quiet else "bar", dashboard=args.dashboard, job_id=args.job_id
    )
    _print_result(summary)
    print(f"summary: {path}")
    return 0 if summary["status"] == "succeeded" else 1


def _print_result(s: dict) -> None:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    print(f"job {s['job_id']}: {s['status']}")
    line = f"  auc {f(s.get('auc'), '.4f')}  logloss {f(s.get('logloss'), '.4f')}"
    if s.get("best_auc") is not None:
        line += f"  (generator's best possible auc {s['best_auc']:.4f}, gap {s['best_auc'] - (s.get('auc') or 0):.4f})"
    print(line)
    print(
        f"  throughput {s['throughput_samples_per_s']:,.0f} samples/s  trained {s['samples_trained']:,}/{s['samples_expected']:,}"
        f"  lost {s['samples_lost']}  wall {s['wall_time_s']:.1f}s"
    )
    if s.get("bad_lines_skipped"):
        print(f"  skipped {s['bad_lines_skipped']} malformed lines (data.on_bad_line: skip)")
    plan = s.get("initial_plan") or {}
    if plan.get("stage") == "warm_start":
        print(f"  started: {plan['reason']}")
    for e in s.get("scale_events", []):
        if e["kind"] == "warm_start":
            continue
        extra = f", paused {e['pause_s']:.2f}s" if e.get("pause_s") else ""
        print(f"  {e['kind']} at {e['at_s']:.0f}s: {e['summary']}{extra}" + (f" ({e['error']})" if e.get("error") else ""))
    for x in s.get("failures", []):
        rec = x.get("recovered_s")
        took = f", training again {rec - x['detected_s']:.1f}s later" if rec is not None else ""
        extra = f", rolled back to the {x['checkpoint']['source']} checkpoint of {x['checkpoint']['at_s']:.0f}s" if x.get("checkpoint") else ""
        print(f"  failure {x['kind']} of {x['actor'].rsplit('/', 1)[-1]} at {x['at_s']:.1f}s ({x['cause_class']}): detected after {x['detected_s'] - x['at_s']:.1f}s{took}{extra}")
    if s.get("failures"):
        print(f"  ettr {s['ettr']:.3f}  samples replayed {s.get('samples_replayed', 0):,}  oom kills {s.get('oom_kills', 0)}")
    configs = s.get("configurations") or []
    if len(configs) > 1 or s.get("policy") not in (None, "static"):
        for c in configs:
            pred = f"{c['predicted_throughput']:,.0f}" if c.get("predicted_throughput") else "n/a"
            chosen = f", chosen by {c['stage']}" if c.get("stage") else ""
            print(f"  {c['summary']}: measured {c['measured_throughput']:,.0f} samples/s over {c['duration_s']:.0f}s (model predicted {pred}{chosen})")


def cmd_submit(args) -> int:
    from dlrover.submit import submit

    return submit(args.spec, args.address, args.set, wait=args.wait, runs_dir=args.runs_dir)


def cmd_status(args) -> int:
    from dlrover.status import status

    return status(args.address, args.job, events=args.events)


def cmd_drain(args) -> int:
    from dlrover.drain import drain

    return drain(args.address, args.job, args.node, args.deadline_s)


def cmd_dashboards(args) -> int:
    from dlrover import dashboards

    if args.dash_cmd == "install":
        dashboards.install(args.session_dir)
        return 0
    return dashboards.run_check(args.spec, runs_dir=args.runs_dir)


def cmd_simulate(args) -> int:
    from dlrover.sim.cli import cmd_simulate as run

    return run(args)


def cmd_simulate_coding(args) -> int:
    from dlrover.sim.coding_sim import run_cli

    return run_cli(args)


def cmd_report(args) -> int:
    from dlrover.report import write_report

    print(f"wrote {write_report(args.run_dir, args.out)}")
    return 0


def cmd_tune(args) -> int:
    from dlrover.sim import ClusterSpec, read_trace, synthetic_trace
    from dlrover.sim.tune import print_tune, tune

    def trace_of(what: str, seed: int):
        return synthetic_trace(args.jobs, seed, nodes=args.nodes) if what == "synthetic" else read_trace(what)

    out_dir(os.path.dirname(os.path.abspath(args.out)))
    if args.storage and not args.storage.startswith(("sqlite:///", "postgresql", "mysql")):
        raise DLRoverError(f"--storage {args.storage}: expected an Optuna storage URL such as sqlite:///tune.db")
    trace = trace_of(args.trace, args.seed)
    holdout = args.holdout or ("synthetic" if args.trace == "synthetic" else None)
    held = trace_of(holdout, args.seed + 1000) if holdout else None
    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result = tune(
        args.policy, trace, args.trials, [o.strip() for o in args.objectives.split(",") if o.strip()], storage=args.storage,
        study_name=args.study, base_config=args.base, cluster=ClusterSpec(nodes=args.nodes), seed=args.seed, out=args.out,
        holdout=held, log=log,
    )  # fmt: skip
    print(json.dumps(result.to_dict(), default=float)) if args.json else print_tune(result)
    return 0


# ``dlrover bench NAME``: (module in dlrover.bench, its runner, its printer, the runner's
# keyword arguments from the command line's). sim-calibration and throughput are below.
BENCHES: dict[str, tuple[str, str, str, Callable[[argparse.Namespace], dict]]] = {
    "throughput": ("throughput", "run_throughput_bench", "print_throughput", lambda a: {"rows": a.rows, "batch_size": a.batch_size, "steps": a.steps}),
    "elastic": ("elastic", "run_elastic_bench", "print_elastic", lambda a: {"rows": a.rows, "num_embeddings": a.num_embeddings}),
    "recovery": ("recovery", "run_recovery_bench", "print_recovery", lambda a: {"quick": a.quick}),
    "checkpoint": ("checkpoint", "run_checkpoint_bench", "print_checkpoint", lambda a: {"quick": a.quick}),
    "sim-speed": ("sim_speed", "run_sim_speed", "print_sim_speed", lambda a: {"jobs": a.jobs, "nodes": a.nodes}),
    "scaling": ("scaling", "run_scaling_bench", "print_scaling", lambda a: {"grid": a.grid, "quick": a.quick, "steps": a.steps}),
    "dense": ("dense", "run_dense_bench", "print_dense", lambda a: {"workers": a.workers, "shards": a.shards, "steps": a.steps}),
    "bigtable": ("bigtable", "run_bigtable_bench", "print_bigtable", lambda a: {"quick": a.quick}),
    "perf-model": ("perf_model", "run_perf_model_bench", "print_perf_model", lambda a: {"window_s": a.window_s, "repeats": a.repeats}),
    "embeddings": ("embeddings", "run_embeddings_bench", "print_embeddings", lambda a: {"quick": a.quick}),
    "slow-ps": ("slow_ps", "run_slow_ps_bench", "print_slow_ps", lambda a: {"rows": a.rows, "delay_ms": a.delay_ms}),
    "pal": ("pal", "run_pal_bench", "print_pal", lambda a: {"rows": a.rows, "epochs": a.epochs, "slowdown": a.slowdown}),
    "dense-sync": ("dense_sync", "run_dense_sync_bench", "print_dense_sync", lambda a: {"rows": a.rows, "workers": a.workers, "slow_factor": a.slow_factor}),
}


def cmd_bench(args) -> int:
    import importlib

    if args.bench_cmd in BENCHES:
        module, runner, printer, kwargs = BENCHES[args.bench_cmd]
        mod = importlib.import_module(f"dlrover.bench.{module}")
        result = getattr(mod, runner)(**kwargs(args))
        print(json.dumps(result, default=float)) if args.json else getattr(mod, printer)(result)
        return 0
    if args.bench_cmd == "sim-calibration":
        from dlrover.bench.sim_calibration import calibrate_saved_profile, print_sim_calibration, run_sim_calibration

        if args.from_profile:
            result = calibrate_saved_profile(args.from_profile)
        else:
            result = run_sim_calibration(quick=args.quick, profile_path=args.save_profile)
        print(json.dumps(result, default=float)) if args.json else print_sim_calibration(result)
        return 0
    raise AssertionError(f"bench {args.bench_cmd} has no runner")  # argparse only accepts the ones above


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    args = build_parser().parse_args(argv)
    handler = {"run": cmd_run, "submit": cmd_submit, "status": cmd_status, "drain": cmd_drain, "dashboards": cmd_dashboards, "data": cmd_data, "bench": cmd_bench, "simulate": cmd_simulate, "simulate-coding": cmd_simulate_coding, "tune": cmd_tune, "report": cmd_report, **SERVING_COMMANDS}[args.cmd]
    try:
        return handler(args)
    except DLRoverError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
