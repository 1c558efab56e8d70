"""Durable, checksummed checkpoints on a local directory or any fsspec filesystem.

Layout::

    <root>/ckpt-00000007/
        <key>.pt         one ``torch.save`` archive per key of ``files``
        manifest.json    written LAST: version, step, created, meta, meta_sha256 and,
                         per file, its sha256, byte count and which leaves were numpy

A checkpoint is *complete* when its manifest exists. The manifest is written after every
data file (on a local disk: fsynced under a temporary name, then renamed into place), so a
crash mid-save leaves a directory without a manifest, which readers ignore and the next
save removes. A complete checkpoint can still be *corrupt* (bit rot, a truncated copy, a
hand edit): every load re-hashes each file against its manifest and raises
:class:`CheckpointError` with a one-line message naming the file, and
:meth:`CheckpointStore.load_latest` falls back to the newest checkpoint that verifies.

A checkpoint may be a *delta* of an older one (``save(..., parent=step)``, recorded as
``parent`` in its meta): :func:`dlrover.checkpoint.chain.load_latest_chain` returns the newest
chain (a root without a parent, then each delta) whose every link verifies, and
retention never removes a checkpoint that a kept one depends on.

Loads use ``torch.load(weights_only=True)``: a checkpoint is data, and a tampered or
foreign archive must not be able to run code (:mod:`dlrover.checkpoint.archive` stores
numpy leaves so that this works; :mod:`dlrover.checkpoint.manifest` is the manifest).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import torch
from fsspec.implementations.local import LocalFileSystem

from dlrover.checkpoint.archive import Encoded, decode, encode
from dlrover.checkpoint.manifest import MANIFEST, FileEntry, HashingWriter, Manifest, canonical_meta, check_keys_case, check_key, check_manifest, manifest_json
from dlrover.errors import DLRoverError

log = logging.getLogger(__name__)

DROP_CACHE_EVERY = 256 << 20  # bytes of a local checkpoint file between syncs
_DIR_RE = re.compile(r"ckpt-(\d{8,})")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


class CheckpointError(DLRoverError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


@dataclass
class CheckpointInfo:
    """What :meth:`CheckpointStore.save` wrote, for logs and metrics."""

    path: str  # URL/path of the checkpoint directory
    step: int  # checkpoint sequence number
    nbytes: int  # bytes written (data files + manifest)
    write_s: float  # seconds the save took (including retention)
    meta: dict  # meta as stored (after a JSON round trip), i.e. what load returns


@dataclass(frozen=True)
class PendingSave:
    """A checkpoint :meth:`CheckpointStore.begin` opened: validated, its directory made."""

    step: int
    meta_json: str  # canonical (see ``canonical_meta``), parent included
    started: float  # perf_counter at begin: write_s covers the whole save


class CheckpointStore:
    """Numbered checkpoints under one root, newest ``keep`` retained.

    Not safe for two concurrent writers on one root (a job has a single checkpointing
    process); readers may run while a save is in progress and never see a partial one.
    """

    def __init__(self, root: str | os.PathLike, keep: int = 3) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        url = os.fspath(root)
        if "://" not in url:
            url = os.path.expanduser(url)
        self.root = url.rstrip("/") or "/"  # as the user wrote it: used in messages
        self.keep = keep
        self._fs, path = fsspec.core.url_to_fs(url)
        self._path = path.rstrip("/") or "/"
        self._local = isinstance(self._fs, LocalFileSystem)

    def save(self, step: int, files: dict[str, Any], meta: dict, parent: int | None = None) -> CheckpointInfo:
        """Write checkpoint ``step`` (data files, then the manifest), then apply retention.

        ``parent``: the complete, older checkpoint this one is a delta of (stored as
        ``meta["parent"]``); a load needs the whole chain.

        Everything is validated before anything is written, so a ValueError (bad key,
        unsupported leaf, meta not JSON-serialisable, step already saved) leaves the store
        untouched. An I/O failure raises CheckpointError and leaves at most an incomplete
        directory, which readers ignore.
        """
        if not isinstance(files, dict):
            raise TypeError(f"files must be a dict of name -> object, got {type(files).__name__}")
        # Encoding shares tensor/array memory, so doing it all up front is cheap and
        # surfaces every unsupported leaf before the first byte is written.
        encoded: dict[str, Encoded] = {check_key(key): encode(obj, key) for key, obj in files.items()}
        check_keys_case(files)
        pending = self.begin(step, meta, parent)
        entries = {key: self._write_encoded(pending.step, key, enc) for key, enc in encoded.items()}
        return self.commit(pending, entries)

    # Written by several processes: ``begin``, ``write_file`` anywhere, ``commit`` here.

    def begin(self, step: int, meta: dict, parent: int | None = None) -> PendingSave:
        """Validate ``step``, ``parent`` and ``meta`` and create the checkpoint's directory
        (removing what an interrupted save of the same step left)."""
        t0 = time.perf_counter()
        step = _check_step(step)
        if parent is not None:
            parent = _check_step(parent)
            if parent >= step or parent not in self.list():
                raise ValueError(f"checkpoint step {step}: parent {parent} is not an older complete checkpoint")
            meta = {**meta, "parent": parent}
        meta_json = canonical_meta(meta)
        d, url = self._dir(step), self.url(step)
        try:
            if self._fs.exists(f"{d}/{MANIFEST}"):
                raise ValueError(f"{url}: checkpoint step {step} already exists")
            if self._fs.exists(d):  # left over from an interrupted save of this step
                self._fs.rm(d, recursive=True)
            self._fs.makedirs(d, exist_ok=True)
            self._fsync_dir(self._path)
        except OSError as e:
            raise CheckpointError(f"{url}: cannot write checkpoint ({_one_line(e)})") from e
        return PendingSave(step, meta_json, t0)

    def write_file(self, step: int, key: str, obj: Any) -> FileEntry:
        """Write one data file of checkpoint ``step`` (after :meth:`begin`), streamed and
        hashed on the way: the file's bytes are never held in memory."""
        return self._write_encoded(_check_step(step), check_key(key), encode(obj, key))

    def commit(self, pending: PendingSave, entries: dict[str, FileEntry]) -> CheckpointInfo:
        """Write the manifest over ``entries`` (the checkpoint is complete from here), then
        apply retention."""
        check_keys_case(entries)
        step, d, url = pending.step, self._dir(pending.step), self.url(pending.step)
        manifest_path = f"{d}/{MANIFEST}"
        mdata = manifest_json(step, pending.meta_json, entries)
        try:
            if self._local:  # atomic: a reader sees no manifest or the whole one
                tmp = f"{manifest_path}.tmp"
                self._write(tmp, mdata)
                self._fsync_dir(d)  # data file entries are durable before the manifest
                os.replace(tmp, manifest_path)
                self._fsync_dir(d)
            else:  # object stores publish a file whole on close
                self._write(manifest_path, mdata)
        except OSError as e:
            raise CheckpointError(f"{url}: cannot write checkpoint ({_one_line(e)})") from e
        self._retain(step)
        nbytes = sum(e.nbytes for e in entries.values()) + len(mdata)
        return CheckpointInfo(
            path=url, step=step, nbytes=nbytes, write_s=time.perf_counter() - pending.started, meta=json.loads(pending.meta_json)
        )

    def _write_encoded(self, step: int, key: str, enc: Encoded) -> FileEntry:
        path, where = f"{self._dir(step)}/{key}.pt", f"{self.url(step)}/{key}.pt"
        try:
            with self._open_write(path) as f:
                out = HashingWriter(f, drop_cache_every=DROP_CACHE_EVERY if self._local else 0)
                torch.save(enc.obj, out)
                if self._local:
                    out.drop_cache()  # durable, and out of the page cache
        except OSError as e:
            raise CheckpointError(f"{where}: cannot write checkpoint ({_one_line(e)})") from e
        return FileEntry(out.sha.hexdigest(), out.nbytes, enc.numpy, enc.numpy_scalars)

    def list(self) -> list[int]:
        """Steps of complete checkpoints (manifest present, not verified), ascending."""
        return [s for s, complete in self._scan() if complete]

    def latest_step(self) -> int | None:
        """Newest complete step, or None. Cheap: it does not verify checksums."""
        steps = self.list()
        return steps[-1] if steps else None

    def parent_of(self, step: int) -> int | None:
        """The checkpoint ``step`` is a delta of (from its manifest), None for a root."""
        parent = self._read_manifest(_check_step(step)).meta.get("parent")
        if parent is not None and (type(parent) is not int or not 0 <= parent < step):
            raise CheckpointError(f"{self.url(step)}/{MANIFEST}: bad parent {parent!r}")
        return parent

    def chain(self, step: int) -> list[int]:
        """Steps from the root to ``step`` (just ``[step]`` for a full checkpoint)."""
        out = [_check_step(step)]
        while (parent := self.parent_of(out[-1])) is not None:
            if not self._fs.exists(f"{self._dir(parent)}/{MANIFEST}"):
                raise CheckpointError(f"{self.url(step)}: needs {self.url(parent)}, which is missing")
            out.append(parent)
        return out[::-1]

    def steps_or_raise(self) -> list[int]:
        """:meth:`list`, or a CheckpointError when the root is missing or holds none."""
        if not self._fs.exists(self._path):
            raise CheckpointError(f"{self.root}: checkpoint directory does not exist")
        steps = self.list()
        if not steps:
            raise CheckpointError(f"{self.root}: no checkpoint found")
        return steps

    def load(self, step: int) -> tuple[dict, dict[str, Any]]:
        """Verify and load checkpoint ``step`` as ``(meta, files)``.

        Every file is checked against the manifest's size and sha256 before it is
        unpickled (with ``weights_only=True``). numpy leaves come back as numpy with
        their dtype; tensors are mapped to CPU. Raises CheckpointError on any problem.
        """
        step = _check_step(step)
        d, url = self._dir(step), self.url(step)
        manifest = self._read_manifest(step)
        files: dict[str, Any] = {}
        for key, entry in manifest.files.items():
            where = f"{url}/{key}.pt"
            data = self._cat(f"{d}/{key}.pt", where, "missing (corrupt checkpoint)")
            if len(data) != entry.nbytes:
                raise CheckpointError(
                    f"{where}: size {len(data)} != {entry.nbytes} (truncated or corrupt checkpoint)"
                )
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CheckpointError(f"{where}: checksum mismatch (corrupt checkpoint)")
            try:
                obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as e:  # UnpicklingError, RuntimeError, ...: all mean unreadable
                raise CheckpointError(f"{where}: cannot load ({_load_error(e)})") from e
            if entry.numpy or entry.numpy_scalars:
                try:
                    obj = decode(obj, set(entry.numpy), set(entry.numpy_scalars))
                except ValueError as e:
                    raise CheckpointError(f"{where}: {e} (corrupt checkpoint)") from None
            files[key] = obj
        return manifest.meta, files

    def load_latest(self) -> tuple[int, dict, dict[str, Any], list[str]]:
        """Load the newest checkpoint that verifies: ``(step, meta, files, skipped)``.

        ``skipped`` holds one line per newer complete checkpoint that failed to verify, so
        the caller can log that it fell back. Raises CheckpointError if the root does not
        exist, holds no complete checkpoint, or none verifies. A delta comes back on its
        own: a store holding deltas is read with ``chain.load_latest_chain``.
        """
        steps = self.steps_or_raise()
        skipped: list[str] = []
        for step in reversed(steps):
            try:
                meta, files = self.load(step)
            except CheckpointError as e:
                skipped.append(str(e))
                continue
            return step, meta, files, skipped
        raise CheckpointError(f"{self.root}: no valid checkpoint ({'; '.join(skipped)})")

    # -- internals ----------------------------------------------------------------------

    def _dir(self, step: int) -> str:
        return f"{self._path.rstrip('/')}/ckpt-{step:08d}"

    def url(self, step: int) -> str:
        """Where checkpoint ``step`` is, as the user wrote the root (for messages)."""
        return f"{self.root.rstrip('/')}/ckpt-{step:08d}"

    def _scan(self) -> list[tuple[int, bool]]:
        """``(step, complete)`` for every checkpoint directory, ascending."""
        try:
            self._fs.invalidate_cache(self._path)  # listing caches (s3, gcs) go stale
            entries = self._fs.ls(self._path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for e in entries:
            if e.get("type") != "directory":
                continue
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            m = _DIR_RE.fullmatch(name)
            if not m or name != f"ckpt-{int(m.group(1)):08d}":  # one spelling per step
                continue
            step = int(m.group(1))
            found.append((step, self._fs.exists(f"{self._dir(step)}/{MANIFEST}")))
        return sorted(found)

    def _retain(self, saved: int) -> None:
        """Drop complete checkpoints beyond the newest ``keep`` and stale incomplete ones.

        The step just saved is never dropped, even when it is older than ``keep`` others
        (a job that rolled back), nor is any checkpoint a kept delta depends on. Incomplete
        directories newer than it are left alone: they may be a save in progress. Failures
        are logged, not raised: the save succeeded.
        """
        scan = self._scan()
        complete = [s for s, c in scan if c]
        kept = set(complete[-self.keep :]) | {saved}
        for s in sorted(kept):
            try:
                kept.update(self.chain(s))
            except CheckpointError:  # cannot tell what it needs: keep everything older
                kept.update(c for c in complete if c < s)
        doomed = [s for s in complete if s not in kept]
        doomed += [s for s, c in scan if not c and s < saved]
        for s in doomed:
            try:
                self._fs.rm(self._dir(s), recursive=True)
            except OSError as e:
                log.warning("%s: cannot remove old checkpoint (%s)", self.url(s), _one_line(e))

    def _cat(self, path: str, where: str, missing: str) -> bytes:
        """The bytes of ``path``; a one-line CheckpointError naming ``where`` otherwise."""
        try:
            return self._fs.cat_file(path)
        except FileNotFoundError:
            raise CheckpointError(f"{where}: {missing}") from None
        except OSError as e:
            raise CheckpointError(f"{where}: cannot read ({_one_line(e)})") from e

    def _read_manifest(self, step: int) -> Manifest:
        """Read and validate a manifest; every problem is a one-line CheckpointError."""
        where = f"{self.url(step)}/{MANIFEST}"
        raw = self._cat(f"{self._dir(step)}/{MANIFEST}", where, "missing (no such checkpoint, or an interrupted save)")
        try:
            m = json.loads(raw)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise CheckpointError(f"{where}: not valid JSON ({_one_line(e)})") from None
        try:
            return check_manifest(m, step)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None

    def _open_write(self, path: str) -> Any:
        return open(path, "wb") if self._local else self._fs.open(path, "wb")

    def _write(self, path: str, data: bytes | memoryview) -> None:
        with self._open_write(path) as f:
            f.write(data)
            if self._local:
                f.flush()
                os.fsync(f.fileno())

    def _fsync_dir(self, path: str) -> None:
        """Make a local directory's entries durable (no-op elsewhere or where unsupported)."""
        if not self._local:
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


# -- helpers ----------------------------------------------------------------------------


def _check_step(step: Any) -> int:
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
    return int(step)


def _one_line(e: BaseException) -> str:
    """An exception's text on one line, capped: error messages here are log lines."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _load_error(e: BaseException) -> str:
    """torch.load's failure in one line.

    A weights_only refusal is reduced to its cause: torch's text is several paragraphs
    (with terminal escapes) that suggest retrying with weights_only=False, which is
    exactly what must not be done with a checkpoint that fails here.
    """
    text = _ANSI_RE.sub("", str(e))
    marker = "WeightsUnpickler error:"
    if marker in text:
        cause = text.split(marker, 1)[1].strip().split("\n\n", 1)[0]
        cause = " ".join(cause.split())
        cause = cause.split(". ", 1)[0].rstrip(".")
        return f"not a plain tensor archive, refused by weights_only=True: {cause}"
    return f"{type(e).__name__}: {_one_line(Exception(text))}"
