"""Removing an actor from the job and starting its replacement, written once for every
path that does it (a failure, a rollback, a partial recovery, a drain, a scale-in).

A replacement gets its predecessor's size, with more memory when the master killed the
predecessor over its memory limit (``memory_after_oom``: the policy's raise).
"""

from __future__ import annotations

import numpy as np

from dlrover.master.job import Job


def replacement_size(m: Job, name: str, default: tuple) -> tuple:
    """``(CPUs, memory MB)`` for the replacement of actor ``name`` (``default`` when the
    launcher has no record of it)."""
    size = m.launcher.resources.get(name, default)
    if name in m.recovery.oom_killed and m.control is not None:
        size = (size[0], m.control.memory_after_oom(size[1]))
    return size


def remove_worker(m: Job, name: str) -> None:
    """Worker ``name`` leaves the job: its actor is killed, the PS stop waiting for it,
    and the policy forgets its measurements."""
    m.launcher.forget_worker(name)
    if m.control is not None:
        m.control.forget(name)


def replace_workers(m: Job, names: set[str], drop: frozenset[str] = frozenset()) -> None:
    """Forget these workers and start one of the same size for each (none for ``drop``)."""
    lz = m.launcher
    for name in names:
        if name in lz.workers:
            size = replacement_size(m, name, (None, None))
            remove_worker(m, name)
            if name not in drop:
                lz.add_worker(*size)


def replace_ps(m: Job, ids: tuple[int, ...]) -> tuple[np.ndarray, dict[int, int]]:
    """Start (or take from the spares) a PS of the same size (more memory after an OOM
    kill) for each lost one in
    ``ids``: the owner array with each replacement taking exactly its predecessor's
    vshards, and which replaced which."""
    lz = m.launcher
    owner, replaced = lz.vmap.owner.copy(), {}
    for k in ids:
        size = replacement_size(m, lz.ps_name(k), (lz.spec.resources.ps_cpu, lz.spec.resources.ps_memory_mb))
        lz.remove_ps(k)
        spare = lz.take_spare_ps(*size)  # pre-started (policy.standby): no start-up to wait for
        replaced[k] = spare if spare is not None else lz.add_ps(*size)
        owner[owner == k] = replaced[k]
    return owner, replaced
