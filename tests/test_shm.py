"""Shared-memory slots between a worker and a PS on its node: what one side writes the
other reads back unchanged, the rooms of a slot do not overlap, and what does not fit
is refused (it then travels as a Ray object)."""

from __future__ import annotations

import numpy as np

from dlrover.ps.shm import Attached, SlotRing


def ring(capacity: int = 7, ids_capacity: int = 40) -> SlotRing:
    return SlotRing("test-shm/worker-0", 0, capacity, wait=lambda refs: None, ids_capacity=ids_capacity, slots=2)


def test_a_pulls_ids_written_to_a_slot_read_back_exactly_on_the_serving_side():
    r, ps_side = ring(), Attached()
    try:
        ids = np.array([0, 5, 2**62 + 3, -(2**40), 17], dtype=np.int64)  # raw 64-bit ids of a dynamic table
        offsets = np.arange(6, dtype=np.int64)
        held = r.write_ids(1, ids, offsets)
        assert held is not None and [h.dtype for h in held] == ["int64", "int64"]
        assert np.array_equal(ps_side.view(held[0]), ids) and np.array_equal(ps_side.view(held[1]), offsets)
        assert all(h.offset % 2 == 0 for h in held)  # int64 views are aligned
    finally:
        ps_side.release(r.name)
        r.close()


def test_ids_answer_and_gradient_of_every_slot_do_not_overlap():
    r = ring(capacity=7)  # odd: rounded up so the ids that follow stay aligned
    try:
        spans = []
        for slot in range(r.slots):
            held, _ = r.write_ids(slot, np.arange(r.ids_capacity, dtype=np.int64), None)
            for room in (r.answer_room(slot), r.grad_room(slot), held):
                spans.append((room.offset, room.offset + room.size))
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= r.shm.array.size
    finally:
        r.close()


def test_ids_that_do_not_fit_a_slot_are_refused_and_nothing_is_written():
    r = ring(ids_capacity=4)
    try:
        before = r.shm.array.copy()
        assert r.write_ids(0, np.arange(3, dtype=np.int64), np.arange(2, dtype=np.int64)) is None
        assert np.array_equal(r.shm.array, before)
    finally:
        r.close()


def test_a_gradient_round_trips_through_its_room():
    r, ps_side = ring(capacity=8), Attached()
    try:
        g = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
        held = r.write(1, g)
        assert held is not None and np.array_equal(ps_side.view(held), g)
        assert r.write(1, np.zeros(9, dtype=np.float32)) is None
    finally:
        ps_side.release(r.name)
        r.close()


def test_a_slot_is_taken_again_only_once_the_pull_and_the_push_that_read_it_are_done():
    waited: list[str] = []
    r = SlotRing("test-shm/worker-1", 0, 8, wait=waited.extend, ids_capacity=8, slots=2)
    try:
        first = r.take()
        r.reads(first, "pull-0")  # an evaluation pull has no push; an aborted run's may still be queued
        r.reads(first, "push-0")
        second = r.take()
        assert second != first and waited == []
        assert r.take() == first and waited == ["pull-0", "push-0"]
        assert r.take() == second and waited == ["pull-0", "push-0"]  # nothing read the second slot
        assert r.take() == first and waited == ["pull-0", "push-0"]  # waited for once only
    finally:
        r.close()
