"""The master's publisher (``publish:``): every ``publish.every_s`` the next checkpoint
cut becomes a model version, written by a task beside training: a full model every
``full_every`` versions, otherwise the embedding rows changed since the previous version.

The changed rows are the PS's own reports at each cut (``EmbeddingPS.cut_changes``,
the durable checkpoints' source too), folded together from the previous version's cut
on. A delta is written only when that is provably complete: every report since was
complete and the previous version was written; otherwise the version is full. A
restarted master numbers on from the newest complete version on disk, and its first
version is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlrover.checkpoint.incremental import ChangedRows, RowChanges
from dlrover.data.follow_queue import FollowQueue
from dlrover.master.cluster import RayError
from dlrover.master.job import Job
from dlrover.serving.publish import PublishJob, publish_ready, publish_version
from dlrover.serving.versions import Version, versions
from dlrover.spec import PublishSpec


@dataclass
class Pending:
    ref: Any
    version: Version
    pause_s: float


class Publisher:
    def __init__(self, m: Job, spec: PublishSpec) -> None:
        self.m, self.spec = m, spec
        have = versions(spec.dir)
        self.version = have[-1] if have else 0  # the newest complete one
        self.parent: int | None = None  # a version this master wrote, that a delta may build on
        self.base, self.links = 0, 0
        self.changes: RowChanges | None = None
        self.last_at: float | None = None  # job time of the last cut published
        self.pending: Pending | None = None
        self.published: list[Version] = []
        self._warm: Any = None  # the warm-up task's ref (kept: it must not be cancelled)

    def warm(self) -> None:
        """Start the process the first version's task will run in (not waited for)."""
        self._warm = self.m.cluster.task(publish_ready, num_cpus=0)

    def add_cut(self, table_sizes: list[int], reports: list[ChangedRows]) -> None:
        """Every cut's reports (taken while the workers were parked)."""
        if self.changes is None:
            self.changes = RowChanges(table_sizes)
        self.changes.add(reports)

    def broken(self) -> None:
        """A cut's reports were lost: the next version is full."""
        if self.changes is not None:
            self.changes.complete = False

    def due(self, now: float) -> bool:
        self.collect()
        return self.pending is None and now - (self.last_at if self.last_at is not None else 0.0) >= self.spec.every_s

    def publish(self, ckpt: Any, now: float) -> None:
        """Start writing the version of checkpoint ``ckpt`` (just cut) as a task."""
        m, lz = self.m, self.m.launcher
        changes = self.changes
        delta = changes is not None and changes.complete and self.parent is not None and self.links < self.spec.full_every
        n = self.version + 1
        rows = changes.rows() if delta else None
        v = Version(
            version=n, kind="delta" if delta else "full", parent=self.parent if delta else None, base=self.base if delta else n,
            quantize=self.spec.quantize, job_id=m.job_id, rows_trained=int(ckpt.samples), watermark=trained_files(ckpt.queue),
            at_s=round(now, 4), state_sha256="", changed_rows=int(sum(len(r) for r in rows)) if rows else sum(lz.vmap.table_sizes), files=[],
        )  # fmt: skip
        job = PublishJob(v, m.spec, list(lz.vmap.table_sizes), lz.vmap.num_vshards, ckpt.dense["param"], rows)
        ref = m.cluster.task(publish_version, job, *ckpt.ps, num_cpus=0)
        if changes is not None:
            changes.reset(complete=True)  # counting afresh from this cut
        self.version, self.last_at = n, now
        self.pending = Pending(ref, v, ckpt.pause_s)

    def finish(self, final: bool, timeout_s: float = 600.0) -> None:
        """The job ended: wait for a version being written; when it succeeded, publish the
        trained model as one more version unless the newest already holds every row."""
        self.collect(timeout=timeout_s)
        m = self.m
        trained = m.books.queue.samples_done
        if final and (not self.published or self.published[-1].rows_trained < trained):
            ckpt = m.checkpointer.take({}, m.clock() - m.t0)
            if ckpt is not None:
                self.publish(ckpt, m.clock() - m.t0)
                self.collect(timeout=timeout_s)

    def collect(self, timeout: float = 0.0) -> None:
        """Record a version whose write finished (``timeout``: wait that long for it)."""
        p = self.pending
        if p is None or not self.m.cluster.wait([p.ref], timeout=timeout)[0]:
            return
        self.pending = None
        try:
            v: Version = self.m.cluster.get(p.ref)
        except RayError as e:
            self.parent = None  # the next version is full
            self.m.events.add("publish_failed", version=p.version.version, error=str(e).strip().splitlines()[0][:300])
            return
        self.parent, self.base = v.version, v.base
        self.links = 1 if v.kind == "full" else self.links + 1
        self.published.append(v)
        nbytes = sum(f.bytes for f in v.files)
        self.m.events.add(
            "version_published", version=v.version, version_kind=v.kind, parent=v.parent, rows_trained=v.rows_trained,
            changed_rows=v.changed_rows, bytes=nbytes, pause_s=round(p.pause_s, 4), watermark=len(v.watermark),
        )  # fmt: skip


def trained_files(queue_state: dict) -> list[str]:
    """A followed stream's files wholly trained at a cut, in arrival order ([] otherwise)."""
    if "ended" not in queue_state:
        return []
    return FollowQueue.from_state_dict(queue_state).trained_files()
