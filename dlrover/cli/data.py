"""``dlrover data synth``: its arguments and handler, kept out of ``dlrover.cli.main`` (which
adds them to its parser and dispatch table)."""

from __future__ import annotations

import argparse
from typing import Callable

from dlrover.cli.args import positive_int
from dlrover.errors import DLRoverError


def add_data_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``data synth`` with ``add_parser`` (the CLI's ``subparsers.add_parser``)."""
    d = add_parser("data", help="data utilities")
    dsub = d.add_subparsers(dest="data_cmd", required=True, parser_class=type(d))
    syn = dsub.add_parser("synth", help="write learnable synthetic data (Criteo TSV, or a job spec's features) with a known best AUC")
    syn.add_argument("--out", required=True)
    syn.add_argument("--rows", type=positive_int, default=100_000)
    syn.add_argument("--files", type=positive_int, default=4)
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--gzip", action="store_true")
    syn.add_argument("--high-cardinality", action="store_true", help="4 tables of Zipf ids over --distinct-ids values, every id weighted alike (hashed tables collide)")
    syn.add_argument("--distinct-ids", type=positive_int, help="values per large table with --high-cardinality (default 10,000,000)")
    mh = dsub.add_parser("multihot", help="MLPerf DLRM-DCNv2's multi-hot days (day_*_sparse_multi_hot.npz) from TorchRec's .npy days")
    mh.add_argument("--in", dest="in_dir", required=True, help="a directory of day_*_{labels,dense,sparse}.npy (TorchRec's tsv_to_npys)")
    mh.add_argument("--out", required=True)
    mh.add_argument("--bag-sizes", required=True, type=int_list, help="26 comma-separated bag sizes (MLPerf: 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1)")
    mh.add_argument("--num-embeddings", required=True, type=int_list, help="26 comma-separated table sizes: the ids' range per feature")
    mh.add_argument("--seed", type=int, default=0)
    syn.add_argument("--schema", metavar="SPEC.yaml", help="data for this job spec's features: and data layout (CSV, TSV or Parquet, as its data.format or paths say)")


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def cmd_data(args: argparse.Namespace) -> int:
    if args.data_cmd == "multihot":
        from dlrover.data.npy import write_multi_hot

        days = write_multi_hot(args.in_dir, args.out, args.bag_sizes, args.num_embeddings, args.seed)
        print(f"wrote {len(days)} multi-hot days ({sum(args.bag_sizes)} ids a sample) to {args.out}")
        return 0
    if args.schema is not None:
        if args.high_cardinality or args.gzip:
            raise DLRoverError("--schema: not with --high-cardinality or --gzip")
        from dlrover.data.synth_schema import SchemaSynthConfig, generate_for_schema, synth_format
        from dlrover.spec import load_spec

        spec = load_spec(args.schema)
        info = generate_for_schema(args.out, spec.layout(), SchemaSynthConfig(args.rows, args.files, args.seed), synth_format(spec))
        print(f"wrote {info['rows']:,} rows in {len(info['files'])} files to {args.out}; ctr {info['ctr']:.3f}; best possible auc {info['best_auc']:.4f}")
        return 0
    if args.distinct_ids is not None and not args.high_cardinality:
        raise DLRoverError("--distinct-ids: only with --high-cardinality")
    if args.high_cardinality:
        from dlrover.data.synth_highcard import HighCardConfig, generate_highcard

        cfg = HighCardConfig(rows=args.rows, files=args.files, seed=args.seed, distinct_ids=args.distinct_ids or 10_000_000, gzip=args.gzip)
        info = generate_highcard(args.out, cfg, progress=True)
        seen = ", ".join(f"{n:,}" for n in info["distinct_ids_seen"])
        print(f"wrote {info['rows']:,} rows in {len(info['files'])} files to {args.out}; distinct ids seen per large table {seen}; ctr {info['ctr']:.3f}; best possible auc {info['best_auc']:.4f}")
        return 0
    from dlrover.data.synth import SynthConfig, generate

    info = generate(args.out, SynthConfig(rows=args.rows, files=args.files, seed=args.seed, gzip=args.gzip), progress=True)
    print(f"wrote {info['rows']:,} rows in {len(info['files'])} files to {args.out}; ctr {info['ctr']:.3f}; best possible auc {info['best_auc']:.4f}")
    return 0
