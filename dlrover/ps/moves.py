"""Moving and saving an embedding PS's vshards: the migration rounds and checkpoints.

A mixin of :class:`dlrover.ps.embedding_ps.EmbeddingPS` (its own module only to keep the
hot path apart). Every table's rows travel as ``[weights, *optimizer states]``, plus the
id map of a dynamic table (:mod:`dlrover.ps.dynamic`), whose times travel as ages.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, zip_longest
from typing import Any

import numpy as np
import torch

from dlrover.ps.dynamic_tables import DynamicTables
from dlrover.ps.migration import DirtyRows, apply_dirty, copy_blocks, copy_dirty_local, export_blocks, export_dirty
from dlrover.ps.vshard import VShardMap

# A pre-copy asks the old owners for the vshards moving in a few at a time: up to
# PRECOPY_CALL_BYTES per call (at least one vshard), PRECOPY_AHEAD calls in flight, so that
# a source exports the next while this PS copies the last. The object store then holds a
# few calls' worth per new owner, not all the moving bytes at once (a big-table
# scale-in's 1.37 GB on top of a checkpoint filled the bench's store past 80%, where Ray
# starts spilling to disk), and a source serves its training calls between two exports
# rather than behind one long one. Calls of one small vshard each, queued behind those
# training calls, halved the pre-copy rate of `dlrover bench elastic`.
PRECOPY_CALL_BYTES = 64 * 2**20
PRECOPY_AHEAD = 2
CANCEL_POLL_S = 0.1


def calls(sources: list[tuple[Any, list[int]]], vshard_bytes: int) -> list[tuple[Any, list[int]]]:
    """``sources`` ((PS actor, vshards)) cut into export calls of up to
    ``PRECOPY_CALL_BYTES``, taken from the sources in turn."""
    per_call = max(1, PRECOPY_CALL_BYTES // max(1, vshard_bytes))
    cut = [[(ps, vs[i : i + per_call]) for i in range(0, len(vs), per_call)] for ps, vs in sources]
    return [c for c in chain.from_iterable(zip_longest(*cut)) if c is not None]


def fetched(asks: list[tuple[Any, list[int]]], sent_at: dict[int, int], cancel: threading.Event) -> Iterator[dict]:
    """The export payloads of ``asks`` ((PS actor, vshards) per call), ``PRECOPY_AHEAD``
    in flight; each sender's clock into ``sent_at``. Stops (RuntimeError) once ``cancel``
    is set."""
    import ray

    asks, flying = deque(asks), deque()
    while asks or flying:
        while asks and len(flying) < PRECOPY_AHEAD:
            ps, vs = asks.popleft()
            flying.append(ps.export_vshards.remote(vs))
        ref = flying.popleft()
        while not isinstance(ref, dict) and not ray.wait([ref], timeout=CANCEL_POLL_S)[0]:
            if cancel.is_set():
                break
        if cancel.is_set():
            raise RuntimeError("pre-copy cancelled")
        payload = ref if isinstance(ref, dict) else ray.get(ref)
        sent_at.update({int(v): payload["clock"] for v in payload["vshards"]})
        yield payload


def _row_bytes(a: Any) -> int:
    """Bytes of one row of a table state (a tensor or a numpy array, empty or not)."""
    return np.asarray(a).itemsize * int(np.prod(a.shape[1:]))


@dataclass
class PreCopy:
    """Round 1 of a move to map ``version``: the tables being filled on ``thread``."""

    version: int
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    tbe: Any = None  # set once filled
    dyn: DynamicTables | None = None
    nbytes: int = 0
    sent_at: dict[int, int] = field(default_factory=dict)  # sender clocks of the ages, by vshard
    error: str | None = None


@dataclass
class Staged:
    """Round 2 of a move, done but not switched to: what ``commit_switch`` installs."""

    vmap: VShardMap
    tbe: Any
    dyn: DynamicTables


class VShardMoves:
    """``export_vshards`` / ``prepare`` / ``stage_switch`` / ``commit_switch`` (live
    migration, see :mod:`dlrover.ps.migration`), ``snapshot`` / ``restore`` (checkpoints)."""

    # -- migration (see dlrover.ps.migration) -------------------------------------------
    # Round 1, training goes on: track() on every PS, then prepare() on every PS of the
    # new map (new tables filled from its own kept blocks and the vshards it asks the old
    # owners for, export_vshards() calls), prepared() polled. Round 2, workers paused:
    # export_vshards(dirty_only) and stage_switch() copy only the rows pushed since track();
    # once every PS has staged, commit_switch() on each (cancel_migration() on each if not).
    def _table_arrays(self, tbe, dyn: DynamicTables) -> list[list[torch.Tensor]]:
        """Per table: [weights, *optimizer states, *map states of a dynamic table] as
        writable views into ``tbe`` and ``dyn``. The TBE's are ``.data`` views: a block
        moving into a free slot of the live tables while pulls are pending must not bump
        the version autograd checks on the pulls' saved weights and optimizer state (the
        rows those pulls read are others)."""
        weights = tbe.split_embedding_weights()
        states = [] if self._optimizer["name"] == "sgd" else tbe.split_optimizer_states()
        return [[w.data, *(s.data for s in (states[t] if states else [])), *dyn.states(t)] for t, w in enumerate(weights)]

    def track(self) -> None:
        """Start recording which local rows pushes update."""
        self._dirty = DirtyRows(self.vmap.local_table_sizes(self.index))

    def export_vshards(self, vshards: list[int], dirty_only: bool = False) -> dict:
        """Weights and optimizer state of owned ``vshards`` for their new owner: whole blocks,
        or (``dirty_only``) the rows updated since ``track()``."""
        vs = np.asarray(sorted(vshards), dtype=np.int64)
        if len(vs) and np.any(self.vmap.owner[vs] != self.index):
            raise ValueError(f"ps-{self.index} does not own all of vshards {vs.tolist()}")
        vs = vs[np.argsort(self.vmap.slot[vs], kind="stable")]  # slot order: a run of slots leaves as views
        slots = self.vmap.slot[vs]
        arrays, rpv = self._table_arrays(self.tbe, self.dyn), self.vmap.rows_per_vshard()
        if dirty_only:
            if self._dirty is None:
                raise RuntimeError(f"ps-{self.index}: dirty rows asked for without track()")
            return {"vshards": vs, "dirty": self.dyn.as_ages(export_dirty(arrays, self._dirty, slots, rpv), dirty=True), "clock": self.dyn.clock}
        return {"vshards": vs, "tables": self.dyn.as_ages(export_blocks(arrays, slots, rpv)), "clock": self.dyn.clock}

    def _tables_for(self, vmap: VShardMap) -> tuple[Any, DynamicTables]:
        """The tables to fill for ``vmap``: the live ones when this PS keeps its slots (the
        blocks moving in go to free slots, which nothing routes to yet), else new ones."""
        tbe = self.tbe if self.vmap.keeps_tables(self.index, vmap) else self._new_tbe(vmap.local_table_sizes(self.index))
        return tbe, self._new_dyn(vmap, self.dyn.clock)

    def prepare(self, vmap: VShardMap, sources: list[tuple[Any, list[int]]]) -> None:
        """Round 1: fill the tables of ``vmap`` on a background thread (pulls and pushes
        go on meanwhile) from this PS's kept blocks and the vshards moving in, asked of
        their old owners (``sources``: (PS actor, vshards)) a few vshards per call."""
        self._drop_prepared()  # an earlier fill (of a move never switched to)
        self._staged = None
        if self.vmap.same_layout(self.index, vmap):
            return  # nothing moves in or out of this PS
        pc = PreCopy(vmap.version)
        pc.thread = threading.Thread(target=self._build, args=(vmap, sources, pc), name="vshard-precopy", daemon=True)
        pc.thread.start()
        self._prepared = pc

    def _build(self, vmap: VShardMap, sources: list[tuple[Any, list[int]]], pc: PreCopy) -> None:
        try:
            tbe, dyn = self._tables_for(vmap)
            per_vshard = sum(r * _row_bytes(a) for r, arrays in zip(vmap.rows_per_vshard(), self._table_arrays(tbe, dyn)) for a in arrays)
            pc.nbytes = self._fill(tbe, dyn, vmap, fetched(calls(sources, per_vshard), pc.sent_at, pc.cancel))
            pc.tbe, pc.dyn = tbe, dyn
        except Exception as e:  # reported by prepared()
            pc.error = f"{type(e).__name__}: {e}"

    def prepared(self) -> bool | str:
        """True once the new tables are built; an error message if building them failed."""
        pc = self._prepared
        if pc is None:
            return True
        if pc.thread.is_alive():
            return False
        return pc.error or True

    def cancel_migration(self) -> None:
        """Drop the tables prepared (or staged) for a migration that will not happen, stop
        tracking."""
        self._drop_prepared()
        self._staged, self._dirty = None, None

    def _drop_prepared(self, keep_version: int | None = None) -> None:
        """End the pre-copy under way: a fill of ``keep_version`` runs to its end, any
        other stops at its next call (its source may be waiting on this PS's own
        calls, queued behind this one). Nothing writes past this into the tables."""
        pc, self._prepared = self._prepared, None
        if pc is not None:
            if pc.version != keep_version:
                pc.cancel.set()
            pc.thread.join()

    def _fill(self, tbe, dyn: DynamicTables, vmap: VShardMap, payloads: Iterable[dict], keep: bool = True) -> int:
        """Copy into ``tbe`` and ``dyn`` (laid out for ``vmap``) the kept blocks (``keep``;
        already in place when ``tbe`` is the live one) and the payloads' blocks."""
        rpv = vmap.rows_per_vshard()
        mine = vmap.owned(self.index)
        dst = self._table_arrays(tbe, dyn)
        kept = np.intersect1d(mine, self.vmap.owned(self.index)) if keep else np.zeros(0, dtype=np.int64)
        if tbe is not self.tbe:
            copy_blocks(dst, vmap.slot[kept], self._table_arrays(self.tbe, self.dyn), self.vmap.slot[kept], rpv)
        nbytes, have = 0, set(kept.tolist())
        for p in payloads:  # a payload may also hold vshards going to other PS
            held = np.asarray(p["vshards"], dtype=np.int64)
            pos = np.flatnonzero(vmap.owner[held] == self.index)
            nbytes += copy_blocks(dst, vmap.slot[held[pos]], dyn.as_ages(p["tables"]), pos, rpv)
            have.update(held[pos].tolist())
        missing = sorted(set(mine.tolist()) - have)
        if missing:
            raise RuntimeError(f"ps-{self.index}: no data for vshards {missing}")
        dyn.reindex()
        return nbytes

    def reconfigure(self, vmap: VShardMap, incoming: list[Any]) -> dict:
        """``stage_switch`` then ``commit_switch``: for a switch no other PS has to make
        at the same time (a recovery's survivors, a restart's new PS)."""
        reply = self.stage_switch(vmap, incoming)
        self.commit_switch(vmap.version)
        return reply

    def stage_switch(self, vmap: VShardMap, incoming: list[Any]) -> dict:
        """Round 2 (workers paused: nothing pulled-but-not-pushed): build the tables of
        ``vmap`` and keep them for ``commit_switch``, leaving the live tables and map as
        they are, so that a switch one PS cannot make is dropped on every PS
        (``cancel_migration``). The blocks moving in go to new tables or to slots free
        under the live map, so nothing this writes is read before the commit.

        After ``prepare(vmap)``, once ``prepared()`` holds on every PS (a fill still
        running may be waiting on another PS's export, queued behind that PS's own
        ``stage_switch``): ``incoming`` are dirty payloads, and the rows of kept vshards
        updated since ``track()`` are copied over too. Without: ``incoming`` are
        full payloads and the whole move happens now. The fused optimizer's state moves
        with the weights, so training goes on exactly where it stopped.
        """
        import ray

        t0 = time.perf_counter()
        with self._lock:
            # Live workers are parked with every push applied: a pull still pending here
            # belongs to a worker that died mid-step (its shard is trained again).
            orphans = len(self._pending)
            self._pending.clear()
        self.dyn.clear_pins()
        pc, self._staged = self._prepared, None
        self._drop_prepared(vmap.version)  # no fill, of this version or a stray one, writes on past the switch
        if self.vmap.same_layout(self.index, vmap):
            self._staged = Staged(vmap, self.tbe, self.dyn)  # same slots: only the version moves
            return {"bytes_in": 0, "bytes_precopied": 0, "recv_s": 0.0, "copy_s": 0.0, "orphan_pulls": orphans}
        payloads = [p if isinstance(p, dict) else ray.get(p) for p in incoming]
        t_recv = time.perf_counter()
        if pc is not None and pc.version == vmap.version:
            if pc.tbe is None:
                raise RuntimeError(f"ps-{self.index}: preparing the new tables failed ({pc.error})")
            tbe, dyn, precopied = pc.tbe, pc.dyn, pc.nbytes
            nbytes = self._apply_deltas(vmap, pc, payloads)
        else:
            tbe, dyn = self._tables_for(vmap)
            precopied, nbytes = 0, self._fill(tbe, dyn, vmap, payloads)
        self._staged = Staged(vmap, tbe, dyn)
        done = time.perf_counter()
        return {"bytes_in": nbytes, "bytes_precopied": precopied, "recv_s": t_recv - t0, "copy_s": done - t_recv, "orphan_pulls": orphans}

    def _apply_deltas(self, vmap: VShardMap, pc: PreCopy, payloads: list[dict]) -> int:
        """Bring the pre-copied tables up to date: the rows pushed since ``track()``, of
        the kept vshards (from the live tables) and of those moving in (``payloads``)."""
        tbe, dyn = pc.tbe, pc.dyn
        rpv = vmap.rows_per_vshard()
        new_slot = {int(v): int(vmap.slot[v]) for v in vmap.owned(self.index)}
        dst = self._table_arrays(tbe, dyn)
        if tbe is not self.tbe:  # kept vshards in new tables: the rows pushed since round 1
            old_to_new = {int(self.vmap.slot[v]): new_slot[int(v)] for v in self.vmap.owned(self.index) if int(v) in new_slot}
            copy_dirty_local(dst, self._table_arrays(self.tbe, self.dyn), self._dirty, old_to_new, rpv)
        # Training went on since prepare(): the precopied ids not looked up since have
        # aged by as many lookups as their sender's clock ran on, whatever this one's did.
        ran: dict[int, list[int]] = {}  # sender clock ticks since its export -> new slots
        for p in payloads:
            for v in (int(v) for v in p["vshards"] if int(v) in new_slot):
                ran.setdefault(p["clock"] - pc.sent_at[v], []).append(new_slot[v])
        for ticks, slots in ran.items():
            dyn.shift_times(np.array(slots), self.dyn.clock - dyn.clock - ticks)
        dyn.clock = self.dyn.clock
        nbytes = sum(apply_dirty(dst, new_slot, p["vshards"], dyn.as_ages(p["dirty"], dirty=True), rpv) for p in payloads)
        dyn.reindex()
        return nbytes

    def commit_switch(self, version: int) -> None:
        """Switch to the map ``stage_switch`` staged (of ``version``): only references
        change, so a switch staged on every PS cannot fail half-way."""
        st, self._staged = self._staged, None
        if st is None or st.vmap.version != version:
            raise RuntimeError(f"ps-{self.index}: no switch to vshard map version {version} staged")
        self.tbe, self.dyn, self.vmap, self._dirty = st.tbe, st.dyn, st.vmap, None

    # -- checkpoints (see dlrover.master.checkpoint) -------------------------------------
    def snapshot(self) -> tuple[int, dict]:
        """``(bytes, payload)``: every owned vshard (weights + optimizer state) as one
        export payload, taken with the workers parked. The payload is views of the live
        tables; called with ``options(num_returns=2)``, Ray copies it into the object store
        (owned by the caller) before the call completes, so a consistent cut costs one
        copy and this PS never holds its tables twice."""
        with self._lock:
            owned = self.vmap.owned(self.index)  # slot order: one run of views unless a hole precedes a slot
            tables = self.dyn.as_ages(export_blocks(self._table_arrays(self.tbe, self.dyn), self.vmap.slot[owned], self.vmap.rows_per_vshard()))
        return int(sum(a.nbytes for t in tables for a in t)), {"vshards": owned.astype(np.int64), "tables": tables}

    def restore(self, vmap: VShardMap, payloads: list[Any] | None) -> int:
        """Roll back to a checkpoint: rebuild the tables of ``vmap`` from full payloads
        (they may come from PS that no longer exist, under an older map), or to the job's
        starting state when ``payloads`` is None. Pulls not pushed yet are dropped: the
        workers that made them restart from the checkpoint too."""
        import ray

        self.cancel_migration()  # a pre-copy's fill must not write into the live tables any more
        if payloads is None:
            (tbe, dyn), nbytes = self._initial_tables(vmap, self.dyn.clock), 0
        else:
            payloads = [p if isinstance(p, dict) else ray.get(p) for p in payloads]
            tbe, dyn = self._new_tbe(vmap.local_table_sizes(self.index)), self._new_dyn(vmap, self.dyn.clock)
            nbytes = self._fill(tbe, dyn, vmap, payloads, keep=False)
        with self._lock:
            self._pending.clear()
            self.applied.clear()  # batches after the checkpoint's cut are pushed again
            self.tbe, self.dyn, self.vmap, self._prepared, self._dirty = tbe, dyn, vmap, None, None
        return nbytes
