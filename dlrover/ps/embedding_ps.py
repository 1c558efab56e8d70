"""EmbeddingPS: one embedding parameter server, a Ray actor holding some vshards of every table.

It runs fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (TBE) on CPU with the optimizer
fused into backward, its tables back to back in one TBE table (``PSTables``), so that a
request's bags go to TBE as they are, unpadded (``dlrover.ps.layout``). A ``pull`` runs
the TBE forward and keeps its autograd graph; the
matching ``push`` feeds the pooled-output gradient into that graph, and TBE's backward
updates the touched rows in place (exact row-wise Adagrad by default). Nothing on the PS
ever materialises a dense gradient of a table.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import psutil
import ray
import torch

from dlrover.faults.injected import ChaosState
from dlrover.checkpoint.incremental import ChangedRows
from dlrover.metrics.process import owned_rss_mb
from dlrover.faults.preemption import on_sigterm
from dlrover.ids import ProcessInfo
from dlrover.ps.applied import AppliedLog, BatchId
from dlrover.ps.checkpoint_rows import CutTracker, report
from dlrover.ps.dynamic import MAP_STATES
from dlrover.ps.dynamic_tables import DynamicCounts, DynamicTables, Translated
from dlrover.ps.migration import DirtyRows
from dlrover.ps.moves import PreCopy, Staged, VShardMoves
from dlrover.ps.ps_stats import PsCounters, PsStats
from dlrover.ps.layout import flat_batch, table_spans
from dlrover.ps.shm import Attached, ShmSlice
from dlrover.ps.tables import PSTables, init_rows
from dlrover.ps.vshard import VShardMap
from dlrover.table_spec import TableSpec

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


@dataclass
class Pulled:
    """A training pull waiting for its push: TBE's output (holding the autograd graph
    the gradient goes through, in the answer's layout) and the rows it read."""

    out: torch.Tensor
    rows: torch.Tensor  # the TBE batch's flat rows, for the dirty-row trackers
    pins: dict[int, np.ndarray]  # dynamic tables' rows held until the push
    ids: int = 0  # ids of the request (unadmitted ones too): its push updates their bags


class EmbeddingPS(VShardMoves):
    """Serves pooled partial embeddings of the vshards it owns (see ``dlrover.ps.vshard``)."""

    def __init__(
        self,
        ps_index: int,  # the PS id (stable across migrations; owners in ``vmap``)
        vmap: VShardMap,
        dim: int,
        optimizer: dict,
        seed: int = 0,
        master: Any = None,  # told of a SIGTERM (a preemption notice), with this PS's ``name``
        name: str = "",
        tables: dict[int, TableSpec] | None = None,  # the dynamic tables' settings, by index
    ) -> None:
        # One intra-op thread whatever ``ps_cpu`` is: a second made no pull or push faster
        # (128 to 8,192 rows, dim 16 and 64) and cost up to 2.3x the CPU; on shared cores
        # it slowed a whole job 4.6x (docs/PERFORMANCE.md, "One thread per PS").
        torch.set_num_threads(1)
        if master is not None:
            on_sigterm(lambda: master.preempted.remote(name))
        self.index = ps_index
        self.vmap = vmap
        self.dim = dim
        missing = sorted(set(vmap.dynamic) - set(tables or {}))
        if missing:
            raise ValueError(f"ps-{ps_index}: no TableSpec for dynamic table(s) {missing} of the vshard map")
        self._optimizer, self._seed, self._tables = dict(optimizer), seed, {t: tables[t] for t in vmap.dynamic}
        self.dyn_counts = DynamicCounts()  # kept across layouts: each new DynamicTables adds to it
        self.tbe, self.dyn = self._initial_tables(vmap, 0)
        self._pending: dict[tuple, Pulled] = {}
        self._dropped: set[str] = set()  # workers gone: their late pulls keep no graph
        self._lock = threading.Lock()
        # ids: ids looked up by pulls plus ids updated by pushes, the work busy_s was spent on
        self._stats = PsCounters()
        self.applied = AppliedLog()  # batches applied: a batch pushed again is skipped
        self._started = time.monotonic()
        self._proc = psutil.Process()
        self._prepared: PreCopy | None = None  # from prepare()
        self._staged: Staged | None = None  # from stage_switch()
        self._dirty: DirtyRows | None = None  # rows pushed since track()
        self._cut_tracker: CutTracker | None = None  # rows pushed since the last cut (durable deltas)
        self._node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        self.chaos = ChaosState()
        self._segments = Attached()  # workers' shared memory on this node

    def _new_tbe(self, sizes: list[int]) -> PSTables:
        return PSTables(sizes, self.dim, self._optimizer)

    def _new_dyn(self, vmap: VShardMap, clock: int) -> DynamicTables:
        """Empty id maps of the dynamic tables for ``vmap``, at the PS's ``clock``."""
        return DynamicTables(vmap, self.index, self._tables, self._seed, self.dim, clock, self.dyn_counts)

    def _initial_tables(self, vmap: VShardMap, clock: int) -> tuple[Any, DynamicTables]:
        """The job's starting state of this PS's vshards under ``vmap``: every row from
        its seed (``init_rows``), no optimizer state, empty id maps."""
        tbe = self._new_tbe(vmap.local_table_sizes(self.index))
        with torch.no_grad():
            for t, w in enumerate(tbe.split_embedding_weights()):
                rows = vmap.global_rows(self.index, t)
                valid = rows >= 0
                w.zero_()
                w[torch.from_numpy(np.flatnonzero(valid))] = init_rows(self._seed, t, vmap.table_sizes[t], self.dim, rows[valid])
        return tbe, self._new_dyn(vmap, clock)

    def _translate(self, idx: np.ndarray, offsets: np.ndarray | None, bags: np.ndarray | None, train: bool) -> Translated:
        """Map a request's dynamic ids to rows; reset the rows evicted, mark the map's changes."""
        spans = table_spans(len(idx), offsets, bags, len(self.vmap.table_sizes))
        tr = self.dyn.translate(idx, spans, train, self._reset_rows)
        for t, rows in tr.changed.items():
            if self._dirty is not None:
                self._dirty.mark_rows(t, rows)
            if self._cut_tracker is not None:
                self._cut_tracker.mark_rows(self.tbe, t, rows)
        return tr

    def _reset_rows(self, t: int, rows: np.ndarray) -> None:
        """Evicted rows of dynamic table ``t`` back to their initial values, no optimizer state.

        Written through ``.data``: TBE's autograd saved these tensors for the backward of
        every pull not pushed yet, and a tracked in-place write would bump their version
        and fail those pushes ("modified by an inplace operation"). The rows written are
        no pending pull's (the map pins them until their push)."""
        states = self._table_arrays(self.tbe, self.dyn)[t][: -MAP_STATES]
        r = torch.from_numpy(rows)
        states[0].data[r] = init_rows(self._seed, t, self.vmap.table_sizes[t], self.dim, self.vmap.global_rows(self.index, t)[rows])
        for a in states[1:]:
            a.data[r] = 0

    # -- hot path ---------------------------------------------------------------------
    def pull(
        self,
        key: tuple,
        indices: np.ndarray | ShmSlice,
        offsets: np.ndarray | ShmSlice | None,
        train: bool = True,
        room: ShmSlice | None = None,
        bags: np.ndarray | None = None,
    ) -> np.ndarray | ShmSlice:
        """Pooled partial sums of the request's bags (``dlrover.ps.layout``): with
        ``bags`` (bags per table, table-major; ``offsets`` None when each holds one id)
        ``[num_bags, D]`` in table-major bag order; without (every table the same number
        of one-id bags, the common Criteo case) TBE's ``[batch, T*D]``, whose row ``i``
        holds the ``i``-th bag of every table, so that a worker with one PS uses it as it
        is. ``room``: a worker's shared memory on this node to write the answer into
        (``dlrover.ps.shm``), where ``indices`` and ``offsets`` may be too (copied here:
        the slot is reused).
        """
        t0 = time.perf_counter()
        self.chaos.before_call()
        t1 = time.perf_counter()
        if isinstance(indices, ShmSlice):
            indices = self._segments.view(indices).copy()
        if isinstance(offsets, ShmSlice):
            offsets = self._segments.view(offsets).copy()
        num_ids, training = len(indices), train and key[0] not in self._dropped
        tr = self._translate(indices, offsets, bags, training) if self.dyn.maps else None
        tables = self.tbe  # the flat rows are of these tables' layout
        batch = flat_batch(tr.rows if tr is not None else indices, offsets, bags, tables.base)
        if training:
            out = tables(batch.indices, batch.offsets)
            with self._lock:
                self._pending[key] = Pulled(out, batch.indices, tr.pins if tr is not None else {}, num_ids)
        else:
            with torch.no_grad():
                out = tables(batch.indices, batch.offsets)
        out = out.detach()
        if batch.dropped is not None:
            out = out + self.dyn.defaults(batch.dropped, batch.bag_table)  # the unadmitted ids' default rows, outside the graph
        if bags is None:
            out = out.view(-1, len(self.vmap.table_sizes) * self.dim)
        self._stats.pulls += 1
        self._stats.ids += num_ids
        self.chaos.after_step(time.perf_counter() - t1)
        self._stats.busy_s += time.perf_counter() - t0  # the whole call, injected faults included
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
            p = self._pending.pop(key)
            if batch is not None and not self.applied.first_time(BatchId(*batch)):
                self._stats.duplicates += 1
                self.dyn.unpin(p.pins)
                return 0
        p.out.backward(torch.as_tensor(grad).view(p.out.shape))
        self.dyn.unpin(p.pins)  # only now: an evicted row must not take this batch's update
        if self._dirty is not None:
            self._dirty.mark(p.rows)
        if self._cut_tracker is not None:
            self._cut_tracker.mark(self.tbe, p.rows)
        bags = p.out.shape[0]
        self._stats.pushes += 1
        self._stats.ids += p.rows.numel()
        self._stats.rows_updated += bags
        self._stats.ids_updated += p.ids
        self._stats.busy_s += time.perf_counter() - t0
        return bags

    @ray.method(num_returns=2)
    def push_pull(self, push: tuple, *pull: Any) -> tuple[int, np.ndarray | ShmSlice]:
        """``push(*push)`` then ``pull(*pull)``, in one call: a worker sends a step's push with
        its next pull to this PS (half the calls, the same order). Two results: the
        push's and the pull's. Either failing fails both: a push that raised runs no
        pull, and a push applied before a pull raised still reads as failed, so the
        worker's progress stops before that batch (its repeat is skipped here)."""
        return self.push(*push), self.pull(*pull)

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
                self.dyn.unpin(self._pending.pop(k).pins)
        return len(stale)

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
        local = self.vmap.slot[global_rows % v] * rpv + global_rows // v
        with torch.no_grad():
            self.tbe.split_embedding_weights()[table][torch.from_numpy(local)] = torch.as_tensor(weights)

    def dynamic_ids(self, table: int) -> np.ndarray:
        """The ids of dynamic table ``table`` admitted on this PS, ascending."""
        return self.dyn.ids(table)

    def dynamic_map(self, table: int) -> tuple[np.ndarray, np.ndarray]:
        """(admitted ids ascending, their global rows) of dynamic table ``table`` on this PS."""
        ids, local = self.dyn.admitted(table)
        return ids, self.vmap.global_rows(self.index, table)[local]

    def set_chaos(self, slowdown: float | None = None, leak_mb_per_s: float | None = None, delay_ms: float | None = None) -> None:
        """Fault injection (the spec's ``chaos:``): serve slower, leak memory, or answer late."""
        self.chaos.set(slowdown, leak_mb_per_s, delay_ms)

    def ping(self) -> ProcessInfo:
        """The liveness probe: this PS's process (what a kill of a hung PS needs)."""
        return ProcessInfo(os.getpid(), self._node)

    def stats(self) -> PsStats:
        return PsStats(
            **asdict(self._stats),
            pending=len(self._pending),
            dynamic_ids=sum(len(self.dyn.ids(t)) for t in self.dyn.maps),  # admitted, all dynamic tables
            dynamic=replace(self.dyn_counts),
            applied_log=self.applied.entries(),
            uptime_s=time.monotonic() - self._started,
            pid=os.getpid(),
            node_id=self._node,
            rss_mb=owned_rss_mb(self._proc),
            cpu_percent=self._proc.cpu_percent(),
        )

    # -- durable checkpoint deltas --
    def cut_changes(self) -> ChangedRows:
        """The global rows pushed since the previous cut (:mod:`dlrover.ps.checkpoint_rows`), for the
        master's next durable delta; called at every cut, with the workers parked."""
        with self._lock:
            ended = self._cut_tracker
            self._cut_tracker = CutTracker(self.vmap, self.index, self.tbe)
        return report(ended, self.vmap, self.tbe)
