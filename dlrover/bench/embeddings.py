"""``dlrover bench embeddings``: hashed vs dynamic large tables at equal memory, on
high-cardinality data: Criteo's layout (:mod:`dlrover.data.synth_highcard`) or, with
``--multi-hot``, a click log of string ids with a multi-valued history pooled by mean
(:mod:`dlrover.data.synth_clicklog`).

Two real jobs (1 worker + 1 PS) train the same DLRM on the same rows; only the large
tables differ. The dynamic job gives each ``capacity`` rows (fewer than the ids it
admits, so that eviction runs throughout) and an id map; the
hashed job gives each the rows the same bytes buy: a dynamic row costs its weights and
optimizer state plus the map (``MAP_STATES`` int64 per row) plus the PS's sorted key
indexes (two int64 each for the admitted and the waiting id a row position holds), so
the hashed tables get ``(row + map) / row`` times the rows. Reported: held-out AUC (and
the generator's best), samples/s, table bytes and the PS's measured peak RSS, and the
dynamic tables' hit/default/admit/evict counts from the job summary.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass

from dlrover.bench.progress import JobProgress
from dlrover.errors import DLRoverError
from dlrover.runlogs.records import JobSummary
from dlrover.spec import JobSpec, spec_from_dict

DIM = 16
SMALL_ROWS = 4096  # the other tables (vocabularies of at most 1,000): hashed in both jobs
INDEX_INT64 = 2  # the sorted index of admitted ids: keys and positions
MAP_BYTES_PER_ROW = (6 + INDEX_INT64) * 8  # MAP_STATES int64 + the key indexes
SPARSE_LR = 0.05


@dataclass
class EmbeddingsBenchConfig:
    rows: int
    distinct_ids: int  # Criteo: values of each large table; click log: items (users: half)
    large: int  # the high-cardinality tables (dynamic in one job)
    capacity: int  # rows of each large table in the dynamic job
    batch_size: int
    admit_after: int = 1
    eviction: str = "lfu"
    seed: int = 23
    data: str = "criteo"  # criteo: synth_highcard's TSV; clicklog: string ids, a multi-hot history (synth_clicklog)


# capacities below the ids each large table admits, so that eviction runs all along
FULL = EmbeddingsBenchConfig(rows=2_000_000, distinct_ids=10_000_000, large=4, capacity=32_768, batch_size=2048)
QUICK = EmbeddingsBenchConfig(rows=60_000, distinct_ids=10_000_000, large=4, capacity=4096, batch_size=1024)
FULL_MULTI_HOT = EmbeddingsBenchConfig(rows=1_000_000, distinct_ids=5_000_000, large=3, capacity=65_536, batch_size=2048, data="clicklog")
QUICK_MULTI_HOT = EmbeddingsBenchConfig(rows=40_000, distinct_ids=5_000_000, large=3, capacity=4096, batch_size=1024, data="clicklog")


class EmbeddingsBenchError(DLRoverError):
    """A bench job did not succeed or did not train every sample (one ``error:`` line)."""


def row_bytes(dim: int = DIM) -> int:
    """A table row with row-wise Adagrad: fp32 weights and one fp32 accumulator."""
    return dim * 4 + 4


def hashed_rows(capacity: int, dim: int = DIM) -> int:
    """The rows a hashed table gets for the bytes of a ``capacity``-row dynamic one."""
    return round(capacity * (row_bytes(dim) + MAP_BYTES_PER_ROW) / row_bytes(dim))


def small_tables(cfg: EmbeddingsBenchConfig) -> int:
    from dlrover.data.synth_clicklog import FEATURES

    return (26 if cfg.data == "criteo" else len(FEATURES["sparse"])) - cfg.large


def table_sizes(cfg: EmbeddingsBenchConfig, large_rows: int) -> list[int]:
    return [large_rows] * cfg.large + [SMALL_ROWS] * small_tables(cfg)


def model_mb(cfg: EmbeddingsBenchConfig, dynamic: bool) -> float:
    """Bytes of all tables (weights, optimizer state and, dynamic, the id maps), in MB."""
    if dynamic:
        large = cfg.large * cfg.capacity * (row_bytes() + MAP_BYTES_PER_ROW)
        return (large + small_tables(cfg) * SMALL_ROWS * row_bytes()) / 2**20
    return sum(table_sizes(cfg, hashed_rows(cfg.capacity))) * row_bytes() / 2**20


def bench_spec(data_dir: str, cfg: EmbeddingsBenchConfig, dynamic: bool) -> JobSpec:
    from dlrover.data.synth_clicklog import FEATURES, LARGE

    dyn = {"kind": "dynamic", "capacity_rows": cfg.capacity, "admit_after": cfg.admit_after, "eviction": cfg.eviction}
    if cfg.data == "criteo":
        features, paths, keys = None, os.path.join(data_dir, "*.tsv"), list(range(cfg.large))
    else:
        features, paths, keys = FEATURES, os.path.join(data_dir, "*.csv"), LARGE
    tables: dict = {k: dict(dyn) if dynamic else {} for k in keys}
    if cfg.data == "clicklog":
        tables["history"]["pooling"] = "mean"  # the generator's history is its items' mean weight
    return spec_from_dict(
        {
            "name": f"bench-embeddings-{cfg.data}-{'dynamic' if dynamic else 'hashed'}",
            "seed": cfg.seed,
            **({"features": features} if features else {}),
            "model": {
                "embedding_dim": DIM, "num_embeddings": table_sizes(cfg, cfg.capacity if dynamic else hashed_rows(cfg.capacity)),
                "dense_arch": [64, DIM], "over_arch": [128, 64, 1], "tables": {k: v for k, v in tables.items() if v},
            },
            "data": {"paths": [paths], "epochs": 1, "batch_size": cfg.batch_size, "eval_fraction": 0.1, "shard_rows": 8 * cfg.batch_size},
            "resources": {"workers": 1, "ps": 1, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 2048, "ps_memory_mb": 2048},
            "optimizer": {"sparse": {"name": "rowwise_adagrad", "lr": SPARSE_LR}, "dense": {"name": "adagrad", "lr": 0.01}},
            "train": {"log_every_s": 1.0},
        }
    )  # fmt: skip


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _job(spec: JobSpec, runs_dir: str) -> tuple[JobSummary, float]:
    """One job's summary and its PS's peak RSS (MB; nan: no PS reported before the end)."""
    from dlrover.runlogs.event_file import read_events
    from dlrover.driver.runner import run_job

    doc, path = run_job(spec, runs_dir=runs_dir, progress="none", stop_when=JobProgress(spec.name))
    s = JobSummary.from_json(doc)
    if s.status != "succeeded" or s.samples_trained != s.samples_expected:
        raise EmbeddingsBenchError(
            f"bench embeddings: {spec.name} ended {s.status} with {s.samples_trained:,} of {s.samples_expected:,} samples trained"
        )
    rss = [float(e.fields["rss_mb"]) for _, e in read_events(path.parent / "events.jsonl") if e.kind == "ps_metrics"]
    return s, max(rss, default=float("nan"))


def generate(cfg: EmbeddingsBenchConfig, data: str) -> dict:
    """The bench's rows: high-cardinality Criteo TSV, or the click log (CSV, string ids)."""
    if cfg.data == "criteo":
        from dlrover.data.synth_highcard import HighCardConfig, generate_highcard

        _log(f"generating {cfg.rows:,} high-cardinality rows ({cfg.large} tables of {cfg.distinct_ids:,} Zipf ids) -> {data}")
        return generate_highcard(data, HighCardConfig(rows=cfg.rows, files=4, seed=cfg.seed, distinct_ids=cfg.distinct_ids, large_tables=cfg.large), progress=False)
    from dlrover.data.synth_clicklog import ClickLogConfig, generate_clicklog

    _log(f"generating a {cfg.rows:,}-row click log ({cfg.distinct_ids // 2:,} users, {cfg.distinct_ids:,} items, string ids, 1..20 history items a row) -> {data}")
    return generate_clicklog(data, ClickLogConfig(rows=cfg.rows, files=4, seed=cfg.seed, users=cfg.distinct_ids // 2, items=cfg.distinct_ids), progress=False)


def run_embeddings_bench(quick: bool = False, work_dir: str | None = None, multi_hot: bool = False) -> dict:
    cfg = (QUICK_MULTI_HOT if quick else FULL_MULTI_HOT) if multi_hot else (QUICK if quick else FULL)
    own = work_dir is None
    work = work_dir or tempfile.mkdtemp(prefix="dlrover-embeddings-")
    try:
        data = os.path.join(work, "data")
        meta = generate(cfg, data)
        _log(f"distinct ids seen per large table: {meta['distinct_ids_seen']}; best possible AUC {meta['best_auc']:.4f}")
        out: dict = {"config": asdict(cfg), "hashed_rows": hashed_rows(cfg.capacity), "dynamic_rows": cfg.capacity,
                     "distinct_ids_seen": meta["distinct_ids_seen"], "best_auc": meta["best_auc"]}  # fmt: skip
        for kind in ("hashed", "dynamic"):
            rows = cfg.capacity if kind == "dynamic" else hashed_rows(cfg.capacity)
            _log(f"{kind}: {cfg.large} large tables of {rows:,} rows, {model_mb(cfg, kind == 'dynamic'):.1f} MB of tables")
            s, ps_rss_mb = _job(bench_spec(data, cfg, kind == "dynamic"), os.path.join(work, "runs"))
            _log(f"{kind}: auc {s.auc:.4f}, {s.throughput_samples_per_s:,.0f} samples/s, PS peak RSS {ps_rss_mb:.0f} MB")
            out[f"auc_{kind}"], out[f"samples_per_s_{kind}"] = s.auc, s.throughput_samples_per_s
            out[f"memory_mb_{kind}"], out[f"ps_rss_mb_{kind}"] = model_mb(cfg, kind == "dynamic"), ps_rss_mb
            out[f"samples_{kind}"], out[f"samples_expected_{kind}"] = s.samples_trained, s.samples_expected
            if kind == "dynamic":
                out["dynamic_counts"] = s.dynamic_tables
        out["evictions"] = out["dynamic_counts"].get("evicted", 0)
        out["admitted"] = out["dynamic_counts"].get("admitted", 0)
        out["speed_ratio"] = out["samples_per_s_dynamic"] / out["samples_per_s_hashed"]
        out["auc_gain"] = out["auc_dynamic"] - out["auc_hashed"]
        return out
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def print_embeddings(r: dict) -> None:
    c = r["config"]
    what = "high-cardinality Criteo TSV" if c["data"] == "criteo" else "click log (string ids, multi-hot history, mean pooling)"
    print(f"{c['rows']:,} rows of {what}, {c['large']} large tables (distinct ids seen per table: {', '.join(f'{n:,}' for n in r['distinct_ids_seen'])})")
    print(f"  large tables: hashed {r['hashed_rows']:,} rows vs dynamic {r['dynamic_rows']:,} rows + id map (admit after {c['admit_after']}, {c['eviction']})")
    print(f"{'':12s}{'AUC':>8s}{'samples/s':>11s}{'tables MB':>11s}{'PS RSS MB':>11s}")
    for kind in ("hashed", "dynamic"):
        print(f"{kind:12s}{r[f'auc_{kind}']:>8.4f}{r[f'samples_per_s_{kind}']:>11,.0f}{r[f'memory_mb_{kind}']:>11.1f}{r[f'ps_rss_mb_{kind}']:>11.0f}")
    print(f"  generator's best possible AUC {r['best_auc']:.4f}; dynamic - hashed AUC {r['auc_gain']:+.4f}; dynamic/hashed samples/s {r['speed_ratio']:.2f}x")
    d = r["dynamic_counts"]
    looked = max(d.get("lookups", 0), 1)
    print(
        f"  dynamic tables: {d.get('lookups', 0):,} lookups, hits {d.get('hits', 0) / looked:.1%}, default row {d.get('defaults', 0) / looked:.1%}, "
        f"admitted {d.get('admitted', 0):,} ids, evicted {d.get('evicted', 0):,} ({d.get('evicted', 0) / max(d.get('admitted', 0), 1):.0%} of admitted)"
    )
