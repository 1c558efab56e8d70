"""``dlrover export``, ``dlrover predict`` and ``dlrover serve``: their arguments and handlers, kept out of
``dlrover.cli.main`` (which adds them to its parser and dispatch table)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable


def add_serving_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the commands with ``add_parser`` (the CLI's ``subparsers.add_parser``)."""
    ex = add_parser("export", help="a finished run's model (its run directory's final.pt, or checkpoint.dir's) as a self-contained directory for serving")
    ex.add_argument("run_dir", help="the job's run directory, runs/<job_id>")
    ex.add_argument("--out", required=True, help="model directory to write (model.json, dense.pt2, tables.pt)")
    pr = add_parser("predict", help="score Criteo rows with an exported model: CSV label,score, one line per row")
    pr.add_argument("model", help="a directory written by dlrover export, or a job's publish.dir")
    pr.add_argument("data", help="data file, glob or directory (TSV, .gz, Parquet)")
    pr.add_argument("--out", required=True, help="CSV to write")
    pr.add_argument("--version", type=int, default=None, help="publish.dir: the version to score with (default: the newest complete one)")
    sv = add_parser("serve", help="an HTTP scoring server over a job's publish.dir, following its new versions")
    sv.add_argument("model", help="a job's publish.dir")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--poll-s", type=float, default=1.0, help="how often to look for a new version")


def cmd_export(args: argparse.Namespace) -> int:
    from dlrover.serving.export import export_run

    print(f"wrote {export_run(args.run_dir, args.out).parent}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from dlrover.serving.predict import predict

    rows = predict(args.model, args.data, args.out, version=args.version)
    print(f"scored {rows:,} rows -> {args.out}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from dlrover.serving.server import serve

    serve(args.model, args.host, args.port, args.poll_s)
    return 0


SERVING_COMMANDS = {"export": cmd_export, "predict": cmd_predict, "serve": cmd_serve}
