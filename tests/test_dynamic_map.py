"""The PS-side id map of dynamic tables: admission, eviction, capacity, moving between PS.

Pure logic with an explicit clock (``now``); a dict-based reference model of the same
rules checks the vectorised map on random streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrover.ps.dynamic import FREQ, KEY, PCOUNT, PKEY, DynamicMap, to_ages, vshard_of, wait_position
from dlrover.ps.tables import init_rows
from dlrover.table_spec import TableSpec
from dynamic_reference import ReferenceMap


def _map(rpv: int, blocks: int = 1, valid: np.ndarray | None = None, **table) -> DynamicMap:
    n = rpv * blocks
    spec = TableSpec(kind="dynamic", capacity_rows=n, **table)
    return DynamicMap(DynamicMap.new_states(n), rpv, np.ones(n, bool) if valid is None else valid, spec)


def _rows(m: DynamicMap, ids: list[int], now: int | None) -> list[int]:
    return m.lookup(np.array(ids, dtype=np.int64), np.zeros(len(ids), dtype=np.int64), now).rows.tolist()


def test_an_id_reads_the_default_row_for_its_first_admit_after_sightings():
    m = _map(4, admit_after=2)
    assert _rows(m, [7], 1) == [-1] and _rows(m, [7], 2) == [-1]
    assert _rows(m, [7], 3)[0] >= 0
    assert _rows(m, [9, 9], 4) == [-1, -1] and _rows(m, [9], 5)[0] >= 0  # two sightings in one batch


def test_a_read_only_lookup_neither_counts_nor_admits():
    m = _map(4, admit_after=1)
    assert _rows(m, [5], None) == [-1] and _rows(m, [5], 1) == [-1] and _rows(m, [5], None) == [-1]
    row = _rows(m, [5], 2)[0]
    assert row >= 0 and _rows(m, [5], None) == [row]


def test_lru_evicts_the_least_recently_looked_up_id_and_reports_its_row():
    m = _map(3, eviction="lru")
    a, b, c = (_rows(m, [x], t)[0] for t, x in enumerate([1, 2, 3], start=1))
    _rows(m, [1], 4)
    got = m.lookup(np.array([4]), np.array([0]), 5)
    assert got.rows.tolist() == [b] and got.evicted.tolist() == [b]
    assert sorted(m.ids().tolist()) == [1, 3, 4] and _rows(m, [1, 3], None) == [a, c]


def test_lfu_evicts_the_least_often_looked_up_id():
    m = _map(3, eviction="lfu")
    _rows(m, [1, 1, 1, 2, 3, 3], 1)
    got = m.lookup(np.array([4]), np.array([0]), 2)
    assert got.evicted.tolist() == _rows(m, [4], None) and sorted(m.ids().tolist()) == [1, 3, 4]


def test_ttl_evicts_only_ids_unseen_for_longer_than_ttl_steps():
    m = _map(2, eviction="ttl", ttl_steps=2)
    _rows(m, [1], 1)
    _rows(m, [2], 2)
    assert _rows(m, [3], 3) == [-1]  # 1 unseen for 2 lookups: not expired, 3 waits
    assert _rows(m, [3], 4)[0] >= 0 and sorted(m.ids().tolist()) == [2, 3]  # 1 expired


def test_rows_held_by_a_pulled_but_not_pushed_batch_are_not_evicted():
    m = _map(1, eviction="lru")
    row = _rows(m, [1], 1)
    m.pin(np.array(row), 1)
    assert _rows(m, [2], 2) == [-1]
    m.pin(np.array(row), -1)
    assert _rows(m, [2], 3) == row


def _sharing_a_wait_position(rpv: int, count: int) -> list[int]:
    ids = np.arange(1, 10_000, dtype=np.int64)
    at = wait_position(ids, np.zeros(len(ids), dtype=np.int64), rpv, np.array([rpv]))
    return ids[at == at[0]][:count].tolist()


def test_a_new_id_forgets_the_id_waiting_at_its_position_unless_that_one_was_seen_in_the_batch():
    m = _map(8, admit_after=2)
    a, b = _sharing_a_wait_position(8, 2)
    at = int(wait_position(np.array([a]), np.array([0]), 8, np.array([8]))[0])
    _rows(m, [a], 1)
    _rows(m, [b], 2)
    assert m.states[PKEY][at] == b  # b took a's waiting position: a is forgotten
    assert _rows(m, [a, b], 3) == [-1, -1]
    assert m.states[PKEY][at] == b and m.states[PCOUNT][at] == 2  # b, seen in this batch, stays; a is forgotten
    assert _rows(m, [b], 4)[0] >= 0 and _rows(m, [a], 5) == [-1]  # b admitted at its third sighting


def test_lfu_keeps_its_order_when_lookup_counts_are_too_large_to_pack_in_one_key():
    m = _map(3, eviction="lfu")
    rows = _rows(m, [1, 2, 3], 1)
    m.states[FREQ][rows] = torch.tensor([2**61, 2**40, 2**62])  # (lookups, last, row) does not fit 62 bits
    got = m.lookup(np.array([4]), np.array([0]), 2)
    assert got.evicted.tolist() == [rows[1]] and sorted(m.ids().tolist()) == [1, 3, 4]


def test_initial_rows_are_the_same_drawn_alone_or_with_the_whole_table():
    table = init_rows(7, 2, 70_000, 8, np.arange(70_000))  # more than one draw chunk
    some = np.array([69_999, 3, 65_536, 40_000])
    assert torch.equal(init_rows(7, 2, 70_000, 8, some), table[some])
    bound = (1 / 70_000) ** 0.5
    assert table.abs().max() <= bound and abs(table.std().item() - bound / 3**0.5) < 0.01 * bound
    assert not torch.equal(init_rows(7, 3, 70_000, 8, some), table[some])  # another table, other values


def test_vshards_spread_raw_ids_evenly():
    counts = np.bincount(vshard_of(np.arange(64_000, dtype=np.int64), 64), minlength=64)
    assert counts.min() > 850 and counts.max() < 1150


@pytest.mark.parametrize("eviction,ttl", [("lru", None), ("lfu", None), ("ttl", 3)])
@pytest.mark.parametrize("admit_after", [0, 2])
def test_the_map_assigns_the_same_rows_as_the_reference_model(eviction, ttl, admit_after):
    rpv, blocks = 5, 4
    valid = np.ones(rpv * blocks, bool)
    valid[[4, 9]] = False  # padding rows, as the last rows of some vshards are
    m = _map(rpv, blocks, valid, eviction=eviction, ttl_steps=ttl, admit_after=admit_after)
    ref = ReferenceMap(valid, rpv, admit_after, eviction, ttl)
    rng = np.random.default_rng(3)
    for now in range(1, 60):
        ids = (rng.zipf(1.3, size=12) % 50).astype(np.int64)
        blocks_of = vshard_of(ids, blocks)
        got = m.lookup(ids, blocks_of, now)
        want, _ = ref.lookup(ids.tolist(), dict(zip(ids.tolist(), blocks_of.tolist())), now)
        assert got.rows.tolist() == [want[x] for x in ids.tolist()], f"lookup {now}"
        used = m.states[FREQ].numpy() > 0
        assert not used[~valid].any()  # capacity: never a padding row, at most one id per row
        assert sorted(m.ids().tolist()) == sorted(e[0] for e in ref.rows.values())


def test_a_map_moved_to_another_ps_keeps_its_ids_rows_and_ages():
    m = _map(2, eviction="lru")
    _rows(m, [1], 10)
    _rows(m, [2], 11)
    payload = to_ages([s.numpy().copy() for s in m.states], clock=11)  # as exported on a PS at clock 11
    states = DynamicMap.new_states(2)
    for dst, src in zip(states, to_ages(payload, clock=500)):  # imported on a PS at clock 500
        dst.copy_(torch.as_tensor(src))
    moved = DynamicMap(states, 2, np.ones(2, bool), m.table)
    assert _rows(moved, [1, 2], None) == _rows(m, [1, 2], None)
    assert moved.states[KEY].tolist() == m.states[KEY].tolist()
    assert moved.lookup(np.array([3]), np.array([0]), 501).evicted.tolist() == _rows(m, [1], None)  # 1 is still the older
