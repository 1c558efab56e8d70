"""The dynamic tables' hit/admit/evict counters a PS reports in ``stats()["dynamic"]``."""

from __future__ import annotations

import numpy as np
import pytest

from dlrover.ps.dynamic import vshard_of
from dlrover.ps.dynamic_tables import DynamicCounts, DynamicTables
from dlrover.ps.ps_stats import PsStats, total_counts
from dlrover.ps.vshard import VShardMap
from dlrover.table_spec import TableSpec, rows_of

V, CAP, DIM = 1, 2, 4  # one vshard of two rows: every admission past two evicts
TABLES = {0: TableSpec(kind="dynamic", capacity_rows=CAP, admit_after=1, eviction="lru")}
SIZES = rows_of([8] * 26, TABLES)


def _lookup(tables: DynamicTables, ids: list[int], train: bool = True) -> None:
    """One batch of ``len(ids)`` bags (the ids in table 0, id 1 in every hashed table),
    pushed at once: its rows are unpinned."""
    idx = np.ones(26 * len(ids), dtype=np.int64)
    idx[: len(ids)] = ids
    spans = np.arange(27) * len(ids)
    tables.unpin(tables.translate(idx, spans, train, lambda t, rows: None).pins)


def test_counts_tell_hits_defaults_admissions_and_evictions_apart() -> None:
    tables = DynamicTables(VShardMap.round_robin(SIZES, V, 1, (0,)), 0, TABLES, seed=0, dim=DIM)
    _lookup(tables, [10, 11])  # first sightings: both wait on the default row
    assert tables.counts == DynamicCounts(lookups=2, hits=0, defaults=2, admitted=0, evicted=0)
    _lookup(tables, [10, 11])  # second sightings: both admitted into the two free rows
    assert tables.counts == DynamicCounts(lookups=4, hits=0, defaults=2, admitted=2, evicted=0)
    _lookup(tables, [12])  # waits
    _lookup(tables, [10, 10])  # hits, counted per occurrence
    _lookup(tables, [12])  # admitted by evicting 11, the least recently looked up
    assert tables.counts == DynamicCounts(lookups=8, hits=2, defaults=3, admitted=3, evicted=1)
    _lookup(tables, [11, 12], train=False)  # evaluation lookups are not counted
    assert tables.counts.lookups == 8


def test_counts_carry_over_to_the_next_layout_and_sum_over_ps() -> None:
    counts = DynamicCounts()
    vmap = VShardMap.round_robin(SIZES, V, 1, (0,))
    _lookup(DynamicTables(vmap, 0, TABLES, seed=0, dim=DIM, counts=counts), [5, 6])
    _lookup(DynamicTables(vmap.with_owner(vmap.owner), 0, TABLES, seed=0, dim=DIM, counts=counts), [7])
    assert counts.lookups == 3 and counts.defaults == 3
    stats = [PsStats(dynamic=DynamicCounts(3, 1, 2, 1, 0)), PsStats(dynamic=DynamicCounts(lookups=4, hits=4)), PsStats()]
    assert total_counts(stats) == {"lookups": 7, "hits": 5, "defaults": 2, "admitted": 1, "evicted": 0}


def test_a_batch_with_ids_of_vshards_the_ps_does_not_own_is_refused_without_a_trace() -> None:
    tables = {0: TableSpec(kind="dynamic", capacity_rows=8), 1: TableSpec(kind="dynamic", capacity_rows=8)}
    vmap = VShardMap.round_robin(rows_of([8] * 26, tables), 2, 2, (0, 1))
    mine, theirs = (next(i for i in range(100) if vshard_of(np.array([i]), 2)[0] == v) for v in (0, 1))
    ps0 = DynamicTables(vmap, 0, tables, seed=0, dim=DIM)
    idx = np.ones(26, dtype=np.int64)
    idx[0], idx[1] = mine, theirs  # table 0's id is PS 0's, table 1's is not
    with pytest.raises(ValueError, match="table 1: ids of vshards this PS does not own"):
        ps0.translate(idx, np.arange(27), True, lambda t, rows: None)
    assert ps0.clock == 0 and ps0.counts == DynamicCounts() and len(ps0.ids(0)) == 0


def test_a_ps_given_no_spec_for_a_dynamic_table_of_its_map_refuses_to_start() -> None:
    from dlrover.ps.embedding_ps import EmbeddingPS

    vmap = VShardMap.round_robin(SIZES, V, 1, (0,))
    with pytest.raises(ValueError, match=r"ps-0: no TableSpec for dynamic table\(s\) \[0\]"):
        EmbeddingPS(0, vmap, DIM, {"name": "sgd", "lr": 0.1}, tables=None)


def test_an_eviction_while_a_pull_waits_for_its_push_leaves_that_push_applicable() -> None:
    """Resetting an evicted row must not count as an in-place change of the tensors the
    pending pull's graph saved (it did, and the push failed: "modified by an inplace
    operation", seen in a live job)."""
    from dlrover.ps.embedding_ps import EmbeddingPS

    tables = {0: TableSpec(kind="dynamic", capacity_rows=3, eviction="lru")}
    ps = EmbeddingPS(0, VShardMap.round_robin(rows_of([8] * 26, tables), 1, 1, (0,)), DIM, {"name": "adagrad", "lr": 0.1}, tables=tables)

    def pull(key, ids):
        idx = np.ones(26 * len(ids), dtype=np.int64)
        idx[: len(ids)] = ids
        return ps.pull(key, idx, None, True)

    ps.push(("w", 0), np.ones_like(pull(("w", 0), [11, 12])))  # two rows taken, unpinned
    waiting = pull(("w", 1), [10])  # the last free row, pinned until its push
    ps.push(("w", 2), np.ones_like(pull(("w", 2), [13])))  # evicts 11: its row is reset
    assert ps.dyn_counts.evicted == 1
    assert ps.push(("w", 1), np.ones_like(waiting)) == 26
