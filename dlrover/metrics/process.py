"""What an actor's memory is, for its limit and its metrics."""

from __future__ import annotations

import psutil


def owned_rss_mb(proc: psutil.Process) -> float:
    """Resident memory the process owns: its RSS less file-backed and shared-memory pages.

    Every process that writes or reads a Ray object maps the object store's pages and has
    them counted in its RSS (a PS whose tables were just copied into an in-memory
    checkpoint looks twice its size), but they are the object store's memory, bounded by
    its own limit; a per-actor memory limit, like a container's, must not count them.
    """
    m = proc.memory_info()
    return (m.rss - getattr(m, "shared", 0)) / 2**20
