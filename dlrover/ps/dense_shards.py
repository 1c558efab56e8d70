"""DenseShards: the job's dense PS as ``n`` actors, each owning a contiguous slice of the
flat dense vector.

Every worker pushes its step's gradient to all shards at once and each applies its slice
independently (its own optimizer over its slice, its own applied log): the optimizers
are element-wise, so n shards compute exactly what one would, while the work of several
workers' pushes spreads over n actors instead of queueing on one. A checkpoint holds the
merged state (the same format for any ``n``), split again on restore, so a job may come
back with another shard count.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import ray

from dlrover.ps.dense_rounds import RoundRule
from dlrover.ps.ps_stats import DenseStats


def shard_bounds(size: int, n: int) -> tuple[int, ...]:
    """``n + 1`` offsets cutting ``size`` elements into ``n`` near-equal slices."""
    if not 1 <= n <= size:
        raise ValueError(f"cannot cut {size} dense parameters into {n} shards")
    return tuple(int(x) for x in np.linspace(0, size, n + 1).round().astype(np.int64))


def split_state(state: dict, bounds: tuple[int, ...]) -> list[dict]:
    """A merged dense state (``DenseParamServer.state()`` of the whole vector) cut into
    one state per shard: per-element arrays are sliced, scalars (an optimizer's step
    count) copied."""
    size = bounds[-1]

    def cut(v: Any, lo: int, hi: int) -> Any:
        a = np.asarray(v) if v is not None else None
        return a[lo:hi] if a is not None and a.ndim >= 1 and a.shape[0] == size else v

    return [
        {
            "param": np.asarray(state["param"])[lo:hi],
            "version": state["version"],
            "opt_state": {k: cut(v, lo, hi) for k, v in (state.get("opt_state") or {}).items()},
        }
        for lo, hi in itertools.pairwise(bounds)
    ]


def merge_states(states: list[dict]) -> dict:
    """The inverse of :func:`split_state`: one state of the whole vector."""
    sizes = [len(s["param"]) for s in states]

    def join(key: str) -> Any:
        vals = [s["opt_state"][key] for s in states]
        per_element = all(np.ndim(v) >= 1 and np.shape(v)[0] == n for v, n in zip(vals, sizes))
        return np.concatenate(vals) if per_element else vals[0]

    keys = states[0]["opt_state"].keys() if states[0]["opt_state"] else []
    return {
        "param": np.concatenate([s["param"] for s in states]),
        "version": min(int(s["version"]) for s in states),
        "opt_state": {k: join(k) for k in keys},
    }


def start_dense_shards(
    flat: np.ndarray, optimizer: dict, names: list[str], rule: RoundRule | None = None, max_workers: int = 1,
    create: Callable[..., Any] | None = None, **options: Any,
) -> "DenseShards":  # fmt: skip
    """One ``DenseParamServer`` actor per name, each given its slice of ``flat``;
    ``rule``: how its rounds close (None: async); ``create(cls, *args, **options)``: makes
    an actor (default: Ray's; the master passes its cluster's); ``options``: actor options
    (CPUs, placement). In round mode a push waits in the server for its round, so each
    server gets a thread per worker it may ever have, and a few for other calls."""
    from dlrover.ps.dense_ps import DenseParamServer

    if create is None:
        def create(cls: type, *args: Any, **opts: Any) -> Any:
            return ray.remote(cls).options(**opts).remote(*args)

    bounds = shard_bounds(flat.size, len(names))
    threads = 1 if rule is None else 2 * max_workers + 4
    handles = tuple(
        create(DenseParamServer, flat[lo:hi], optimizer, 1, rule, name=n, max_concurrency=threads, **options)
        for n, (lo, hi) in zip(names, itertools.pairwise(bounds))
    )
    return DenseShards(handles, tuple(names), bounds)


@dataclass(frozen=True)
class DenseShards:
    """Handles and names of the dense PS shards; shard ``i`` owns ``[bounds[i], bounds[i+1])``.
    Passed by value to workers (handles pickle), replaced as a whole by a rollback."""

    handles: tuple[Any, ...]
    names: tuple[str, ...]
    bounds: tuple[int, ...]

    def by_name(self) -> dict[str, Any]:
        return dict(zip(self.names, self.handles))

    def slices(self) -> list[tuple[int, int]]:
        return list(itertools.pairwise(self.bounds))

    def pull(self, get: Callable[..., Any] = ray.get) -> np.ndarray:
        """The whole current vector. ``get``: how refs are resolved (the master passes
        its cluster's, a worker its own)."""
        return np.concatenate([reply[1] for reply in get([h.pull.remote() for h in self.handles])])

    def state(self, timeout_s: float | None = None, get: Callable[..., Any] = ray.get) -> dict:
        """The merged state (for a checkpoint; consistent only while workers are parked)."""
        return merge_states(get([h.state.remote() for h in self.handles], timeout=timeout_s))

    def set_state(self, state: dict, get: Callable[..., Any] = ray.get) -> None:
        get([h.set_state.remote(s) for h, s in zip(self.handles, split_state(state, self.bounds))])


def dense_summary(stats: list[DenseStats], mode: str) -> dict:
    """The run summary's dense figures from each shard's ``stats()``: updates applied per
    shard (one per batch trained), their minimum, and in round mode shard 0's rounds
    (optimizer steps) and late gradients dropped."""
    per_shard = [d.updates for d in stats]
    out: dict = {"dense_updates_per_shard": per_shard, "dense_updates": min(per_shard)}
    if mode != "async":
        out["dense_rounds"] = {"mode": mode, "rounds": stats[0].rounds, "ignored": stats[0].ignored}
    return out
