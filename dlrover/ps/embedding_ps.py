"""EmbeddingPS: one embedding parameter server, a Ray actor holding some vshards of every table.

It runs fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (TBE) on CPU with the optimizer
fused into backward: a ``pull`` runs the TBE forward and keeps its autograd graph; the
matching ``push`` feeds the pooled-output gradient into that graph, and TBE's backward
updates the touched rows in place (exact row-wise Adagrad by default). Nothing on the PS
ever materialises a dense gradient of a table.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import numpy as np
import psutil
import torch

from dlrover.chaos import ChaosState
from dlrover.checkpoint.delta import ChangedRows
from dlrover.metrics.process import owned_rss_mb
from dlrover.preemption import on_sigterm
from dlrover.ps.applied import AppliedLog, BatchId
from dlrover.ps.delta import CutTracker, report
from dlrover.ps.migration import DirtyRows, apply_dirty, copy_blocks, copy_dirty_local, export_blocks, export_dirty
from dlrover.ps.routing import nonempty_bags
from dlrover.ps.shm import Attached, ShmSlice
from dlrover.ps.tables import init_rows, new_tbe
from dlrover.ps.vshard import VShardMap

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class EmbeddingPS:
    """Serves pooled partial embeddings of the vshards it owns (see ``dlrover.ps.vshard``)."""

    def __init__(
        self,
        ps_index: int,  # the PS id (stable across migrations; owners in ``vmap``)
        vmap: VShardMap,
        dim: int,
        optimizer: dict,
        seed: int = 0,
        threads: int = 1,
        master: Any = None,  # told of a SIGTERM (a preemption notice), with this PS's ``name``
        name: str = "",
    ) -> None:
        torch.set_num_threads(max(1, threads))
        if master is not None:
            on_sigterm(lambda: master.preempted.remote(name))
        self.index = ps_index
        self.vmap = vmap
        self.dim = dim
        self._optimizer = dict(optimizer)
        self.tbe = self._new_tbe(vmap.local_table_sizes(ps_index))
        with torch.no_grad():
            for t, w in enumerate(self.tbe.split_embedding_weights()):
                rows = vmap.global_rows(ps_index, t)
                valid = rows >= 0
                w.zero_()
                w[torch.from_numpy(np.flatnonzero(valid))] = init_rows(seed, t, vmap.table_sizes[t], dim, rows[valid])
        self._pending: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._dropped: set[str] = set()  # workers gone: their late pulls keep no graph
        self._lock = threading.Lock()
        # ids: ids looked up by pulls plus ids updated by pushes, the work busy_s was spent on
        self._stats = {"pulls": 0, "pushes": 0, "ids": 0, "rows_updated": 0, "duplicates": 0, "busy_s": 0.0}
        self.applied = AppliedLog()  # batches applied: a batch pushed again is skipped
        self._started = time.monotonic()
        self._proc = psutil.Process()
        self._prepared: tuple | None = None  # (vmap version, thread, {"tbe": ..., "bytes": ...}) from prepare()
        self._dirty: DirtyRows | None = None  # rows pushed since track()
        self._cut_tracker: CutTracker | None = None  # rows pushed since the last cut (durable deltas)
        import ray

        self._node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        self.chaos = ChaosState()
        self._segments = Attached()  # workers' shared memory on this node

    def _new_tbe(self, sizes: list[int]):
        return new_tbe(sizes, self.dim, self._optimizer)

    # -- hot path ---------------------------------------------------------------------
    def pull(self, key: tuple, indices: np.ndarray, offsets: np.ndarray | None, train: bool = True, room: ShmSlice | None = None) -> np.ndarray | ShmSlice:
        """Pooled partial sums of the non-empty bags.

        With ``offsets``: ``[num_nonempty_bags, D]`` in table-major bag order. Without
        (every bag holds exactly one id, the common Criteo case): TBE's own output
        ``[batch, T*D]`` untouched, so neither side copies or reorders it. ``room``: a
        worker's shared memory on this node to write the answer into (``dlrover.ps.shm``).
        """
        t0 = time.perf_counter()
        self.chaos.before_call()
        t1 = time.perf_counter()
        idx = torch.as_tensor(indices)
        if offsets is None:
            off, nz = torch.arange(idx.numel() + 1, dtype=torch.int64), None
        else:
            off = torch.as_tensor(offsets)
            nz = nonempty_bags(off)
        if train and key[0] not in self._dropped:
            out = self.tbe(idx, off)
            with self._lock:
                self._pending[key] = (out, nz, idx, None if offsets is None else off)
        else:
            with torch.no_grad():
                out = self.tbe(idx, off)
        out = out.detach()
        if nz is not None:
            num_tables = len(self.vmap.table_sizes)
            out = out.view(out.shape[0], num_tables, self.dim).transpose(0, 1).reshape(-1, self.dim)[nz]
        self._stats["pulls"] += 1
        self._stats["ids"] += idx.numel()
        self.chaos.after_step(time.perf_counter() - t1)
        self._stats["busy_s"] += time.perf_counter() - t0  # the whole call, injected faults included
        return out.numpy() if room is None else self._segments.put(room, out.numpy())

    def push(self, key: tuple, grad: np.ndarray | ShmSlice, batch: BatchId | None = None) -> int:
        """Apply the gradient of a pulled batch (fused optimizer update), in the layout
        ``pull`` returned (or in a worker's shared memory). Returns the number of bags
        updated: 0 for a ``batch`` this PS applied before (a replacement worker pushing
        again what a dead one had pushed)."""
        t0 = time.perf_counter()
        self.chaos.before_call()
        if isinstance(grad, ShmSlice):
            grad = self._segments.view(grad)
        with self._lock:
            out, nz, idx, off = self._pending.pop(key)
            if batch is not None and not self.applied.first_time(BatchId(*batch)):
                self._stats["duplicates"] += 1
                return 0
        num_tables = len(self.vmap.table_sizes)
        batch = out.shape[0]
        if nz is None:
            out.backward(torch.as_tensor(grad))
            bags = batch * num_tables
        else:
            g = torch.zeros(num_tables * batch, self.dim)
            g[nz] = torch.as_tensor(grad)
            out.backward(g.view(num_tables, batch, self.dim).transpose(0, 1).reshape(batch, num_tables * self.dim))
            bags = int(nz.numel())
        rows = (len(off) - 1) // num_tables if off is not None else batch
        if self._dirty is not None:
            self._dirty.mark(idx, off, rows)
        if self._cut_tracker is not None:
            self._cut_tracker.mark(self.tbe, idx, off, rows)
        self._stats["pushes"] += 1
        self._stats["ids"] += idx.numel()
        self._stats["rows_updated"] += bags
        self._stats["busy_s"] += time.perf_counter() - t0
        return bags

    def release(self, segment: str) -> None:
        """A worker is done with its shared-memory ``segment``: unmap it here."""
        self._segments.release(segment)

    def forget(self, shards: list[int]) -> None:
        """These shards are done: their batches leave the applied log."""
        with self._lock:
            self.applied.forget(shards)

    def drop(self, key_prefix) -> int:
        """Forget pulled-but-never-pushed batches of a worker (it died or was removed)."""
        with self._lock:
            self._dropped.add(key_prefix)
            stale = [k for k in self._pending if k[0] == key_prefix]
            for k in stale:
                del self._pending[k]
        return len(stale)

    # -- migration (see dlrover.ps.migration) -------------------------------------------
    # Round 1, training goes on: track() on every PS, export_vshards() on the old owners,
    # prepare() on every PS of the new map (new tables filled from its own kept blocks and
    # the exports), prepared() polled. Round 2, workers paused: export_vshards(dirty_only)
    # and reconfigure() copy only the rows pushed since track().
    def _table_arrays(self, tbe) -> list[list[torch.Tensor]]:
        """Per table: [weights, *optimizer states] as writable views into ``tbe``."""
        weights = tbe.split_embedding_weights()
        states = [] if self._optimizer["name"] == "sgd" else tbe.split_optimizer_states()
        return [[w.detach(), *(states[t] if states else [])] for t, w in enumerate(weights)]

    def track(self) -> None:
        """Start recording which local rows pushes update."""
        self._dirty = DirtyRows(self.vmap.local_table_sizes(self.index))

    def export_vshards(self, vshards: list[int], dirty_only: bool = False) -> dict:
        """Weights and optimizer state of owned ``vshards`` for their new owner: whole blocks,
        or (``dirty_only``) the rows updated since ``track()``."""
        vs = np.asarray(sorted(vshards), dtype=np.int64)
        if len(vs) and np.any(self.vmap.owner[vs] != self.index):
            raise ValueError(f"ps-{self.index} does not own all of vshards {vs.tolist()}")
        slots = np.searchsorted(self.vmap.owned(self.index), vs)
        arrays, rpv = self._table_arrays(self.tbe), self.vmap.rows_per_vshard()
        if dirty_only:
            if self._dirty is None:
                raise RuntimeError(f"ps-{self.index}: dirty rows asked for without track()")
            return {"vshards": vs, "dirty": export_dirty(arrays, self._dirty, slots, rpv)}
        return {"vshards": vs, "tables": export_blocks(arrays, slots, rpv)}

    def prepare(self, vmap: VShardMap, incoming: list[Any]) -> None:
        """Round 1: build the tables of ``vmap`` on a background thread (pulls and pushes
        go on meanwhile) from this PS's kept blocks and the full ``incoming`` payloads."""
        import ray

        def build() -> None:
            try:
                payloads = [p if isinstance(p, dict) else ray.get(p) for p in incoming]
                tbe = self._new_tbe(vmap.local_table_sizes(self.index))
                box["bytes"] = self._fill(tbe, vmap, payloads)
                box["tbe"] = tbe
            except Exception as e:  # reported by prepared()
                box["error"] = f"{type(e).__name__}: {e}"

        box: dict = {}
        if np.array_equal(vmap.owned(self.index), self.vmap.owned(self.index)):
            self._prepared = None  # nothing moves in or out of this PS
            return
        thread = threading.Thread(target=build, name="vshard-precopy", daemon=True)
        thread.start()
        self._prepared = (vmap.version, thread, box)

    def prepared(self) -> bool | str:
        """True once the new tables are built; an error message if building them failed."""
        if self._prepared is None:
            return True
        if self._prepared[1].is_alive():
            return False
        return self._prepared[2].get("error", True)

    def cancel_migration(self) -> None:
        """Drop the tables prepared for a migration that will not happen, stop tracking."""
        if self._prepared is not None:
            self._prepared[1].join()
        self._prepared, self._dirty = None, None

    def _fill(self, tbe, vmap: VShardMap, payloads: list[dict], keep: bool = True) -> int:
        """Copy into ``tbe`` (laid out for ``vmap``) the kept blocks (``keep``) and the
        payloads' blocks."""
        rpv = vmap.rows_per_vshard()
        new_owned = list(vmap.owned(self.index))
        new_slot = {int(v): i for i, v in enumerate(new_owned)}
        dst = self._table_arrays(tbe)
        old_slot = {int(v): i for i, v in enumerate(self.vmap.owned(self.index))}
        kept = [v for v in new_slot if v in old_slot] if keep else []
        copy_blocks(dst, np.array([new_slot[v] for v in kept]), self._table_arrays(self.tbe), np.array([old_slot[v] for v in kept]), rpv)
        nbytes, have = 0, set(kept)
        for p in payloads:  # a payload may also hold vshards going to other PS
            mine = [(i, int(v)) for i, v in enumerate(p["vshards"]) if int(v) in new_slot]
            nbytes += copy_blocks(dst, np.array([new_slot[v] for _, v in mine]), p["tables"], np.array([i for i, _ in mine]), rpv)
            have.update(v for _, v in mine)
        missing = sorted(set(new_slot) - have)
        if missing:
            raise RuntimeError(f"ps-{self.index}: no data for vshards {missing}")
        return nbytes

    def reconfigure(self, vmap: VShardMap, incoming: list[Any]) -> dict:
        """Switch to ``vmap`` (workers paused: nothing pulled-but-not-pushed).

        After ``prepare(vmap)``: ``incoming`` are dirty payloads, and the rows of kept
        vshards updated since ``track()`` are copied over too. Without: ``incoming`` are
        full payloads and the whole switch happens now. The fused optimizer's state moves
        with the weights, so training goes on exactly where it stopped.
        """
        import ray

        t0 = time.perf_counter()
        with self._lock:
            # Live workers are parked with every push applied: a pull still pending here
            # belongs to a worker that died mid-step (its shard is trained again).
            orphans = len(self._pending)
            self._pending.clear()
        if np.array_equal(vmap.owned(self.index), self.vmap.owned(self.index)):
            self.vmap, self._prepared, self._dirty = vmap, None, None  # same slots: only the version moves
            return {"bytes_in": 0, "bytes_precopied": 0, "recv_s": 0.0, "copy_s": 0.0, "orphan_pulls": orphans}
        payloads = [p if isinstance(p, dict) else ray.get(p) for p in incoming]
        t_recv = time.perf_counter()
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] == vmap.version:
            prepared[1].join()
            if "tbe" not in prepared[2]:
                raise RuntimeError(f"ps-{self.index}: preparing the new tables failed")
            tbe, precopied = prepared[2]["tbe"], prepared[2]["bytes"]
            rpv = vmap.rows_per_vshard()
            new_slot = {int(v): i for i, v in enumerate(vmap.owned(self.index))}
            old_to_new = {i: new_slot[int(v)] for i, v in enumerate(self.vmap.owned(self.index)) if int(v) in new_slot}
            dst = self._table_arrays(tbe)
            copy_dirty_local(dst, self._table_arrays(self.tbe), self._dirty, old_to_new, rpv)
            nbytes = sum(apply_dirty(dst, new_slot, p["vshards"], p["dirty"], rpv) for p in payloads)
        else:
            tbe = self._new_tbe(vmap.local_table_sizes(self.index))
            precopied, nbytes = 0, self._fill(tbe, vmap, payloads)
        self.tbe, self.vmap, self._dirty = tbe, vmap, None
        done = time.perf_counter()
        return {"bytes_in": nbytes, "bytes_precopied": precopied, "recv_s": t_recv - t0, "copy_s": done - t_recv, "orphan_pulls": orphans}

    # -- checkpoints (see dlrover.master.checkpoint) -------------------------------------
    def snapshot(self) -> tuple[int, dict]:
        """``(bytes, payload)``: every owned vshard (weights + optimizer state) as one
        export payload, taken with the workers parked. The payload is views of the live
        tables; called with ``options(num_returns=2)``, Ray copies it into the object store
        (owned by the caller) before the call completes, so a consistent cut costs one
        copy and this PS never holds its tables twice."""
        with self._lock:
            owned = self.vmap.owned(self.index)
            tables = export_blocks(self._table_arrays(self.tbe), np.arange(len(owned)), self.vmap.rows_per_vshard())
        return int(sum(a.nbytes for t in tables for a in t)), {"vshards": owned.astype(np.int64), "tables": tables}

    def restore(self, vmap: VShardMap, payloads: list[Any]) -> int:
        """Roll back to a checkpoint: rebuild the tables of ``vmap`` from full payloads
        (they may come from PS that no longer exist, under an older map). Pulls not pushed
        yet are dropped: the workers that made them restart from the checkpoint too."""
        import ray

        payloads = [p if isinstance(p, dict) else ray.get(p) for p in payloads]
        tbe = self._new_tbe(vmap.local_table_sizes(self.index))
        nbytes = self._fill(tbe, vmap, payloads, keep=False)
        with self._lock:
            self._pending.clear()
            self.applied.clear()  # batches after the checkpoint's cut are pushed again
            self.tbe, self.vmap, self._prepared, self._dirty = tbe, vmap, None, None
        return nbytes

    # -- state --------------------------------------------------------------------------
    def table_rows(self, table: int) -> tuple[np.ndarray, np.ndarray]:
        """(global row ids, weights) of the rows of ``table`` this PS owns."""
        rows = self.vmap.global_rows(self.index, table)
        valid = np.flatnonzero(rows >= 0)
        w = self.tbe.split_embedding_weights()[table].detach()[torch.from_numpy(valid)]
        return rows[valid], w.numpy().copy()

    def set_table_rows(self, table: int, global_rows: np.ndarray, weights: np.ndarray) -> None:
        """Overwrite owned rows of ``table`` (tests, checkpoint restore)."""
        v, rpv = self.vmap.num_vshards, self.vmap.rows_per_vshard()[table]
        owner = self.vmap.owner[global_rows % v]
        if np.any(owner != self.index):
            raise ValueError(f"ps-{self.index} does not own all of these rows of table {table}")
        slot = np.searchsorted(self.vmap.owned(self.index), global_rows % v)
        local = slot * rpv + global_rows // v
        with torch.no_grad():
            self.tbe.split_embedding_weights()[table][torch.from_numpy(local)] = torch.as_tensor(weights)

    def set_chaos(self, slowdown: float | None = None, leak_mb_per_s: float | None = None, delay_ms: float | None = None) -> None:
        """Fault injection (the spec's ``chaos:``): serve slower, leak memory, or answer late."""
        self.chaos.set(slowdown, leak_mb_per_s, delay_ms)

    def stats(self) -> dict:
        s = dict(self._stats)
        s["pending"] = len(self._pending)
        s["applied_log"] = self.applied.entries()
        s["uptime_s"] = time.monotonic() - self._started
        s["pid"] = os.getpid()
        s["node_id"] = self._node
        s["rss_mb"] = owned_rss_mb(self._proc)
        s["cpu_percent"] = self._proc.cpu_percent()
        return s

    # -- durable checkpoint deltas --
    def cut_changes(self) -> ChangedRows:
        """The global rows pushed since the previous cut (:mod:`dlrover.ps.delta`), for the
        master's next durable delta; called at every cut, with the workers parked."""
        with self._lock:
            ended = self._cut_tracker
            self._cut_tracker = CutTracker(self.vmap, self.index, self.tbe)
        return report(ended, self.vmap, self.tbe)
