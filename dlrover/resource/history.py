"""History of finished jobs: the Config DB behind DLRover-RM's warm start (stage 1).

One JSON file per finished job under a directory of the user's choosing, so the store
needs no server, survives crashes (each file is written to a temporary name and renamed
into place) and can be inspected or pruned with ``ls``/``rm``. A job looks up records of
*similar* jobs: same model shape and batch size (``job_signature``), optionally the same
data (``dataset_signature``). A file that cannot be read or parsed is skipped with a
warning: a damaged history must never fail a job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlrover.resource.configs import Config

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


def _hash(obj: Any, n: int = 12) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _plain(model: Any) -> Any:
    if hasattr(model, "model_dump"):  # a pydantic ModelSpec
        return model.model_dump()
    return model


def job_signature(model_dict: Any, batch_size: int) -> str:
    """Stable short hash of the model shape and the per-worker batch size.

    Accepts the spec's ``model`` section as a dict (or the pydantic model). A list of
    equal table sizes hashes like the single size it repeats, so two spellings of the
    same model match.
    """
    d = dict(_plain(model_dict) or {})
    sizes = d.get("num_embeddings")
    if isinstance(sizes, (list, tuple)) and sizes and all(s == sizes[0] for s in sizes):
        d["num_embeddings"] = sizes[0]
    return "m-" + _hash({"model": d, "batch_size": int(batch_size)})


def dataset_signature(paths: list[str], rows: int) -> str:
    """Stable short hash of the data: its file names (not directories, so a copy moved
    elsewhere still matches) and its row count."""
    names = sorted(os.path.basename(str(p).rstrip("/")) for p in paths)
    return "d-" + _hash({"files": names, "rows": int(rows)})


def _config(d: Any) -> Config | None:
    if d is None:
        return None
    if isinstance(d, Config):
        return d
    return Config(
        workers=int(d["workers"]),
        ps=int(d["ps"]),
        worker_cpu=float(d["worker_cpu"]),
        ps_cpu=float(d["ps_cpu"]),
        worker_memory_mb=int(d.get("worker_memory_mb", 2048)),
        ps_memory_mb=int(d.get("ps_memory_mb", 2048)),
    )


@dataclass
class HistoryRecord:
    """What a finished job leaves for the next similar one.

    ``measurements`` are the measured windows as plain dicts
    ``{"config": Config.to_dict(), "throughput": samples/s, "duration_s": s}``;
    ``perf_model`` is ``PerfModel.to_dict()`` of the job's fitted model (or ``None``).
    """

    signature: str
    dataset: str
    job_id: str
    finished_at: float  # unix time
    final_config: Config
    best_config: Config | None = None
    best_throughput: float = 0.0  # samples/s measured on best_config
    measurements: list[dict] = field(default_factory=list)
    perf_model: dict | None = None
    samples: int = 0
    wall_time_s: float = 0.0
    status: str = "completed"
    peak_rss_mb: dict = field(default_factory=dict)  # {"worker": per worker, "ps_total": all PS together}

    def measured(self) -> list[tuple[Config, float, float]]:
        """``(config, throughput, duration_s)`` of each usable measurement."""
        out = []
        for m in self.measurements:
            try:
                cfg = _config(m["config"])
                thr = float(m["throughput"])
                dur = float(m.get("duration_s", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            if cfg is not None and thr > 0:
                out.append((cfg, thr, dur))
        return out

    def to_dict(self) -> dict:
        return {
            "version": SCHEMA_VERSION,
            "signature": self.signature,
            "dataset": self.dataset,
            "job_id": self.job_id,
            "finished_at": float(self.finished_at),
            "final_config": self.final_config.to_dict(),
            "best_config": None if self.best_config is None else self.best_config.to_dict(),
            "best_throughput": float(self.best_throughput),
            "measurements": [
                {
                    "config": _config(m["config"]).to_dict(),
                    "throughput": float(m["throughput"]),
                    "duration_s": float(m.get("duration_s", 0.0)),
                }
                for m in self.measurements
            ],
            "perf_model": self.perf_model,
            "samples": int(self.samples),
            "wall_time_s": float(self.wall_time_s),
            "status": self.status,
            "peak_rss_mb": {k: float(v) for k, v in self.peak_rss_mb.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> "HistoryRecord":
        if not isinstance(d, dict):
            raise ValueError("a history record must be a JSON object")
        final = _config(d["final_config"])
        assert final is not None
        return cls(
            signature=str(d["signature"]),
            dataset=str(d.get("dataset", "")),
            job_id=str(d["job_id"]),
            finished_at=float(d["finished_at"]),
            final_config=final,
            best_config=_config(d.get("best_config")),
            best_throughput=float(d.get("best_throughput", 0.0)),
            measurements=list(d.get("measurements") or []),
            perf_model=d.get("perf_model"),
            samples=int(d.get("samples", 0)),
            wall_time_s=float(d.get("wall_time_s", 0.0)),
            status=str(d.get("status", "completed")),
            peak_rss_mb={str(k): float(v) for k, v in (d.get("peak_rss_mb") or {}).items()},
        )


class HistoryStore:
    """Local-file database of :class:`HistoryRecord`, one ``<time>-<job_id>.json`` each."""

    def __init__(self, dir: str | os.PathLike) -> None:
        self.dir = Path(dir).expanduser()

    def add(self, record: HistoryRecord) -> Path:
        """Write ``record`` atomically (temporary file + ``os.replace``); returns its path."""
        self.dir.mkdir(parents=True, exist_ok=True)
        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", record.job_id)[:80] or "job"
        path = self.dir / f"{int(record.finished_at * 1000):015d}-{safe_id}.json"
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.dir)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record.to_dict(), f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    def records(self) -> list[HistoryRecord]:
        """Every readable record, newest first; damaged files are skipped with a warning."""
        if not self.dir.is_dir():
            return []
        out = []
        for path in sorted(self.dir.glob("*.json")):
            if path.name.startswith(".tmp-"):
                continue
            try:
                out.append(HistoryRecord.from_dict(json.loads(path.read_text())))
            except Exception as e:  # noqa: BLE001 - a bad file must never fail the job
                log.warning("history: skipping unreadable record %s (%s: %s)", path, e.__class__.__name__, e)
        out.sort(key=lambda r: r.finished_at, reverse=True)
        return out

    def similar(self, signature: str, dataset: str | None = None, limit: int = 10) -> list[HistoryRecord]:
        """Records with the same job signature (and dataset, if given), newest first."""
        hits = [r for r in self.records() if r.signature == signature and (dataset is None or r.dataset == dataset)]
        return hits[: max(0, int(limit))]


def default_history_dir() -> str:
    return os.environ.get("DLROVER_HISTORY_DIR") or os.path.expanduser("~/.dlrover/history")
