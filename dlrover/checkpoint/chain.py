"""Chains of durable checkpoints: a full one and the deltas written after it.

A delta (``CheckpointStore.save(..., parent=step)``) is useless without every checkpoint
before it back to the root, so the newest *usable* state is the newest checkpoint whose
whole chain verifies. A corrupt delta therefore costs the deltas after it, never the
chain before it (the previous delta, or the full one).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlrover.checkpoint.delta import QUANTIZE_MODES, ChangedRows, RowChanges, apply_delta, delta_file, full_files, unpack_full
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

    def write(self, plan: LinkPlan, payloads: list[dict], dense: Any, meta: dict) -> tuple[CheckpointInfo, str]:
        """Write the planned link from the cut's full ``payloads``; ``(info, kind)``. A
        delta whose parent is not on disk (its write failed) is written full instead."""
        vm = meta["extra"]["vmap"]
        if plan.parent is not None and plan.parent in self.store.list():
            rpv = [-(-n // vm["num_vshards"]) for n in vm["table_sizes"]]
            files = {"emb": delta_file(payloads, plan.rows, vm["num_vshards"], rpv, self.quantize), "dense": dense}
            kind, parent = "delta", plan.parent
        else:
            files, kind, parent = {**full_files(payloads, self.quantize), "dense": dense}, "full", None
        link = {"kind": kind, "quantize": self.quantize, "rows": None if parent is None else int(sum(len(r) for r in plan.rows))}
        try:
            info = self.store.save(plan.seq, files, {**meta, "link": link}, parent=parent)
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
            apply_delta(payloads, link.files["emb"], vm["num_vshards"], [-(-n // vm["num_vshards"]) for n in vm["table_sizes"]])
        with self._lock:
            self._parent, self._links = None, 0
            if self.changes is not None:
                self.changes.reset(complete=False)
        return chain, payloads
