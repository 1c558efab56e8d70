"""``dlrover bench data``: rows/s of each reader against pandas code producing the same arrays,
and (the ``ray_data`` row) of a ray_data job's reading against the file reader's.

For each layout a job can train on (Criteo's TSV, a CSV with a header and string ids, a
Parquet file with list columns, TorchRec's ``.npy`` days, MLPerf's multi-hot ``.npz``),
one file is written, then read twice, single-threaded (``pyarrow.set_cpu_count(1)``):

- **dlrover**: what a worker does, the file indexed once and then read shard by shard
  (``shard_rows`` rows a read) by :class:`~dlrover.data.reader.FileReader`;
- **reference**: what a user would write with pandas (``read_csv``, ``read_parquet``,
  ``numpy.load``), the whole file at once, turned into the same arrays: float32 labels,
  the dense matrix transformed as the schema says, and each sparse feature's ids
  (hashed with ``pandas.util.hash_array`` for string ids) and bag lengths.

The ``ray_data`` row reads the Parquet file through ``ray.data.read_parquet`` (blocks in
Ray's object store, parsed as a worker parses a block's shard) against the file reader.
Both outputs are compared (labels, dense, every feature's ids and lengths) before a time
counts, so the reference does the same work. Each side's best of ``repeats`` runs counts
(the files are in the page cache after the first).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.layout import CRITEO_LAYOUT, DataLayout
from dlrover.data.schema import CRITEO_DENSE, CRITEO_SPARSE, IdKind, Schema, Transform
from dlrover.errors import DLRoverError
from dlrover.spec import spec_from_dict

_ID_MASK = np.uint64(0x7FFF_FFFF_FFFF_FFFF)
T = TypeVar("T")
MLPERF_BAGS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


@dataclass
class Arrays:
    """What a reader produces, in one form for both sides: labels, dense, per feature
    (ids, lengths)."""

    labels: np.ndarray
    dense: np.ndarray
    bags: list[tuple[np.ndarray, np.ndarray]]

    @property
    def ids(self) -> int:
        return sum(len(ids) for ids, _ in self.bags)

    @staticmethod
    def of(batches: list[Batch]) -> "Arrays":
        b = Batch.concat(batches)
        ids, lengths = b.jagged()
        per = np.split(ids, np.cumsum(lengths.sum(axis=1))[:-1])
        return Arrays(b.labels, b.dense, list(zip(per, list(lengths))))


def check_same(fmt: str, ours: Arrays, ref: Arrays, schema: Schema) -> None:
    """Raise unless the two readers produced the same arrays (so the times compare)."""
    names = schema.feature_names
    problems = []
    if not np.array_equal(ours.labels, ref.labels):
        problems.append("labels")
    if ours.dense.shape != ref.dense.shape or not np.allclose(ours.dense, ref.dense, rtol=1e-6, atol=1e-6):
        problems.append("dense")
    for name, (ids, lens), (rids, rlens) in zip(names, ours.bags, ref.bags):
        if not (np.array_equal(lens, rlens) and np.array_equal(ids, rids)):
            problems.append(name)
    if problems:
        raise DLRoverError(f"bench data: {fmt}: dlrover and the reference disagree on {', '.join(problems)}")


def _dense(values: np.ndarray, schema: Schema) -> np.ndarray:
    """[N, D] float64 raw values (NaN missing) -> the schema's dense input."""
    if not schema.dense:
        return np.ones((len(values), 1), np.float32)
    out = np.nan_to_num(values, nan=0.0)
    for j, d in enumerate(schema.dense):
        if d.transform is Transform.LOG1P:
            out[:, j] = np.log1p(np.maximum(out[:, j], 0))
    return out.astype(np.float32)


def _hash(values: np.ndarray) -> np.ndarray:
    import pandas as pd

    return (pd.util.hash_array(values.astype(object), categorize=True) & _ID_MASK).astype(np.int64)


def reference_delimited(path: str, layout: DataLayout) -> Arrays:
    """pandas.read_csv (C engine) of a CSV with a header, then numpy and pandas' hash."""
    import pandas as pd

    s = layout.schema
    text = {f.column: str for f in s.sparse}
    df = pd.read_csv(path, sep=layout.sep(path), dtype=text, keep_default_na=False, na_values={c.column: [""] for c in s.dense})
    dense = _dense(df[s.dense_columns].to_numpy(np.float64) if s.dense else np.zeros((len(df), 0)), s)
    bags = []
    for f in s.sparse:
        col = df[f.column]
        if f.multi:
            parts = col.str.split(f.separator, regex=False).str[: f.max_len].explode()
            rows = parts.index.to_numpy()
            values = parts.to_numpy(dtype=object)
        else:
            rows, values = np.arange(len(col)), col.to_numpy(dtype=object)
        keep = pd.notna(values) & (values != "")
        values, rows = values[keep], rows[keep]
        ids = values.astype(np.int64) if f.ids is IdKind.INT else _hash(values)
        bags.append((ids, np.bincount(rows, minlength=len(df)).astype(np.int32)))
    return Arrays(df[s.label.column].to_numpy(np.float32), dense, bags)


def reference_criteo_tsv(path: str, layout: DataLayout) -> Arrays:
    """pandas.read_csv of Criteo's TSV; hex ids by ``int(v, 16)`` (pandas has no
    vectorised hex parse), a missing id 0."""
    import pandas as pd

    names = ["label", *CRITEO_DENSE, *CRITEO_SPARSE]
    df = pd.read_csv(path, sep="\t", header=None, names=names, dtype={c: str for c in CRITEO_SPARSE}, keep_default_na=False, na_values={c: [""] for c in CRITEO_DENSE})
    dense = np.log1p(np.maximum(df[CRITEO_DENSE].fillna(0).to_numpy(np.int64), 0).astype(np.float32))
    ones = np.ones(len(df), np.int32)
    bags = [(np.array([int(v, 16) if v else 0 for v in df[c].tolist()], np.int64), ones) for c in CRITEO_SPARSE]
    return Arrays(df["label"].to_numpy(np.float32), dense, bags)


def reference_parquet(path: str, layout: DataLayout) -> Arrays:
    """pandas.read_parquet; a list column's bags cut to max_len and concatenated."""
    import pandas as pd

    s = layout.schema
    df = pd.read_parquet(path, columns=list(s.columns))
    dense = _dense(df[s.dense_columns].to_numpy(np.float64) if s.dense else np.zeros((len(df), 0)), s)
    bags = []
    for f in s.sparse:
        col = df[f.column]
        if f.multi:
            cut = [np.asarray(v[: f.max_len] if v is not None else [], np.int64) for v in col.to_numpy()]
            bags.append((np.concatenate(cut), np.array([len(v) for v in cut], np.int32)))
        else:
            keep = col.notna().to_numpy()
            bags.append((col[keep].to_numpy().astype(np.int64), keep.astype(np.int32)))
    return Arrays(df[s.label.column].to_numpy(np.float32), dense, bags)


def reference_npy(stem: str, layout: DataLayout) -> Arrays:
    """numpy.load of a day's arrays (``.npz`` members when there), read whole."""
    labels = np.load(f"{stem}_labels.npy").reshape(-1).astype(np.float32)
    dense = np.load(f"{stem}_dense.npy").astype(np.float32)
    npz = f"{stem}_sparse_multi_hot.npz"
    if os.path.isfile(npz):
        with np.load(npz) as z:
            members = [z[str(j)] for j in range(len(CRITEO_SPARSE))]
        bags = [(m.reshape(-1).astype(np.int64), np.full(len(labels), m.shape[1], np.int32)) for m in members]
    else:
        sparse = np.load(f"{stem}_sparse.npy")
        bags = [(sparse[:, j].astype(np.int64), np.ones(len(labels), np.int32)) for j in range(sparse.shape[1])]
    return Arrays(labels, dense, bags)


def read_ours(path: str, layout: DataLayout, shard_rows: int) -> list[Batch]:
    """A worker's reads: index the file, then every shard of it (a batch each)."""
    from dlrover.data.criteo import index_file
    from dlrover.data.reader import FileReader

    index = index_file(path, layout=layout)
    reader = FileReader(layout=layout)
    return [reader.read(index, a, min(a + shard_rows, index.rows))[0] for a in range(0, index.rows, shard_rows)]


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # the file, in words
    reference: str  # the reference code, in words
    make: Callable[[str, int], tuple[str, DataLayout]]  # (work dir, rows) -> (path, layout)
    read_reference: Callable[[str, DataLayout], Arrays]


def layout_for(features: dict, fmt: str, tables: dict | None = None, num_embeddings: int = 100_000) -> DataLayout:
    """The data layout of a ``features:`` section in files of format ``fmt``."""
    doc = {"features": features, "model": {"num_embeddings": num_embeddings, "tables": tables or {}}, "data": {"paths": ["unused"], "format": fmt}}
    return spec_from_dict(doc, "bench data").layout()


def _criteo_tsv(work: str, rows: int) -> tuple[str, DataLayout]:
    from dlrover.data.synth import SynthConfig, generate

    out = os.path.join(work, "criteo")
    generate(out, SynthConfig(rows=rows, files=1, seed=3), progress=False)
    return os.path.join(out, "part-00000.tsv"), CRITEO_LAYOUT


CSV_FEATURES = {
    "label": "click", "dense": ["price", "age_days"],
    "sparse": ["site_id", "site_domain", "app_id", {"column": "genres", "separator": "|", "max_len": 8},
               {"column": "device_model", "table": "device", "ids": "string"}, {"column": "device_make", "table": "device", "ids": "string"},
               {"column": "user_id", "ids": "int"}],
}  # fmt: skip


def _schema_file(work: str, rows: int, name: str, features: dict, fmt: str, fixed: bool = False) -> tuple[str, DataLayout]:
    from dlrover.data.synth_schema import SchemaSynthConfig, generate_for_schema

    layout = layout_for(features, fmt)
    out = os.path.join(work, name)
    generate_for_schema(out, layout, SchemaSynthConfig(rows, 1, 3, fixed), fmt)
    return os.path.join(out, f"part-00000.{fmt}"), layout


PARQUET_FEATURES = {
    "label": "label", "dense": list(CRITEO_DENSE),
    "sparse": [{"column": c, "ids": "int", **({"max_len": n} if n > 1 else {})} for c, n in zip(CRITEO_SPARSE, MLPERF_BAGS)],
}  # fmt: skip


def _npy_day(work: str, rows: int, multi_hot: bool) -> tuple[str, DataLayout]:
    """A day in TorchRec's preprocessed layout (labels int32 [N, 1], dense float32 [N, 13],
    sparse int32 [N, 26]), and with ``multi_hot`` MLPerf's ``.npz`` beside it."""
    from dlrover.data.npy import write_multi_hot

    rng = np.random.default_rng(3)
    out = os.path.join(work, "npy")
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "day_0_labels.npy"), rng.integers(0, 2, (rows, 1), dtype=np.int32))
    np.save(os.path.join(out, "day_0_dense.npy"), rng.normal(0, 1, (rows, len(CRITEO_DENSE))).astype(np.float32))
    np.save(os.path.join(out, "day_0_sparse.npy"), rng.integers(0, 1 << 20, (rows, len(CRITEO_SPARSE)), dtype=np.int32))
    if not multi_hot:
        return os.path.join(out, "day_0"), layout_for({"label": "label", "dense": list(CRITEO_DENSE), "sparse": list(CRITEO_SPARSE)}, "torchrec_npy")
    mh = os.path.join(work, "multihot")
    write_multi_hot(out, mh, MLPERF_BAGS, [100_000] * len(CRITEO_SPARSE))
    features = {"label": "label", "dense": list(CRITEO_DENSE), "sparse": [{"column": c, **({"max_len": n} if n > 1 else {})} for c, n in zip(CRITEO_SPARSE, MLPERF_BAGS)]}
    return os.path.join(mh, "day_0"), layout_for(features, "torchrec_npy")


CASES = [
    Case("criteo_tsv", "Criteo TSV, hex ids", "pandas.read_csv + int(v, 16)", _criteo_tsv, reference_criteo_tsv),
    Case("csv_header", "CSV with a header, string ids, a '|' multi-valued column", "pandas.read_csv + str.split + pandas.util.hash_array",
         lambda w, n: _schema_file(w, n, "csv", CSV_FEATURES, "csv"), reference_delimited),
    Case("parquet_lists", "Parquet, 13 dense, 26 int columns (list<int64> in MLPerf's bag sizes, 0..max_len ids)", "pandas.read_parquet + numpy",
         lambda w, n: _schema_file(w, n, "parquet", PARQUET_FEATURES, "parquet"), reference_parquet),
    Case("torchrec_npy", "TorchRec .npy day (single-hot)", "numpy.load", lambda w, n: _npy_day(w, n, False), reference_npy),
    Case("mlperf_npz", "MLPerf multi-hot .npz day (214 ids a row)", "numpy.load", lambda w, n: _npy_day(w, n, True), reference_npy),
]  # fmt: skip


def _best(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return best, out


def read_through_ray_data(path: str, layout: DataLayout, shard_rows: int) -> list[Batch]:
    """What a ray_data job does with the same file: ``ray.data.read_parquet`` streams its
    blocks through Ray's object store (decoded in a Ray task, one CPU), and each block's
    rows are read shard by shard as a worker reads them (``block_rows``), in file order."""
    import ray
    import ray.data

    from dlrover.data.ray_source import block_rows, limit_cpus, quiet

    ds = ray.data.read_parquet(path)
    ds.context.execution_options.preserve_order = True
    limit_cpus(ds.context, 1.0)
    quiet(ds.context)
    out = []
    for bundle in ds.iter_internal_ref_bundles():
        for entry, piece in zip(bundle.blocks, bundle.slices):
            table = ray.get(entry.ref)
            start, stop = (0, table.num_rows) if piece is None else (piece.start_offset, piece.end_offset)
            out += [block_rows(table, layout, "block", a, min(stop, a + shard_rows))[0] for a in range(start, stop, shard_rows)]
    return out


def ray_data_row(work: str, rows: int, repeats: int, shard_rows: int) -> dict:
    """The ray_data row: rows/s through Ray Data against dlrover's file reader on the same
    Parquet file (the parquet_lists case's), both measured here; the same arrays checked."""
    import ray

    case = next(c for c in CASES if c.name == "parquet_lists")
    print(f"[bench] ray_data: writing {rows:,} rows ({case.what}); Ray Data against the file reader", file=sys.stderr, flush=True)
    path, layout = case.make(os.path.join(work, "ray_data"), rows)
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        t_files, files = _best(lambda: read_ours(path, layout, shard_rows), repeats)
        t_ray, batches = _best(lambda: read_through_ray_data(path, layout, shard_rows), repeats)
    finally:
        if started:
            ray.shutdown()
    ours, ref = Arrays.of(batches), Arrays.of(files)
    check_same("ray_data", ours, ref, layout.schema)
    return {"format": "ray_data", "file": f"{case.what}, through ray.data.read_parquet", "reference": "dlrover's file reader on the same file",
            "rows": len(ours.labels), "ids": ours.ids, "bytes": os.path.getsize(path),
            "dlrover_rows_per_s": len(ours.labels) / t_ray, "reference_rows_per_s": len(ref.labels) / t_files, "ratio": t_files / t_ray}  # fmt: skip


def run_data_bench(rows: int = 200_000, repeats: int = 3, shard_rows: int = 32_768, formats: list[str] | None = None) -> dict:
    """Each format's row (``formats``: those named, default every reader's) and, when
    ``ray_data`` is named, the ray_data row. ``min_ratio``: of the readers against pandas."""
    import pyarrow as pa

    known = [c.name for c in CASES] + ["ray_data"]
    unknown = sorted(set(formats or []) - set(known))
    if unknown:
        raise DLRoverError(f"bench data: unknown format {unknown[0]!r} (one of {', '.join(known)})")
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    work = tempfile.mkdtemp(prefix="dlrover-bench-data-")
    out = []
    try:
        for case in CASES:
            if formats and case.name not in formats:
                continue
            print(f"[bench] {case.name}: writing {rows:,} rows ({case.what})", file=sys.stderr, flush=True)
            path, layout = case.make(work, rows)
            size = sum(os.path.getsize(os.path.join(os.path.dirname(path), f)) for f in os.listdir(os.path.dirname(path)) if f.startswith(os.path.basename(path)))
            t_ref, ref = _best(lambda: case.read_reference(path, layout), repeats)
            t_ours, batches = _best(lambda: read_ours(path, layout, shard_rows), repeats)
            ours = Arrays.of(batches)  # (untimed: the worker trains on the batches as they are)
            check_same(case.name, ours, ref, layout.schema)
            row = {"format": case.name, "file": case.what, "reference": case.reference, "rows": len(ours.labels), "ids": ours.ids, "bytes": size,
                   "dlrover_rows_per_s": len(ours.labels) / t_ours, "reference_rows_per_s": len(ref.labels) / t_ref, "ratio": t_ref / t_ours}  # fmt: skip
            print(f"[bench]   dlrover {row['dlrover_rows_per_s']:,.0f} rows/s, reference {row['reference_rows_per_s']:,.0f} rows/s: {row['ratio']:.2f}x", file=sys.stderr, flush=True)
            out.append(row)
        readers = list(out)
        if formats and "ray_data" in formats:
            out.append(ray_data_row(work, rows, repeats, shard_rows))
            print(f"[bench]   ray_data {out[-1]['dlrover_rows_per_s']:,.0f} rows/s, file reader {out[-1]['reference_rows_per_s']:,.0f} rows/s: {out[-1]['ratio']:.2f}x", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"rows": rows, "repeats": repeats, "shard_rows": shard_rows, "threads": 1, "formats": out, "min_ratio": min((r["ratio"] for r in readers), default=None)}


def print_data(r: dict) -> None:
    print(f"{r['rows']:,} rows a file, single-threaded, best of {r['repeats']}; dlrover reads shards of {r['shard_rows']:,} rows")
    print(f"{'format':15s}{'MB':>7s}{'ids/row':>9s}{'dlrover rows/s':>16s}{'reference rows/s':>18s}{'ratio':>7s}  reference")
    for x in r["formats"]:  # the ray_data row: "dlrover" is through Ray Data, the reference dlrover's file reader
        print(f"{x['format']:15s}{x['bytes'] / 2**20:>7.1f}{x['ids'] / x['rows']:>9.1f}{x['dlrover_rows_per_s']:>16,.0f}{x['reference_rows_per_s']:>18,.0f}{x['ratio']:>6.2f}x  {x['reference']}")
