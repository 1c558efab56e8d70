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

Loads use ``torch.load(weights_only=True)``: a checkpoint is data, and a tampered or
foreign archive must not be able to run code. That limits leaves to tensors and plain
Python values, so numpy arrays and scalars are stored as tensors and turned back into
numpy on load (their positions are recorded in the manifest).
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

from dlrover.errors import DLRoverError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_DIR_RE = re.compile(r"ckpt-(\d{8,})")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# Exact types only: subclasses (IntEnum, np.float64 which subclasses float) would pickle
# as their own class, which weights_only=True refuses to load.
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MANIFEST_FIELDS = ("version", "step", "created", "meta", "meta_sha256", "files")
_FILE_FIELDS = ("sha256", "bytes", "numpy", "numpy_scalars")

Path = tuple  # a leaf's position: dict keys (str | int) and list/tuple indices


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

    # -- public API ---------------------------------------------------------------------

    def save(self, step: int, files: dict[str, Any], meta: dict) -> CheckpointInfo:
        """Write checkpoint ``step`` (data files, then the manifest), then apply retention.

        Everything is validated before anything is written, so a ValueError (bad key,
        unsupported leaf, meta not JSON-serialisable, step already saved) leaves the store
        untouched. An I/O failure raises CheckpointError and leaves at most an incomplete
        directory, which readers ignore.
        """
        t0 = time.perf_counter()
        step = _check_step(step)
        if not isinstance(files, dict):
            raise TypeError(f"files must be a dict of name -> object, got {type(files).__name__}")
        for key in files:
            if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
                raise ValueError(f"checkpoint file key {key!r}: must match [A-Za-z0-9_-]+")
        if len({k.lower() for k in files}) != len(files):  # would collide on macOS/Windows
            raise ValueError(f"checkpoint file keys differ only in case: {sorted(files)}")
        meta_json = _canonical_meta(meta)
        # Conversion shares tensor/array memory, so doing it all up front is cheap and
        # surfaces every unsupported leaf before the first byte is written.
        encoded: dict[str, tuple[Any, list, list]] = {}
        for key, obj in files.items():
            arrays: list = []
            scalars: list = []
            encoded[key] = (_encode(obj, (key,), arrays, scalars), arrays, scalars)

        d, url = self._dir(step), self._url(step)
        manifest_path = f"{d}/{MANIFEST}"
        try:
            if self._fs.exists(manifest_path):
                raise ValueError(f"{url}: checkpoint step {step} already exists")
            if self._fs.exists(d):  # left over from an interrupted save of this step
                self._fs.rm(d, recursive=True)
            self._fs.makedirs(d, exist_ok=True)
            self._fsync_dir(self._path)
            nbytes = 0
            entries: dict[str, dict] = {}
            for key, (obj, arrays, scalars) in encoded.items():
                buf = io.BytesIO()
                torch.save(obj, buf)
                with buf.getbuffer() as view:  # hash exactly the bytes written, no copy
                    sha = hashlib.sha256(view).hexdigest()
                    self._write(f"{d}/{key}.pt", view)
                    size = view.nbytes
                del buf
                nbytes += size
                entries[key] = {
                    "sha256": sha,
                    "bytes": size,
                    "numpy": [list(p[1:]) for p in arrays],
                    "numpy_scalars": [list(p[1:]) for p in scalars],
                }
            stored_meta = json.loads(meta_json)
            manifest = {
                "version": FORMAT_VERSION,
                "step": step,
                "created": time.time(),
                "meta": stored_meta,
                "meta_sha256": hashlib.sha256(meta_json.encode()).hexdigest(),
                "files": entries,
            }
            mdata = json.dumps(manifest, indent=1, sort_keys=True).encode()
            if self._local:  # atomic: a reader sees no manifest or the whole one
                tmp = f"{manifest_path}.tmp"
                self._write(tmp, mdata)
                self._fsync_dir(d)  # data file entries are durable before the manifest
                os.replace(tmp, manifest_path)
                self._fsync_dir(d)
            else:  # object stores publish a file whole on close
                self._write(manifest_path, mdata)
            nbytes += len(mdata)
        except OSError as e:
            raise CheckpointError(f"{url}: cannot write checkpoint ({_one_line(e)})") from e
        self._retain(step)
        return CheckpointInfo(
            path=url, step=step, nbytes=nbytes, write_s=time.perf_counter() - t0, meta=stored_meta
        )

    def list(self) -> list[int]:
        """Steps of complete checkpoints (manifest present, not verified), ascending."""
        return [s for s, complete in self._scan() if complete]

    def latest_step(self) -> int | None:
        """Newest complete step, or None. Cheap: it does not verify checksums."""
        steps = self.list()
        return steps[-1] if steps else None

    def load(self, step: int) -> tuple[dict, dict[str, Any]]:
        """Verify and load checkpoint ``step`` as ``(meta, files)``.

        Every file is checked against the manifest's size and sha256 before it is
        unpickled (with ``weights_only=True``). numpy leaves come back as numpy with
        their dtype; tensors are mapped to CPU. Raises CheckpointError on any problem.
        """
        step = _check_step(step)
        d, url = self._dir(step), self._url(step)
        manifest = self._read_manifest(step)
        files: dict[str, Any] = {}
        for key, entry in manifest["files"].items():
            where = f"{url}/{key}.pt"
            data = self._cat(f"{d}/{key}.pt", where, "missing (corrupt checkpoint)")
            if len(data) != entry["bytes"]:
                raise CheckpointError(
                    f"{where}: size {len(data)} != {entry['bytes']} (truncated or corrupt checkpoint)"
                )
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise CheckpointError(f"{where}: checksum mismatch (corrupt checkpoint)")
            try:
                obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as e:  # UnpicklingError, RuntimeError, ...: all mean unreadable
                raise CheckpointError(f"{where}: cannot load ({_load_error(e)})") from e
            arrays = {tuple(p) for p in entry["numpy"]}
            scalars = {tuple(p) for p in entry["numpy_scalars"]}
            if arrays or scalars:
                found: set = set()
                obj = _decode(obj, (), arrays, scalars, found, where)
                lost = (arrays | scalars) - found
                if lost:
                    raise CheckpointError(
                        f"{where}: numpy leaf {list(next(iter(lost)))} not found (corrupt checkpoint)"
                    )
            files[key] = obj
        return manifest["meta"], files

    def load_latest(self) -> tuple[int, dict, dict[str, Any], list[str]]:
        """Load the newest checkpoint that verifies: ``(step, meta, files, skipped)``.

        ``skipped`` holds one line per newer complete checkpoint that failed to verify, so
        the caller can log that it fell back. Raises CheckpointError if the root does not
        exist, holds no complete checkpoint, or none verifies.
        """
        if not self._fs.exists(self._path):
            raise CheckpointError(f"{self.root}: checkpoint directory does not exist")
        steps = self.list()
        if not steps:
            raise CheckpointError(f"{self.root}: no checkpoint found")
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

    def _url(self, step: int) -> str:
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
        (a job that rolled back). Incomplete directories newer than it are left alone: they
        may be a save in progress. Failures are logged, not raised: the save succeeded.
        """
        scan = self._scan()
        complete = [s for s, c in scan if c]
        doomed = [s for s in complete[: -self.keep] if s != saved]
        doomed += [s for s, c in scan if not c and s < saved]
        for s in doomed:
            try:
                self._fs.rm(self._dir(s), recursive=True)
            except OSError as e:
                log.warning("%s: cannot remove old checkpoint (%s)", self._url(s), _one_line(e))

    def _cat(self, path: str, where: str, missing: str) -> bytes:
        """The bytes of ``path``; a one-line CheckpointError naming ``where`` otherwise."""
        try:
            return self._fs.cat_file(path)
        except FileNotFoundError:
            raise CheckpointError(f"{where}: {missing}") from None
        except OSError as e:
            raise CheckpointError(f"{where}: cannot read ({_one_line(e)})") from e

    def _read_manifest(self, step: int) -> dict:
        """Read and validate a manifest; every problem is a one-line CheckpointError."""
        where = f"{self._url(step)}/{MANIFEST}"
        raw = self._cat(f"{self._dir(step)}/{MANIFEST}", where, "missing (no such checkpoint, or an interrupted save)")
        try:
            m = json.loads(raw)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise CheckpointError(f"{where}: not valid JSON ({_one_line(e)})") from None

        def bad(what: str) -> CheckpointError:
            return CheckpointError(f"{where}: {what}")

        if not isinstance(m, dict):
            raise bad("not a JSON object")
        missing = [f for f in _MANIFEST_FIELDS if f not in m]
        if missing:
            raise bad(f"missing field(s) {', '.join(missing)}")
        if m["version"] != FORMAT_VERSION:
            raise bad(f"unsupported format version {m['version']!r} (expected {FORMAT_VERSION})")
        if type(m["step"]) is not int or m["step"] != step:
            raise bad(f"step {m['step']!r} does not match directory step {step}")
        if not isinstance(m["meta"], dict):
            raise bad("meta is not a JSON object")
        meta_sha = hashlib.sha256(_canonical_meta(m["meta"]).encode()).hexdigest()
        if meta_sha != m["meta_sha256"]:
            raise bad("meta checksum mismatch (corrupt or edited manifest)")
        if not isinstance(m["files"], dict):
            raise bad("files is not a JSON object")
        for key, entry in m["files"].items():
            if not _KEY_RE.fullmatch(key):  # also stops path traversal via a forged key
                raise bad(f"bad file key {key!r}")
            if not isinstance(entry, dict) or any(f not in entry for f in _FILE_FIELDS):
                raise bad(f"files.{key}: needs fields {', '.join(_FILE_FIELDS)}")
            if not isinstance(entry["sha256"], str) or not _SHA_RE.fullmatch(entry["sha256"]):
                raise bad(f"files.{key}.sha256 is not a sha256 hex digest")
            if type(entry["bytes"]) is not int or entry["bytes"] < 0:
                raise bad(f"files.{key}.bytes is not a byte count")
            for field in ("numpy", "numpy_scalars"):
                paths = entry[field]
                if not isinstance(paths, list) or not all(
                    isinstance(p, list) and all(isinstance(k, (str, int)) for k in p) for p in paths
                ):
                    raise bad(f"files.{key}.{field} is not a list of leaf paths")
        return m

    def _write(self, path: str, data: bytes | memoryview) -> None:
        if self._local:
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            with self._fs.open(path, "wb") as f:
                f.write(data)

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


def _canonical_meta(meta: Any) -> str:
    """The JSON that ``meta_sha256`` hashes: sorted keys, no whitespace."""
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        return json.dumps(meta, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta is not JSON-serialisable: {e}") from e


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


def _fmt(path: Path) -> str:
    key, *rest = path
    return key + "".join(f"[{k!r}]" for k in rest)


def _encode(obj: Any, path: Path, arrays: list, scalars: list) -> Any:
    """Copy the structure with numpy leaves as tensors, recording where they were.

    dict/list/tuple subclasses become plain dict/list/tuple (weights_only cannot load
    arbitrary classes); anything else unsupported is a ValueError naming the leaf.
    """
    if isinstance(obj, torch.Tensor):
        return _compact(obj)
    if isinstance(obj, np.ndarray):
        arrays.append(path)
        return _array_to_tensor(obj, path)
    if isinstance(obj, np.generic):
        scalars.append(path)
        return _array_to_tensor(np.asarray(obj), path)
    if type(obj) in _SCALARS:
        return obj
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise ValueError(f"{_fmt(path)}: dict key {k!r} must be str or int")
            out[k] = _encode(v, (*path, k), arrays, scalars)
        return out
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, (*path, i), arrays, scalars) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise ValueError(
        f"{_fmt(path)}: unsupported value of type {type(obj).__name__} "
        "(use tensors, numpy, dict/list/tuple, int/float/bool/complex/str/bytes/None)"
    )


def _array_to_tensor(arr: np.ndarray, path: Path) -> torch.Tensor:
    if arr.dtype.kind not in "biufc":
        raise ValueError(f"{_fmt(path)}: numpy dtype {arr.dtype} cannot be stored as a tensor")
    if not arr.dtype.isnative:  # torch has no big-endian tensors: comes back native-endian
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        arr = arr.copy(order="C")
    try:
        return torch.from_numpy(arr)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"{_fmt(path)}: numpy dtype {arr.dtype} has no torch equivalent ({e})") from e


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A view of a bigger tensor is copied: torch.save writes the whole storage."""
    if t.layout is not torch.strided or t.device.type == "meta":
        return t
    if t.untyped_storage().nbytes() <= t.numel() * t.element_size():
        return t
    return t.detach().clone().requires_grad_(t.requires_grad)


def _decode(obj: Any, path: Path, arrays: set, scalars: set, found: set, where: str) -> Any:
    """Inverse of :func:`_encode`: tensors at recorded numpy positions become numpy."""
    if path in arrays or path in scalars:
        if not isinstance(obj, torch.Tensor):
            raise CheckpointError(f"{where}: numpy leaf {list(path)} is not a tensor (corrupt checkpoint)")
        found.add(path)
        a = obj.detach().numpy()
        return a[()] if path in scalars else a
    if isinstance(obj, dict):
        return {k: _decode(v, (*path, k), arrays, scalars, found, where) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_decode(v, (*path, i), arrays, scalars, found, where) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj
