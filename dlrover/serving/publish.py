"""Writing one published version (``publish:``) from a cut's PS payloads: run as a Ray
task, so the tables are gathered and written outside the master's process while training
goes on. The format and the reader: :mod:`dlrover.serving.versions`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from dlrover.serving.export import DenseHead, dense_program, model_manifest
from dlrover.serving.versions import Version, as_loaded, global_tables, prune, state_digest, write_version
from dlrover.spec import JobSpec

KEEP_FULLS = 2  # chains kept: the newest, and the one before it for a reader still loading it


@dataclass(frozen=True)
class PublishJob:
    """What the task needs besides the payloads: the version's record (its digest and
    files filled in by the task), the job's spec, the vshard layout, the dense vector,
    and a delta's rows (global ids per table; None: a full version)."""

    version: Version
    spec: JobSpec
    table_sizes: list[int]
    num_vshards: int
    dense: np.ndarray
    rows: list[np.ndarray] | None


def publish_version(job: PublishJob, *payloads: dict) -> Version:
    """Gather the tables, write the version, prune the chains no reader needs; its record."""
    spec = job.spec
    tables = global_tables(list(payloads), job.table_sizes, job.num_vshards)
    v = dataclasses.replace(job.version, state_sha256=state_digest(as_loaded(tables, job.version.quantize)))
    head = DenseHead(spec.model, spec.schema, torch.from_numpy(np.asarray(job.dense, dtype=np.float32))).eval()
    manifest = model_manifest(spec, v.job_id, v.state_sha256, list(job.table_sizes), [], [])
    d = write_version(spec.publish.dir, v, manifest, dense_program(spec, head), tables, job.rows)
    prune(spec.publish.dir, KEEP_FULLS)
    return Version.read(d)


def publish_ready() -> None:
    """Load what a version's write needs (torch.export, TorchRec's dense modules): run at
    launch, so the process the first version's task reuses has paid for its imports."""
    import torch.export  # noqa: F401
    from torchrec.models.dlrm import DenseArch  # noqa: F401
