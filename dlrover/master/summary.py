"""What the master reports about a job: the per-actor rows of its progress snapshot, the
reliability figures (ETTR, MTTF), the summary the driver writes to ``summary.json``, and
the exported final model. Read-only over the master's records."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from dlrover.checkpoint.manifest import HashingWriter
from dlrover.checkpoint.store import DROP_CACHE_EVERY
from dlrover.faults.records import FailureKind
from dlrover.master.cluster import Cluster, RayError
from dlrover.serving.id_map import IdMap
from dlrover.metrics.reliability import ReliabilityReport, reliability_report
from dlrover.ps.dense_shards import dense_summary
from dlrover.ps.dynamic_tables import default_row
from dlrover.ps.ps_stats import total_counts
from dlrover.runlogs.records import JobSummary, SummaryConfig
from dlrover.worker.window import WorkerReport

from dlrover.master.job import Job

STATS_TIMEOUT_S = 30.0


def actor_rows(m: Job, reports: dict[str, WorkerReport]) -> list[dict]:
    """Resources and latest measurements of each running worker and PS (``reports``: a
    copy of the workers' latest reports)."""
    lz = m.launcher
    if lz is None or lz.vmap is None:
        return []
    rows = []
    for name in list(lz.workers):
        cpu, mem = lz.resources.get(name, (1.0, 0))
        r = reports.get(name)  # None: no report yet, no figures
        rows.append({
            "name": name, "role": "worker", "cpus": cpu, "memory_limit_mb": mem, "rss_mb": r.rss_mb if r else None,
            "cpu_util": r.cpu_percent / 100.0 / max(cpu, 1e-9) if r else None,
            "step_time_s": r.step_time_s if r else None, "pull_s": r.pull_s if r else None, "push_s": r.push_s if r else None,
        })  # fmt: skip
    ps = m.control.stats.ps() if m.control else {}
    for k in list(lz.ps):
        name = lz.ps_name(k)
        cpu, mem = lz.resources.get(name, (1.0, 0))
        a = ps.get(k)
        rows.append({"name": name, "role": "ps", "cpus": cpu, "memory_limit_mb": mem, "rss_mb": a.rss_mb if a else None, "cpu_util": a.cpu_util if a else None})
    return rows


def ettr_now(m: Job) -> float | None:
    """ETTR of the job so far (None before training starts)."""
    b = m.books
    if b.train_start is None:
        return None
    now = m.clock()
    return reliability_of(m, now - m.t0, (b.train_end or now) - b.train_start, b.queue.samples_done).ettr


def reliability_of(m: Job, wall_s: float, train_s: float, trained: int) -> ReliabilityReport:
    replayed = m.recovery.samples_replayed
    failures = list(m.failures)
    args = {"wall_s": wall_s, "train_s": train_s, "samples_replayed": replayed}
    # Replayed samples cost time at the speed the job trains when it trains (not the
    # job's average, which already includes the outages and the replay itself).
    stalls = reliability_report(failures, throughput=0.0, **args).downtime_s
    speed = (trained + replayed) / max(train_s - stalls, 1e-9)
    return reliability_report(failures, throughput=speed, **args)


def reliability_fields(m: Job, summary: JobSummary) -> dict[str, Any]:
    """The summary's reliability part (``JobSummary`` fields)."""
    rep = reliability_of(m, summary.wall_time_s, summary.train_time_s, summary.samples_trained)
    return {
        "reliability": rep,
        "ettr": rep.ettr,
        "mttf_s": rep.mttf_s,
        "samples_replayed": int(m.recovery.samples_replayed),
        "updates_lost": sum(f.updates_lost or 0 for f in m.failures),
        "oom_kills": sum(f.kind == FailureKind.OOM_KILL for f in m.failures),
        "bad_nodes": sorted(m.launcher.avoid),
        "node_speeds_probed": m.launcher.probed_speeds(),  # PAL placement's probe ({}: not run)
        "checkpoints": m.checkpointer.summary(),
    }


def summary_of(m: Job, metrics: dict) -> JobSummary:
    """The summary's records and figures, without the parts their owners add (the PS's
    counts, the policy's account, reliability)."""
    b, spec = m.books, m.spec
    q = b.queue
    train_s = max((b.train_end or m.clock()) - (b.train_start or m.t0), 1e-9)
    bad = b.bad_lines + q.prefix_bad_lines
    expected = q.samples_expected - bad
    trained = q.samples_done
    ids, cut = m.data.expected_ids(spec.layout(), spec.data.epochs)
    r = spec.resources
    return JobSummary(
        job_id=m.job_id,
        status=m.status.value,
        samples_expected=int(expected),
        samples_trained=int(trained),
        samples_lost=int(max(expected - trained, 0)),
        bad_lines_skipped=int(bad),
        ids_expected=int(len(spec.schema.sparse) * expected if ids < 0 else ids),
        long_bags_truncated=int(cut),
        ids_per_sample=m.control.model.ids_per_sample,
        auc=metrics.get("auc"),
        logloss=metrics.get("logloss"),
        best_auc=metrics.get("best_auc"),
        eval_rows=metrics.get("rows", 0),
        throughput_samples_per_s=trained / train_s,
        train_time_s=train_s,
        wall_time_s=m.clock() - m.t0,
        epochs=spec.data.epochs,
        config=SummaryConfig(r.workers, r.ps, r.worker_cpu, r.ps_cpu, r.dense_ps, r.dense_ps_cpu, spec.data.batch_size, spec.train.vshards),
        scale_events=list(m.scale_events),
        failures=list(m.failures),
        events=m.events.rows(),
    )


def _answers(cluster: Cluster, calls: list) -> list:
    """What each actor call returned; an actor that died (a job failed past its limit may
    have lost one) gives nothing."""
    out = []
    for ref in calls:
        try:
            out.append(cluster.get(ref, timeout=STATS_TIMEOUT_S))
        except (RayError, TimeoutError):
            pass
    return out


def end_summary(m: Job, metrics: dict, failed: str | None) -> JobSummary:
    """The summary at the job's end, less the reliability part: the records, the updates
    the PS and dense PS applied, the policy's account; ``failed``: why the job ended
    FAILED past its failure limit (the summary's ``reason``)."""
    summary = summary_of(m, metrics)
    ps_stats = _answers(m.cluster, [ps.stats.remote() for ps in m.launcher.ps.values()]) + m.control.retired_ps_stats
    dense = _answers(m.cluster, [h.stats.remote() for h in m.launcher.dense.handles])
    return replace(
        summary,
        reason=failed,
        ps_bags_updated=sum(s.rows_updated for s in ps_stats),  # the updates applied
        ps_ids_updated=sum(s.ids_updated for s in ps_stats),
        dynamic_tables=total_counts(ps_stats),  # hits, admissions, evictions (dlrover bench embeddings)
        **(dense_summary(dense, m.spec.train.dense_sync) if dense else {}),
        # Pushes of a batch a PS had applied before (a replacement redoing a dead worker's
        # unreported batches): skipped, so no update is applied twice.
        duplicate_updates_skipped=sum(s.duplicates for s in [*ps_stats, *dense]),
        **m.control.finish(summary.status, summary.samples_trained, summary.wall_time_s),
        chaos=m.chaos.fired,
    )


def final_id_maps(m: Job) -> dict[int, IdMap]:
    """Each dynamic table's id map, gathered from the PS owning its vshards."""
    spec, out = m.spec, {}
    for t in spec.schema.dynamic():
        parts = m.cluster.get([h.dynamic_map.remote(t) for h in m.launcher.ps.values()])
        ids, rows = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        order = np.argsort(ids, kind="stable")
        default = default_row(spec.seed, t, spec.schema.table_sizes()[t], spec.model.embedding_dim)
        out[t] = IdMap(torch.from_numpy(ids[order]), torch.from_numpy(rows[order]), default)
    return out


def export_final(m: Job) -> None:
    """Write the trained model (global embedding tables, dense parameters, the dynamic
    tables' id maps) to ``checkpoint.dir/<job_id>/final.pt``, or without a checkpoint
    directory to the run directory's ``final.pt`` (what ``dlrover export`` reads).

    The global tables are assembled in files mapped into memory, one PS's rows of one
    table at a time: a model of several GB passes through the page cache, which the
    kernel can write back, instead of being gathered in the master's own memory."""
    spec = m.spec
    sizes, dim = spec.schema.table_sizes(), spec.model.embedding_dim
    out = os.path.join(spec.checkpoint.dir, m.job_id) if spec.checkpoint.dir else m.run_directory()
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".final-") as scratch:
        tables = [torch.from_file(os.path.join(scratch, f"t{t}"), shared=True, size=n * dim).view(n, dim) for t, n in enumerate(sizes)]
        for h in m.launcher.ps.values():
            for t in range(len(sizes)):
                rows, w = m.cluster.get(h.table_rows.remote(t))
                tables[t][torch.from_numpy(rows)] = torch.from_numpy(w)
        dense = torch.as_tensor(m.launcher.dense.pull(m.cluster.get))
        tmp = os.path.join(out, "final.pt.tmp")
        with open(tmp, "wb") as f:
            writer = HashingWriter(f, drop_cache_every=DROP_CACHE_EVERY)  # kept out of the page cache
            dynamic = {t: idm.to_doc() for t, idm in final_id_maps(m).items()}
            torch.save({"tables": tables, "dense": dense, "dynamic": dynamic, "job_id": m.job_id}, writer)
            writer.drop_cache()
        del tables
    os.replace(tmp, os.path.join(out, "final.pt"))
    m.events.add("model_saved", path=os.path.join(out, "final.pt"), sha256=writer.sha.hexdigest())  # to check a copy against
