"""A checkpoint's manifest (``manifest.json``): what was written, with the checksums that
every load verifies.

The store writes it last, so its presence marks a complete checkpoint. Reading it checks
every field, so a truncated or hand-edited manifest is one clear message rather than a
KeyError deep inside a load (and a forged file key cannot reach outside the directory).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from dlrover.checkpoint.archive import LeafPath

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
KEY_RE = re.compile(r"[A-Za-z0-9_-]+")  # a file key: also its file name, <key>.pt
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_MANIFEST_FIELDS = ("version", "step", "created", "meta", "meta_sha256", "files")
_FILE_FIELDS = ("sha256", "bytes", "numpy", "numpy_scalars")


@dataclass(frozen=True)
class FileEntry:
    """One data file as the manifest records it."""

    sha256: str
    nbytes: int
    numpy: list[LeafPath]  # positions of numpy arrays stored as tensors
    numpy_scalars: list[LeafPath]  # positions of numpy scalars stored as 0-d tensors


@dataclass(frozen=True)
class Manifest:
    step: int
    meta: dict
    files: dict[str, FileEntry]


def canonical_meta(meta: Any) -> str:
    """The JSON that ``meta_sha256`` hashes: sorted keys, no whitespace. A TypeError or
    ValueError when ``meta`` is not a JSON-serialisable dict."""
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        return json.dumps(meta, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta is not JSON-serialisable: {e}") from e


def manifest_json(step: int, meta_json: str, files: dict[str, FileEntry]) -> bytes:
    """The manifest of checkpoint ``step`` as written; ``meta_json`` from :func:`canonical_meta`."""
    manifest = {
        "version": FORMAT_VERSION,
        "step": step,
        "created": time.time(),
        "meta": json.loads(meta_json),
        "meta_sha256": hashlib.sha256(meta_json.encode()).hexdigest(),
        "files": {
            key: {"sha256": e.sha256, "bytes": e.nbytes, "numpy": [list(p) for p in e.numpy],
                  "numpy_scalars": [list(p) for p in e.numpy_scalars]}
            for key, e in files.items()
        },
    }
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def check_manifest(m: Any, step: int) -> Manifest:
    """The parsed JSON of the manifest of checkpoint ``step``, validated; a ValueError
    saying what is wrong otherwise (the caller adds which file)."""
    if not isinstance(m, dict):
        raise ValueError("not a JSON object")
    missing = [f for f in _MANIFEST_FIELDS if f not in m]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if m["version"] != FORMAT_VERSION:
        raise ValueError(f"unsupported format version {m['version']!r} (expected {FORMAT_VERSION})")
    if type(m["step"]) is not int or m["step"] != step:
        raise ValueError(f"step {m['step']!r} does not match directory step {step}")
    if not isinstance(m["meta"], dict):
        raise ValueError("meta is not a JSON object")
    if hashlib.sha256(canonical_meta(m["meta"]).encode()).hexdigest() != m["meta_sha256"]:
        raise ValueError("meta checksum mismatch (corrupt or edited manifest)")
    if not isinstance(m["files"], dict):
        raise ValueError("files is not a JSON object")
    return Manifest(step, m["meta"], {key: _file_entry(key, entry) for key, entry in m["files"].items()})


def _file_entry(key: str, entry: Any) -> FileEntry:
    if not KEY_RE.fullmatch(key):  # also stops path traversal via a forged key
        raise ValueError(f"bad file key {key!r}")
    if not isinstance(entry, dict) or any(f not in entry for f in _FILE_FIELDS):
        raise ValueError(f"files.{key}: needs fields {', '.join(_FILE_FIELDS)}")
    if not isinstance(entry["sha256"], str) or not _SHA_RE.fullmatch(entry["sha256"]):
        raise ValueError(f"files.{key}.sha256 is not a sha256 hex digest")
    if type(entry["bytes"]) is not int or entry["bytes"] < 0:
        raise ValueError(f"files.{key}.bytes is not a byte count")
    for name in ("numpy", "numpy_scalars"):
        paths = entry[name]
        if not isinstance(paths, list) or not all(
            isinstance(p, list) and all(isinstance(k, (str, int)) for k in p) for p in paths
        ):
            raise ValueError(f"files.{key}.{name} is not a list of leaf paths")
    return FileEntry(
        entry["sha256"], entry["bytes"], [tuple(p) for p in entry["numpy"]], [tuple(p) for p in entry["numpy_scalars"]]
    )


class HashingWriter:
    """A write-only file that hashes and counts what goes through it (``torch.save``
    streams into it, so a large file is checksummed without a second read).

    ``drop_cache_every`` (a local file): every that many bytes, what was written is
    synced and dropped from the page cache. A checkpoint is not read back soon, and
    gigabytes of dirty pages would count against the node's memory meanwhile."""

    def __init__(self, f: Any, drop_cache_every: int = 0) -> None:
        self.f, self.sha, self.nbytes = f, hashlib.sha256(), 0
        self.drop_cache_every, self._dropped_at = drop_cache_every, 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.nbytes += view.nbytes
        self.f.write(view)
        if self.drop_cache_every and self.nbytes - self._dropped_at >= self.drop_cache_every:
            self.drop_cache()
        return view.nbytes

    def flush(self) -> None:
        self.f.flush()

    def drop_cache(self) -> None:
        """Sync the file's data to disk, then drop its pages from the page cache."""
        self.f.flush()
        os.fsync(self.f.fileno())
        if hasattr(os, "posix_fadvise"):  # not on macOS: synced only
            os.posix_fadvise(self.f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        self._dropped_at = self.nbytes


def check_key(key: Any) -> str:
    """``key`` if it can name a checkpoint file (it is also the file's name), else a ValueError."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise ValueError(f"checkpoint file key {key!r}: must match [A-Za-z0-9_-]+")
    return key


def check_keys_case(keys: Any) -> None:
    """A ValueError when two keys differ only in case (one file on case-folding systems)."""
    if len({k.lower() for k in keys}) != len(keys):
        raise ValueError(f"checkpoint file keys differ only in case: {sorted(keys)}")
