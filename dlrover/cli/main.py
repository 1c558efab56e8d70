"""``dlrover`` command line: run | submit | status | dashboards | data synth | simulate | simulate-coding | tune | report | export | predict | serve | bench ....

User errors (bad spec, data or arguments) print one ``error:`` line and exit 2; a bug keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, TextIO

from dlrover.cli.args import EXIT_USER_ERROR, Parser, nonneg_float, nonneg_int, positive_float, positive_int, tick_s
from dlrover.cli.bench import add_bench_parsers, cmd_bench
from dlrover.cli.data import add_data_parsers, cmd_data
from dlrover.cli.serving import SERVING_COMMANDS, add_serving_parsers
from dlrover.errors import DLRoverError, SpecError
from dlrover.paths import out_dir
from dlrover.resource.configs import describe_change
from dlrover.runlogs.records import JobSummary
from dlrover.runlogs.scale_record import ScaleKind

if TYPE_CHECKING:
    from dlrover.spec import JobSpec

DEFAULT_DASHBOARD = "http://127.0.0.1:8265"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dlrover", description="Elastic DLRM training on Ray.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)

    r = sub.add_parser("run", help="train a job spec (embedded local Ray unless --address)")
    r.add_argument("spec", nargs="?")
    r.add_argument("--spec-env", help=argparse.SUPPRESS)  # a submitted job's spec, as JSON in this variable
    r.add_argument("--address", help="Ray cluster address (default: start a local Ray on 127.0.0.1)")
    r.add_argument("--runs-dir", default="runs")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field, e.g. data.epochs=2")
    r.add_argument("--dashboard", action="store_true", help="start the Ray dashboard with the embedded cluster")
    r.add_argument("--quiet", action="store_true", help="no progress bar: progress lines every few seconds (the default when stderr is not a terminal)")
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
    st.add_argument("--events", type=nonneg_int, default=10, help="how many of the job's last events to show")

    dr = sub.add_parser("drain", help="move a job's actors off a node before it goes away (asks Ray to drain it)")
    dr.add_argument("job", help="the job id (its master is the actor <job>/master)")
    dr.add_argument("--node", required=True, help="the Ray node id (hex, as `ray list nodes` shows it)")
    dr.add_argument("--deadline-s", type=float, help="seconds until the node goes away (default: none)")
    dr.add_argument("--address", required=True, help="the Ray cluster (GCS address, as for `ray start --address`)")

    db = sub.add_parser("dashboards", help="the Grafana dashboard: check it against a real job, or install it next to Ray's")
    dbsub = db.add_subparsers(dest="dash_cmd", required=True, parser_class=Parser)
    dc = dbsub.add_parser("check", help="Ray head + Prometheus + a short job: every dashboard query must return data")
    dc.add_argument("--spec", default="jobs/observe.yaml")
    dc.add_argument("--runs-dir", default="runs")
    di = dbsub.add_parser("install", help="copy dashboards/dlrover.json next to the Grafana dashboards Ray wrote for a session")
    di.add_argument("--session-dir", default="/tmp/ray/session_latest")

    add_data_parsers(sub.add_parser)

    sim = sub.add_parser("simulate", help="compare allocation policies on a job trace in the cluster simulator")
    sim.add_argument("--trace", default="synthetic", help="trace CSV/Parquet, 'synthetic' (default), or 'diurnal' (one job following a day/night stream: the stream stage vs a static allocation sized for the peak)")
    sim.add_argument("--jobs", type=positive_int, default=400, help="jobs of the synthetic trace")
    sim.add_argument("--nodes", type=positive_int, default=40)
    sim.add_argument("--node-cpu", type=positive_float, default=64.0)
    sim.add_argument("--node-memory-gb", type=positive_float, default=256.0)
    sim.add_argument("--seed", type=nonneg_int, default=0)
    sim.add_argument("--policies", default="static,dlrover_rm", help="comma-separated names or policy YAML files, each optionally +pal")
    sim.add_argument("--tick", type=tick_s, default=300.0, help="seconds between a job's policy decisions (>= 1)")
    sim.add_argument("--truth", default="profile", help="ground truth: model, saturating, profile (comma-separated: several)")
    sim.add_argument("--seeds", type=positive_int, default=1, help="synthetic traces of seeds --seed.. (mean and spread)")
    sim.add_argument("--failure-rate", type=nonneg_float, default=6.5e-3, help="node failures per node-day (RSC-1: 6.5e-3)")
    sim.add_argument("--no-failures", action="store_true")
    sim.add_argument("--no-stragglers", action="store_true")
    sim.add_argument("--json", action="store_true", help="print only a JSON list of per-policy metrics")
    sim.add_argument("--out", help="directory for CSV and PNG outputs (default runs/sim-<time>)")

    cg = sub.add_parser("simulate-coding", help="gradient coding schemes under slow/active stragglers: step time, decoding error (no Ray)")
    cg.add_argument("--workers", type=positive_int, default=12, help="workers = data partitions")
    cg.add_argument("--stragglers", type=nonneg_int, default=2, help="stragglers tolerated, s < workers")
    cg.add_argument("--rates", default="0.01,0.05,0.1,0.2", help="straggler rates (active -> slow per step), comma-separated")
    cg.add_argument("--d", type=positive_int, help="partitions per cyclic worker (default stragglers + 1)")
    cg.add_argument("--slow-factor", type=positive_float, default=0.4, help="speed of a slow node (0 < f <= 1)")
    cg.add_argument("--steps", type=positive_int, default=2000)
    cg.add_argument("--seed", type=nonneg_int, default=0)
    cg.add_argument("--json", action="store_true", help="print only a JSON list of per-scheme, per-rate results")

    tu = sub.add_parser("tune", help="tune a policy's knobs with Optuna on the cluster simulator")
    tu.add_argument("--policy", default="dlrover_rm")
    tu.add_argument("--trace", default="synthetic", help="trace CSV/Parquet, or 'synthetic' (default)")
    tu.add_argument("--jobs", type=positive_int, default=400, help="jobs of the synthetic traces (as dlrover simulate)")
    tu.add_argument("--nodes", type=positive_int, default=40)
    tu.add_argument("--seed", type=nonneg_int, default=0, help="seed of the synthetic tuning trace and of the simulator")
    tu.add_argument("--holdout", default=None, help="held-out trace to evaluate on (default with a synthetic trace: synthetic, seed + 1000)")
    tu.add_argument("--trials", type=positive_int, default=30)
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

    add_bench_parsers(sub.add_parser)
    return p


def progress_mode(quiet: bool, stderr: TextIO) -> str:
    """A progress bar on a terminal; lines with ``--quiet`` or when stderr goes to a file
    or a pipe, where a bar's redraws would fill the log with carriage returns."""
    return "bar" if not quiet and stderr.isatty() else "lines"


def cmd_run(args) -> int:
    from dlrover.api.running import run

    result = run(
        job_spec(args), runs_dir=args.runs_dir, address=args.address, progress=progress_mode(args.quiet, sys.stderr), dashboard=args.dashboard, job_id=args.job_id
    )
    _print_result(result)
    print(f"summary: {result.run_dir / 'summary.json'}")
    return 0 if result.status == "succeeded" else 1


def job_spec(args) -> "JobSpec":
    """The spec a command names (a YAML path, ``--set`` overrides), or the one a submitted
    job's entrypoint finds in its environment (``--spec-env``)."""
    from dlrover.spec import JobSpec, parse_overrides, spec_from_dict

    if getattr(args, "spec_env", None):
        if args.spec or args.set:
            raise SpecError("--spec-env: takes neither a spec path nor --set")
        return spec_from_dict(json.loads(os.environ[args.spec_env]), f"${args.spec_env}")
    if not args.spec:
        raise SpecError(f"{args.cmd}: a job spec (YAML path) is required")
    return JobSpec.from_yaml(args.spec, parse_overrides(args.set))


def _print_result(s: JobSummary) -> None:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    print(f"job {s.job_id}: {s.status}" + (f": {s.reason}" if s.reason else ""))
    line = f"  auc {f(s.auc, '.4f')}  logloss {f(s.logloss, '.4f')}"
    if s.best_auc is not None:
        line += f"  (generator's best possible auc {s.best_auc:.4f}, gap {s.best_auc - (s.auc or 0):.4f})"
    print(line)
    print(
        f"  throughput {s.throughput_samples_per_s:,.0f} samples/s  trained {s.samples_trained:,}/{s.samples_expected:,}"
        f"  lost {s.samples_lost}  wall {s.wall_time_s:.1f}s"
    )
    if s.bad_lines_skipped:
        print(f"  skipped {s.bad_lines_skipped} malformed lines (data.on_bad_line: skip)")
    if s.initial_plan.get("stage") == "warm_start":
        print(f"  started: {s.initial_plan['reason']}")
    for e in s.scale_events:
        if e.kind is ScaleKind.WARM_START:
            continue
        pause = e.timings.get("pause_s")
        extra = f", paused {pause:.2f}s" if pause else ""
        print(f"  {e.kind.value} at {e.at_s:.0f}s: {describe_change(e.old, e.new)}{extra}" + (f" ({e.error})" if e.error else ""))
    for x in s.failures:
        took = f", training again {x.recovered_s - x.detected_s:.1f}s later" if x.recovered_s is not None else ""
        extra = f", rolled back to the {x.checkpoint.source} checkpoint of {x.checkpoint.at_s:.0f}s" if x.checkpoint else ""
        print(
            f"  failure {x.kind.value} of {x.actor.rsplit('/', 1)[-1]} at {x.at_s:.1f}s ({x.cause_class.value}): "
            f"detected after {x.detected_s - x.at_s:.1f}s{took}{extra}"
        )
    if s.failures:
        print(f"  ettr {s.ettr:.3f}  samples replayed {s.samples_replayed:,}  oom kills {s.oom_kills}")
    if len(s.configurations) > 1 or s.policy not in ("", "static"):
        for c in s.configurations:
            pred = f"{c['predicted_throughput']:,.0f}" if c.get("predicted_throughput") else "n/a"
            chosen = f", chosen by {c['stage']}" if c.get("stage") else ""
            print(f"  {c['summary']}: measured {c['measured_throughput']:,.0f} samples/s over {c['duration_s']:.0f}s (model predicted {pred}{chosen})")


def cmd_submit(args) -> int:
    from dlrover.api.jobs import submit

    job = submit(job_spec(args), args.address, runs_dir=args.runs_dir)
    print(f"submitted {job.job_id} to {args.address}")
    if not args.wait:
        print(f"follow with: ray job logs -f {job.job_id} --address {args.address}")
        print(f"status with: dlrover status {job.job_id} --address {args.address}")
        return 0
    status = job.wait(out=sys.stdout)
    print(f"job {job.job_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


def cmd_status(args) -> int:
    from dlrover.driver.status import status

    return status(args.address, args.job, events=args.events)


def cmd_drain(args) -> int:
    from dlrover.driver.drain_request import drain

    return drain(args.address, args.job, args.node, args.deadline_s)


def cmd_dashboards(args) -> int:
    from dlrover.driver import dashboards

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
    from dlrover.runlogs.report import write_report

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
