"""``dlrover bench NAME``: its arguments and dispatch, kept out of ``dlrover.cli.main`` (which
adds them to its parser and dispatch table)."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from dlrover.cli.args import Parser, int_list, nonneg_int, number, positive_float, positive_int, probability


def grid(v: str) -> list[tuple[int, int]]:
    """An argparse type: ``WxP,...`` (``dlrover bench scaling --grid``)."""
    from dlrover.bench.scaling import parse_grid

    try:
        return parse_grid(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def all_data_formats() -> list[str]:
    """``dlrover bench data``'s rows: each reader's, then ray_data's (through Ray Data)."""
    from dlrover.bench.readers import CASES

    return [c.name for c in CASES] + ["ray_data"]


def data_formats(v: str) -> list[str]:
    """An argparse type: ``NAME,...`` of ``dlrover bench data``'s formats."""
    known = all_data_formats()
    names = [x.strip() for x in v.split(",") if x.strip()]
    if not names or (bad := [n for n in names if n not in known]):
        raise argparse.ArgumentTypeError(f"expected formats among {', '.join(known)}, got {v!r}")
    return names


def add_bench_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``bench`` and its subcommands with ``add_parser`` (the CLI's ``subparsers.add_parser``)."""
    b = add_parser("bench", help="benchmarks, printed as ratios against a baseline")
    bsub = b.add_subparsers(dest="bench_cmd", required=True, parser_class=Parser)
    tp = bsub.add_parser("throughput", help="dlrover (each actor layout that fits the cores) vs single-process TorchRec")
    tp.add_argument("--json", action="store_true")
    tp.add_argument("--rows", type=positive_int, help="at most this many training rows (default 1,000,000)")
    tp.add_argument("--batch-size", type=positive_int, help="default 2048")
    tp.add_argument("--steps", type=positive_int, help="timed baseline steps; dlrover trains the same rows (default 300)")
    tp.add_argument("--job", metavar="SPEC.yaml", help="compare on this job's model, data and batch size instead (one epoch), e.g. jobs/dcn_multihot.yaml")
    el = bsub.add_parser("elastic", help="live rescale (plan -> first step, PS migration pause) vs stop-checkpoint-restart")
    el.add_argument("--json", action="store_true")
    el.add_argument("--rows", type=positive_int, default=1_500_000)
    el.add_argument("--num-embeddings", type=positive_int, default=400_000, help="rows per table (26 tables of dim 16)")
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
    ss.add_argument("--jobs", type=positive_int, default=10_000)
    ss.add_argument("--nodes", type=positive_int, default=1_000)
    sg = bsub.add_parser("scaling", help="samples/s over a grid of workers x PS (1 CPU each), per-step breakdown, efficiency")
    sg.add_argument("--json", action="store_true")
    sg.add_argument("--quick", action="store_true", help="a few steps per point (smoke run)")
    sg.add_argument("--grid", type=grid, metavar="WxP,...", help="points to run, e.g. 1x1,2x2 (default: from the machine's cores)")
    sg.add_argument("--steps", type=positive_int, help="steps per worker at the grid's largest worker count (default 150, 20 with --quick)")
    dn = bsub.add_parser("dense", help="dense exchange: dense PS (1 or more shards) vs gloo allreduce at 1, 2, 4 workers")
    dn.add_argument("--json", action="store_true")
    dn.add_argument("--workers", type=int_list, default=[1, 2, 4], metavar="N,...", help="worker counts (default 1,2,4)")
    dn.add_argument("--shards", type=int_list, default=[1, 2], metavar="N,...", help="dense PS shard counts (default 1,2)")
    dn.add_argument("--steps", type=positive_int, default=40, help="measured steps per worker (default 40)")
    pl_ = bsub.add_parser("ps-lookup", help="CPU of a batch's embedding lookups on 1, 2, 4, 8 PS (in process): all PS, busiest PS, routing, bags updated")
    pl_.add_argument("--json", action="store_true")
    pl_.add_argument("--quick", action="store_true", help="3 batches (smoke run)")
    pl_.add_argument("--ps", type=int_list, default=[1, 2, 4, 8], metavar="N,...", help="PS counts (default 1,2,4,8)")
    bt = bsub.add_parser("bigtable", help="a 4.4 GB-table job over 4 PS: trains, rescales PS 4->6->4, checkpoints; RSS, pre-copy GB/s, pause")
    bt.add_argument("--json", action="store_true")
    bt.add_argument("--quick", action="store_true", help="tables 100x smaller (smoke run)")
    pm = bsub.add_parser("perf-model", help="measure real configurations, fit the model on some, predict the rest (MAPE)")
    pm.add_argument("--json", action="store_true")
    pm.add_argument("--window-s", type=float, default=12.0, help="measured seconds per configuration")
    pm.add_argument("--repeats", type=positive_int, default=2, help="times the sweep runs (the spread of a configuration's windows is the noise floor)")
    sp = bsub.add_parser("slow-ps", help="one PS answering late (chaos delay): samples/s before detection and after its replacement vs fault-free, AUC")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--rows", type=positive_int, default=819_200)
    sp.add_argument("--delay-ms", type=positive_float, default=50.0, help="added to each pull and push of ps:1 (default 50)")
    sl = bsub.add_parser("slow-link", help="a PS behind a slow link (chaos latency): samples/s and AUC at staleness 1 vs adaptive pull-ahead")
    sl.add_argument("--json", action="store_true")
    sl.add_argument("--rows", type=positive_int, default=819_200)
    sl.add_argument("--latency-ms", type=positive_float, default=200.0, help="ps:1's answers this long after each pull (default 200)")
    sl.add_argument("--max-staleness", type=number(int, 1, True, "an integer from 2 to 8", high=8), default=4, help="the adaptive run's bound (default 4)")
    ds = bsub.add_parser("dense-sync", help="async vs sync vs coded dense rounds, fault-free and with a slow worker: time, AUC, time to target AUC")
    ds.add_argument("--json", action="store_true")
    ds.add_argument("--rows", type=positive_int, default=960_000)
    ds.add_argument("--workers", type=positive_int, default=4)
    ds.add_argument("--slow-factor", type=number(float, 1.0, True, "a number above 1"), default=4.0, help="how many times slower worker:0 runs (default 4)")
    cd = bsub.add_parser("coding", help="gradient coding on the real DLRM's gradients, straggler-model clock: time to target AUC per scheme")
    cd.add_argument("--json", action="store_true")
    cd.add_argument("--rows", type=positive_int, default=960_000)
    cd.add_argument("--workers", type=positive_int, default=4, help="workers = data partitions per round")
    cd.add_argument("--stragglers", type=nonneg_int, default=1, help="stragglers tolerated, s < workers")
    cd.add_argument("--d", type=positive_int, help="partitions per cyclic worker (default stragglers + 1)")
    cd.add_argument("--slow-factor", type=number(float, 1.0, True, "a number above 1"), default=4.0, help="how many times slower a slow worker runs (default 4)")
    cd.add_argument("--rate", type=probability, default=0.05, help="the Markov path's straggler rate, active -> slow per round (default 0.05)")
    pl = bsub.add_parser("pal", help="PAL placement vs Ray's default on a loopback cluster with a slow node: where workers land, samples/s")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--rows", type=positive_int, default=120_000)
    pl.add_argument("--epochs", type=positive_int, default=4)
    pl.add_argument("--slowdown", type=number(float, 1.0, True, "a number above 1"), default=3.0, help="how many times the CPU per step workers on the slow node spend (default 3)")
    da = bsub.add_parser("data", help="rows/s of each data reader vs pandas code producing the same arrays, single-threaded; ray_data: through Ray Data vs the file reader")
    da.add_argument("--json", action="store_true")
    da.add_argument("--rows", type=positive_int, default=200_000, help="rows of each format's file (default 200,000)")
    da.add_argument("--repeats", type=positive_int, default=3, help="reads of each side; the best counts (default 3)")
    da.add_argument("--formats", type=data_formats, metavar="NAME,...", help="criteo_tsv, csv_header, parquet_lists, torchrec_npy, mlperf_npz, ray_data (default all)")
    sv = bsub.add_parser("serve", help="dlrover serve's latency at a fixed request rate while 3 versions are applied, and Ray Serve's at the same load")
    sv.add_argument("--json", action="store_true")
    sv.add_argument("--rate", type=positive_float, default=50.0, help="requests a second (default 50)")
    sv.add_argument("--seconds", type=positive_float, default=12.0)
    sv.add_argument("--rows-per-request", type=positive_int, default=8)
    sv.add_argument("--table-rows", type=positive_int, default=100_000, help="rows of each of the 26 tables (default 100,000)")
    pb = bsub.add_parser("publish", help="bytes of a full version and of a delta, and the cut's pause, on a job publishing while it trains")
    pb.add_argument("--json", action="store_true")
    pb.add_argument("--quick", action="store_true", help="small tables (smoke run)")
    em = bsub.add_parser("embeddings", help="hashed vs dynamic large tables at equal memory on high-cardinality data: AUC, samples/s, memory, evictions")
    em.add_argument("--json", action="store_true")
    em.add_argument("--quick", action="store_true", help="60k rows, 4k-row tables (smoke run)")
    em.add_argument("--multi-hot", action="store_true", help="on a click log with string ids and a multi-valued history (mean pooling) instead of Criteo's layout")


# ``dlrover bench NAME``: (module in dlrover.bench, its runner, its printer, the runner's
# keyword arguments from the command line's). sim-calibration is below.
BENCHES: dict[str, tuple[str, str, str, Callable[[argparse.Namespace], dict]]] = {
    "throughput": ("throughput", "run_throughput_bench", "print_throughput", lambda a: {"rows": a.rows, "batch_size": a.batch_size, "steps": a.steps, "job": a.job}),
    "elastic": ("elastic", "run_elastic_bench", "print_elastic", lambda a: {"rows": a.rows, "num_embeddings": a.num_embeddings}),
    "recovery": ("recovery", "run_recovery_bench", "print_recovery", lambda a: {"quick": a.quick}),
    "checkpoint": ("checkpoint", "run_checkpoint_bench", "print_checkpoint", lambda a: {"quick": a.quick}),
    "sim-speed": ("sim_speed", "run_sim_speed", "print_sim_speed", lambda a: {"jobs": a.jobs, "nodes": a.nodes}),
    "scaling": ("scaling", "run_scaling_bench", "print_scaling", lambda a: {"grid": a.grid, "quick": a.quick, "steps": a.steps}),
    "dense": ("dense", "run_dense_bench", "print_dense", lambda a: {"workers": a.workers, "shards": a.shards, "steps": a.steps}),
    "bigtable": ("bigtable", "run_bigtable_bench", "print_bigtable", lambda a: {"quick": a.quick}),
    "ps-lookup": ("ps_lookup", "run_ps_lookup_bench", "print_ps_lookup", lambda a: {"ps_counts": a.ps, "quick": a.quick}),
    "perf-model": ("perf_model", "run_perf_model_bench", "print_perf_model", lambda a: {"window_s": a.window_s, "repeats": a.repeats}),
    "data": ("readers", "run_data_bench", "print_data", lambda a: {"rows": a.rows, "repeats": a.repeats, "formats": a.formats or all_data_formats()}),
    "embeddings": ("embeddings", "run_embeddings_bench", "print_embeddings", lambda a: {"quick": a.quick, "multi_hot": a.multi_hot}),
    "slow-ps": ("slow_ps", "run_slow_ps_bench", "print_slow_ps", lambda a: {"rows": a.rows, "delay_ms": a.delay_ms}),
    "pal": ("pal", "run_pal_bench", "print_pal", lambda a: {"rows": a.rows, "epochs": a.epochs, "slowdown": a.slowdown}),
    "coding": ("coding", "run_coding_bench", "print_coding", lambda a: {
        "rows": a.rows, "workers": a.workers, "stragglers": a.stragglers, "d": a.d, "slow_factor": a.slow_factor, "rate": a.rate}),
    "slow-link": ("slow_link", "run_slow_link_bench", "print_slow_link", lambda a: {"rows": a.rows, "latency_ms": a.latency_ms, "max_staleness": a.max_staleness}),
    "serve": ("serving", "run", "print_serve", lambda a: {"rate": a.rate, "seconds": a.seconds, "rows_per_request": a.rows_per_request, "table_rows": a.table_rows}),
    "publish": ("publish", "run_publish_bench", "print_publish", lambda a: {"quick": a.quick}),
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
