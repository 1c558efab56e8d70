"""Shared-memory exchange buffers between actors on the same node.

A Ray call with a multi-megabyte numpy argument or result costs about 3 ms of CPU on
each side here (object-store put, seal, reference counting), far more than the memcpy.
Between a worker and a PS on one node the big arrays of a step (the dense exchange, a
pull's ids, the pooled embeddings and their gradients) go through named shared-memory
segments the worker creates instead: the Ray call carries only where the bytes are (``ShmSlice``)
and orders the accesses; the PS attaches the segment once and reads or writes in place.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

_CREATED_HERE: set[str] = set()  # segments this process owns (its tracker knows them)
_WORDS = {"float32": 1, "int64": 2}  # float32 words per element: segments are float32 arrays


def shm_prefix(name: str) -> str:
    """Segment-name prefix of a job or worker (``<job_id>/worker-3`` -> ``dlr_<job_id>_worker-3_``),
    so the master can remove the segments of workers that were killed."""
    return "dlr_" + name.replace("/", "_") + "_"


class ShmArray:
    """A float32 array in a named POSIX shared-memory segment (``size``: None to attach
    to an existing one whole)."""

    def __init__(self, name: str, size: int | None, create: bool) -> None:
        nbytes = max(4, (size or 0) * 4)
        self._shm = shared_memory.SharedMemory(name=name, create=create, size=nbytes if create else 0)
        if create:
            _CREATED_HERE.add(name)
        elif name not in _CREATED_HERE:
            # Python < 3.13 registers attached segments with its resource tracker, which
            # would unlink the owner's segment when this process exits.
            resource_tracker.unregister(self._shm._name, "shared_memory")  # noqa: SLF001
        self.name = name
        self.owner = create
        size = self._shm.size // 4 if size is None else size
        self.array = np.ndarray((size,), dtype=np.float32, buffer=self._shm.buf)

    def close(self) -> None:
        self.array = None
        self._shm.close()
        if self.owner:
            _CREATED_HERE.discard(self.name)
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass


@dataclass(frozen=True)
class ShmSlice:
    """An array inside a segment: ``size`` float32 words of room from word ``offset``;
    ``shape`` and ``dtype`` are what was written there (shape empty while it is only room)."""

    segment: str
    offset: int
    size: int
    shape: tuple[int, ...] = ()
    dtype: str = "float32"  # or "int64" (two words an element; its offset is even)

    def holding(self, shape: tuple[int, ...], dtype: str = "float32") -> "ShmSlice":
        return ShmSlice(self.segment, self.offset, self.size, tuple(int(d) for d in shape), dtype)

    def words(self) -> int:
        """Words the held array takes."""
        return math.prod(self.shape) * _WORDS[self.dtype]


def _held(flat: np.ndarray, s: ShmSlice) -> np.ndarray:
    """The array ``s`` holds, in ``flat`` (the words of its room)."""
    return flat[: s.words()].view(s.dtype).reshape(s.shape)


def _ids_fit(capacity: int, indices: np.ndarray, offsets: np.ndarray | None) -> bool:
    return indices.size + (0 if offsets is None else offsets.size) <= capacity


class Attached:
    """The serving side: segments other processes created, attached on first use."""

    def __init__(self) -> None:
        self._segments: dict[str, ShmArray] = {}
        self._lock = threading.Lock()  # calls of several workers may attach at once

    def array(self, name: str) -> np.ndarray:
        """The whole segment ``name`` as a flat float32 array."""
        with self._lock:
            seg = self._segments.get(name)
            if seg is None:
                seg = self._segments[name] = ShmArray(name, None, create=False)
        return seg.array

    def view(self, s: ShmSlice) -> np.ndarray:
        """The array ``s`` holds (its room, flat, when it holds nothing yet)."""
        flat = self.array(s.segment)[s.offset : s.offset + s.size]
        return _held(flat, s) if s.shape else flat

    def put(self, room: ShmSlice, value: np.ndarray) -> ShmSlice | np.ndarray:
        """Write ``value`` into ``room``; the slice that now holds it, or ``value`` itself
        when it does not fit (it then travels as a Ray object)."""
        if value.size > room.size:
            return value
        self.view(room)[: value.size] = value.reshape(-1)
        return room.holding(value.shape)

    def release(self, name: str) -> None:
        """The owner is done with ``name``: unmap it here."""
        with self._lock:
            seg = self._segments.pop(name, None)
        if seg is not None:
            seg.close()


class SlotRing:
    """A worker's slots shared with one PS on its node. Each slot has room for one batch's
    ids (``ids_capacity`` int64s: a pull's indices and offsets), its pooled answer and,
    after backward, its gradient (``capacity`` floats each); lookups take the slots in
    turn, so a slot comes back ``slots`` lookups later (the batch that used it has long
    finished backward), and before it is written again the pull that read its ids and the
    push that read its gradient must be done (an aborted run's pull may still be queued
    at the PS). The PS copies the ids out during the pull."""

    def __init__(self, owner: str, ps_id: int, capacity: int, wait: Callable[[list[Any]], Any], slots: int, ids_capacity: int = 0) -> None:
        capacity += capacity % 2  # every room starts at an even word: int64 ids are aligned
        self.stride = 2 * capacity + 2 * ids_capacity
        self.shm = ShmArray(f"{shm_prefix(owner)}ps{ps_id}_{uuid.uuid4().hex[:8]}", slots * self.stride, create=True)
        self.capacity, self.ids_capacity, self.slots, self._wait = capacity, ids_capacity, slots, wait
        self._next = 0
        self._reading: list[list[Any]] = [[] for _ in range(slots)]  # per slot: the pull and push that read it

    @property
    def name(self) -> str:
        return self.shm.name

    def take(self) -> int:
        slot, self._next = self._next, (self._next + 1) % self.slots
        for ref in self._reading[slot]:
            self._wait([ref])  # one at a time: ray.wait returns once the first of a list is ready
        self._reading[slot] = []
        return slot

    def answer_room(self, slot: int) -> ShmSlice:
        return ShmSlice(self.name, slot * self.stride, self.capacity)

    def grad_room(self, slot: int) -> ShmSlice:
        return ShmSlice(self.name, slot * self.stride + self.capacity, self.capacity)

    def read(self, s: ShmSlice) -> np.ndarray:
        return _held(self.shm.array[s.offset : s.offset + s.size], s)

    def write_ids(self, slot: int, indices: np.ndarray, offsets: np.ndarray | None) -> tuple[ShmSlice, ShmSlice | None] | None:
        """Put a pull's int64 indices and offsets in ``slot``, one after the other; None
        when they do not fit (send them as objects)."""
        if not _ids_fit(self.ids_capacity, indices, offsets):
            return None
        at, held = slot * self.stride + 2 * self.capacity, []
        for a in (indices, offsets):
            if a is None:
                held.append(None)
                continue
            self.shm.array[at : at + 2 * a.size].view(np.int64)[:] = a.reshape(-1)
            held.append(ShmSlice(self.name, at, 2 * a.size).holding(a.shape, "int64"))
            at += 2 * a.size
        return held[0], held[1]

    def write(self, slot: int, value: np.ndarray) -> ShmSlice | None:
        """Put a gradient in ``slot``; None when it does not fit (send it as an object)."""
        room = self.grad_room(slot)
        if value.size > room.size:
            return None
        self.shm.array[room.offset : room.offset + value.size] = value.reshape(-1)
        return room.holding(value.shape)

    def reads(self, slot: int, ref: Any) -> None:
        """``ref`` (a pull or a push) reads ``slot``: it is not written again before it is done."""
        self._reading[slot].append(ref)

    def close(self) -> None:
        self.shm.close()


class LocalLinks:
    """A worker's slot rings, one per PS on its node (made on first use); the PS elsewhere
    get none and are sent Ray objects."""

    def __init__(self, owner: str, local: set[int], capacity: int, wait: Callable[[list[Any]], Any], slots: int, ids_capacity: int = 0) -> None:
        """``slots`` per ring: more than the lookups a worker keeps in flight, plus one
        (the worker's ``lookahead.ring_slots``)."""
        self.owner, self.local, self.capacity, self.ids_capacity, self._wait, self.slots = owner, set(local), capacity, ids_capacity, wait, slots
        self.rings: dict[int, SlotRing] = {}

    def takes_ids(self, ps_id: int, indices: np.ndarray, offsets: np.ndarray | None) -> bool:
        """Whether a pull of these ids to ``ps_id`` can carry them in shared memory."""
        return ps_id in self.local and _ids_fit(self.ids_capacity, indices, offsets)

    def ring(self, ps_id: int) -> SlotRing | None:
        if ps_id not in self.local:
            return None
        ring = self.rings.get(ps_id)
        if ring is None:
            ring = self.rings[ps_id] = SlotRing(self.owner, ps_id, self.capacity, self._wait, self.slots, self.ids_capacity)
        return ring

    def close(self) -> dict[int, str]:
        """Unmap and remove every ring; the segment each PS should release, by PS id."""
        names = {k: r.name for k, r in self.rings.items()}
        for r in self.rings.values():
            r.close()
        self.rings.clear()
        return names
