"""Chains of durable checkpoints: a full one and the deltas written after it.

A delta (``CheckpointStore.save(..., parent=step)``) is useless without every checkpoint
before it back to the root, so the newest *usable* state is the newest checkpoint whose
whole chain verifies. A corrupt delta therefore costs the deltas after it, never the
chain before it (the previous delta, or the full one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlrover.checkpoint.incremental import QUANTIZE_MODES, ChangedRows, RowChanges, apply_delta, delta_part, full_part, unpack_full
from dlrover.checkpoint.manifest import FileEntry
from dlrover.checkpoint.store import CheckpointError, CheckpointInfo, CheckpointStore


@dataclass
class ChainLink:
    """One verified checkpoint of a chain."""

    step: int
    meta: dict
    files: dict[str, Any]


@dataclass
class LoadedChain:
    """``links`` from the root to ``step``, and one line per newer checkpoint whose chain
    did not verify (the caller logs that it fell back)."""

    step: int
    links: list[ChainLink]
    skipped: list[str]


def load_latest_chain(store: CheckpointStore) -> LoadedChain:
    """The newest checkpoint of ``store`` whose whole chain verifies, each link loaded
    (and checked) once. CheckpointError when there is none."""
    loaded: dict[int, ChainLink | CheckpointError] = {}
    skipped: list[str] = []
    for step in reversed(store.steps_or_raise()):
        try:
            links = [_link(store, s, loaded) for s in store.chain(step)]
        except CheckpointError as e:
            bad = str(e)
            skipped.append(bad if bad.startswith(store.url(step)) else f"{store.url(step)}: depends on {bad}")
            continue
        return LoadedChain(step, links, skipped)
    raise CheckpointError(f"{store.root}: no valid checkpoint ({'; '.join(skipped)})")


def _link(store: CheckpointStore, step: int, loaded: dict) -> ChainLink:
    if step not in loaded:
        try:
            loaded[step] = ChainLink(step, *store.load(step))
        except CheckpointError as e:
            loaded[step] = e
    found = loaded[step]
    if isinstance(found, CheckpointError):
        raise found
    return found


@dataclass(frozen=True)
class LinkPlan:
    """What the next durable write will be: a delta of ``parent`` holding ``rows`` (global
    ids per table), or a full checkpoint (``parent`` None)."""

    seq: int
    parent: int | None
    rows: list[np.ndarray] | None


@dataclass(frozen=True)
class LinkWrite:
    """One durable link being written: what the writer of each PS payload's file needs.
    It is pickled to wherever a payload is, so that no process gathers them all."""

    store: CheckpointStore
    step: int
    quantize: str
    num_vshards: int
    rpv: list[int]  # rows per vshard of each table
    rows: list[np.ndarray] | None  # a delta's rows (global ids per table); None: full

    def write(self, index: int, payload: dict) -> tuple[str, FileEntry]:
        """Write payload ``index``'s file: ``ps_<i>`` (full) or ``emb_<i>`` (delta)."""
        if self.rows is None:
            key, obj = f"ps_{index}", full_part(payload, self.quantize)
        else:
            key, obj = f"emb_{index}", delta_part(payload, self.rows, self.num_vshards, self.rpv, self.quantize)
        return key, self.store.write_file(self.step, key, obj)


PartWriter = Callable[[LinkWrite, list[Any]], list[tuple[str, FileEntry]]]


def write_here(link: LinkWrite, payloads: list[Any]) -> list[tuple[str, FileEntry]]:
    """Write every payload's file in this process (``payloads`` are the dicts)."""
    return [link.write(i, p) for i, p in enumerate(payloads)]


def _rpv(vmap_meta: dict) -> list[int]:
    return [-(-n // vmap_meta["num_vshards"]) for n in vmap_meta["table_sizes"]]


class DurableChain:
    """Writes durable checkpoints as full + deltas and reads them back as full payloads.

    ``add_cut`` folds each cut's reports (every in-memory checkpoint's, durable or not)
    into the rows changed since the last durable cut; ``plan`` (when a cut is chosen for
    durable storage) takes those rows and starts counting afresh from that cut, which is
    what the next delta must cover. A delta is written only when it is provably complete:
    every report since the last durable cut was complete, that cut's write succeeded, the
    plan is for the newest cut folded in, and the chain is shorter than ``full_every``.
    """

    def __init__(self, store: CheckpointStore, full_every: int = 5, quantize: str = "none") -> None:
        if quantize not in QUANTIZE_MODES:
            raise ValueError(f"quantize: {quantize!r} is not one of {', '.join(QUANTIZE_MODES)}")
        self.store, self.full_every, self.quantize = store, int(full_every), quantize
        self.changes: RowChanges | None = None
        self._cut_seq: int | None = None  # newest cut folded into ``changes``
        self._parent: int | None = None  # newest durable step a delta may build on
        self._links = 0  # links of the chain ending at ``_parent``
        self._lock = threading.Lock()

    def add_cut(self, seq: int, table_sizes: list[int], reports: list[ChangedRows]) -> None:
        """The PS reports of cut ``seq`` (all of them, taken while the workers were parked)."""
        with self._lock:
            if self.changes is None:
                self.changes = RowChanges(table_sizes)
            self.changes.add(reports)
            self._cut_seq = seq

    def broken(self) -> None:
        """Some PS reset their trackers but the reports were lost: the next write is full."""
        with self._lock:
            if self.changes is not None:
                self.changes.complete = False

    def plan(self, seq: int) -> LinkPlan:
        """Decide what the durable write of cut ``seq`` is; reset the changed rows."""
        with self._lock:
            newest = seq == self._cut_seq and self.changes is not None
            delta = newest and self.changes.complete and self._parent is not None and self._links < self.full_every
            plan = LinkPlan(seq, self._parent if delta else None, self.changes.rows() if delta else None)
            if self.changes is not None:
                self.changes.reset(complete=newest)
            self._parent, self._links = seq, (self._links + 1 if delta else 1)
        return plan

    def write(self, plan: LinkPlan, payloads: list[Any], dense: Any, meta: dict, parts: PartWriter = write_here) -> tuple[CheckpointInfo, str]:
        """Write the planned link from the cut's full ``payloads``; ``(info, kind)``.
        ``parts`` writes one file per payload (``write_here``, or each where its payload
        is); this process writes the dense file and, last, the manifest. A delta whose
        parent is not on disk (its write failed) is written full instead."""
        vm = meta["extra"]["vmap"]
        delta = plan.parent is not None and plan.parent in self.store.list()
        kind, parent = ("delta", plan.parent) if delta else ("full", None)
        link = {"kind": kind, "quantize": self.quantize, "rows": int(sum(len(r) for r in plan.rows)) if delta else None}
        job = LinkWrite(self.store, plan.seq, self.quantize, vm["num_vshards"], _rpv(vm), plan.rows if delta else None)
        try:
            pending = self.store.begin(plan.seq, {**meta, "link": link}, parent=parent)
            entries = dict(parts(job, payloads))
            entries["dense"] = self.store.write_file(plan.seq, "dense", dense)
            info = self.store.commit(pending, entries)
        except Exception:
            with self._lock:
                if self._parent == plan.seq:
                    self._parent = None  # nothing to build the next delta on
            raise
        with self._lock:
            if kind == "full" and self._parent == plan.seq:
                self._links = 1
        return info, kind

    def load(self) -> tuple[LoadedChain, list[dict]]:
        """The newest chain that verifies and its fp32 PS payloads (full + every delta
        replayed). The next write is full: the job restarts from this state."""
        chain = load_latest_chain(self.store)
        root = chain.links[0]
        payloads = unpack_full(root.files)
        for link in chain.links[1:]:
            vm = link.meta["extra"]["vmap"]
            for key in sorted(k for k in link.files if k.startswith("emb_")):
                apply_delta(payloads, link.files[key], vm["num_vshards"], _rpv(vm))
        with self._lock:
            self._parent, self._links = None, 0
            if self.changes is not None:
                self.changes.reset(complete=False)
        return chain, payloads
