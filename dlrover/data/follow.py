"""Files that arrive while a job trains (``data.follow``): which are complete, which
changed after they were taken, and the plan that grows as they come.

:class:`FileWatch` is pure bookkeeping over listings (injected: tests hand it their
own), so its rules are tested without a store: a file is complete once its directory
holds ``_SUCCESS`` (the partition convention of Hadoop, Spark and Hive writers), or,
with ``ready: stable_size``, once two polls in a row saw it at the same size and
modification stamp. A file taken for training that changes later is reported once per
change and never trained again: its rows are in the model already.
"""

from __future__ import annotations

import glob
import os
import posixpath
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from fsspec.implementations.local import LocalFileSystem

from dlrover.data.criteo import FileIndex, index_file, is_data_name
from dlrover.data.follow_queue import FollowQueue
from dlrover.data.layout import DataLayout
from dlrover.data.plan import DataPlan
from dlrover.data.remote import filesystem, local_path, store_errors
from dlrover.paths import is_url
from dlrover.spec import JobSpec

MARKER = "_SUCCESS"


@dataclass(frozen=True)
class Listed:
    """A data file as one listing saw it. ``stamp``: what tells a rewrite of the same
    size (a local file's mtime, an object's ETag or last-modified time)."""

    path: str
    size: int
    stamp: str


def _stamp(entry: dict) -> str:
    for key in ("ETag", "etag", "mtime", "LastModified", "last_modified", "updated"):
        if entry.get(key) is not None:
            return str(entry[key])
    return ""


def list_files(patterns: Iterable[str], markers: bool) -> tuple[dict[str, Listed], set[str]]:
    """The data files ``data.paths`` name now (none is not an error: they may come) and,
    with ``markers``, the directories among theirs that hold ``_SUCCESS``; local paths
    and fsspec URLs alike."""
    files: dict[str, Listed] = {}
    marked: set[str] = set()
    for pattern in patterns:
        url, what = is_url(pattern), f"data.paths: {pattern}"
        fs, root = filesystem(pattern, what) if url else (LocalFileSystem(), os.path.abspath(os.path.expanduser(local_path(pattern))))
        with store_errors(what):
            fs.invalidate_cache()  # a store's driver caches listings: this one must be new
            if glob.has_magic(root):
                entries = list(fs.glob(root, detail=True).values())
            elif fs.isdir(root):
                entries = fs.ls(root, detail=True)
            else:
                entries = [fs.info(root)] if fs.exists(root) else []
            names = {e["name"]: e for e in entries if e["type"] == "file" and is_data_name(e["name"])}
            for name, e in names.items():
                path = fs.unstrip_protocol(name) if url else os.path.normpath(name)
                files[path] = Listed(path, int(e.get("size") or 0), _stamp(e))
            for d in {posixpath.dirname(n) for n in names} if markers else ():
                if fs.exists(posixpath.join(d, MARKER)):
                    marked.add(fs.unstrip_protocol(d) if url else os.path.normpath(d))
    return files, marked


@dataclass
class FileWatch:
    """Each ``poll`` of a listing: the files that became complete (by path) and the taken
    ones that changed since ((as taken, as now) pairs)."""

    ready: str  # "_SUCCESS" | "stable_size"
    lister: Callable[[], tuple[dict[str, Listed], set[str]]]
    taken: dict[str, Listed] = field(default_factory=dict)
    _seen: dict[str, Listed] = field(default_factory=dict, init=False)  # not taken yet: as the last poll saw them

    def poll(self) -> tuple[list[Listed], list[tuple[Listed, Listed]]]:
        files, marked = self.lister()
        changed = []
        for path, now in files.items():
            was = self.taken.get(path)
            if was is not None and (was.size, was.stamp) != (now.size, now.stamp):
                changed.append((was, now))
                self.taken[path] = now  # reported once per change
        fresh = {p: f for p, f in files.items() if p not in self.taken}
        if self.ready == MARKER:
            complete = [f for p, f in fresh.items() if posixpath.dirname(p) in marked]
        else:
            complete = [f for p, f in fresh.items() if self._seen.get(p) == f]
        self._seen = fresh
        complete.sort(key=lambda f: f.path)
        for f in complete:
            self.taken[f.path] = f
            self._seen.pop(f.path)
        return complete, changed


@dataclass
class FollowPlan(DataPlan):
    """The files taken so far, growing as they arrive; held-out rows and id counts as
    :class:`DataPlan`'s, over what has arrived. Its dicts are replaced, never edited, so
    the master's thread may read them while the follower adds a file."""

    layout: DataLayout | None = None
    eval_fraction: float = 0.0
    arrived: dict[str, float] = field(default_factory=dict)  # path -> clock time it was taken

    @classmethod
    def build(cls, spec: JobSpec) -> "FollowPlan":
        return cls({}, {}, spec.layout(), spec.data.eval_fraction)

    def shard_queue(self, spec: JobSpec, clock: Callable[[], float] = time.monotonic) -> FollowQueue:
        return FollowQueue([], spec.data.shard_rows, 1, spec.seed if spec.data.shuffle else None, clock)

    def take(self, path: str, at: float, train_rows: int | None = None) -> FileIndex:
        """Index a complete file and add it (a DataError for a bad one). ``train_rows``:
        those a restored queue holds of it (trained as they were, whatever it holds now)."""
        idx = index_file(path, layout=self.layout)
        rows = idx.rows - int(idx.rows * self.eval_fraction) if train_rows is None else min(train_rows, idx.rows)
        self.files = {**self.files, path: idx}
        self.train_rows = {**self.train_rows, path: rows}
        self.arrived = {**self.arrived, path: at}
        return idx

    def index(self, path: str) -> FileIndex:
        """A file's index: the plan's, else read now (a restored queue's file, before the
        follower took it again)."""
        idx = self.files.get(path)
        return idx if idx is not None else index_file(path, layout=self.layout)

    def file_cuts(self, path: str) -> list[int]:
        """First rows of a file's Parquet row groups but the first (no shard spans one)."""
        groups = self.index(path).groups or []
        return [sum(groups[: k + 1]) for k in range(len(groups) - 1)]
