"""Local directories the CLI and the driver write to, checked before any work starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dlrover.errors import DLRoverError


def out_dir(path: str) -> str:
    """Create ``path`` (an output directory) now, so a bad one fails before hours of work."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DLRoverError(f"{path}: cannot create output directory: {e.strerror or e}") from None
    return path


def is_url(path: str) -> bool:
    """An fsspec URL (``s3://...``) rather than a local path (``file://`` counts as local)."""
    return "://" in path and not path.startswith("file://")


def check_creatable_dir(path: str, field: str) -> None:
    """Raise a one-line :class:`DLRoverError` naming ``field`` unless ``path`` is, or can
    be created as, a directory this process writes into. Nothing is left behind: the
    nearest existing ancestor gets a probe directory that is removed at once (``os.access``
    alone says yes to root on a read-only file system)."""
    target = Path(os.path.expanduser(path.removeprefix("file://"))).absolute()
    base = target
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise DLRoverError(f"{field}: {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise DLRoverError(f"{field}: {path}: {base} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dlrover-probe-", dir=base))
    except OSError as e:
        raise DLRoverError(f"{field}: {path}: cannot create a directory in {base}: {e.strerror or e}") from None
