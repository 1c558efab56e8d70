"""Moving vshards between PS in process (no Ray): the slot layout of ``VShardMap``, the
two migration rounds, every move checked row for row against PS that do not move."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.vshard import VShardMap

SIZES = [10, 1000, 7]


class Called:
    """A PS object called as its actor is (``.export_vshards.remote(vs)`` runs it now, on
    the caller's thread: a pre-copy's, while the test's thread pushes)."""

    def __init__(self, ps: EmbeddingPS) -> None:
        self._ps = ps

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=getattr(self._ps, name))


def _full_tables(servers: dict, vmap: VShardMap) -> list[np.ndarray]:
    """Every table's weights and optimizer state, column by column, gathered from the PS
    that own its rows under ``vmap`` (NaN where none does)."""
    out = []
    for t, n in enumerate(SIZES):
        full = None
        for k in vmap.ps_ids:
            rows = vmap.global_rows(k, t)
            valid = rows >= 0
            arrays = servers[k]._table_arrays(servers[k].tbe, servers[k].dyn)[t]
            if full is None:
                full = [np.full((n,) + tuple(a.shape[1:]), np.nan) for a in arrays]
            for c, a in enumerate(arrays):
                full[c][rows[valid]] = a.numpy()[valid]
        out += full
    return out

@pytest.mark.parametrize("opt", ["rowwise_adagrad", "adagrad", "sgd"])
def test_migration_keeps_weights_and_optimizer_state(opt):
    v1 = VShardMap.round_robin(SIZES, 8, 2)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": opt, "lr": 0.1}, seed=5) for k in range(2)}
    gen = torch.Generator().manual_seed(0)
    for p in ps.values():  # give every weight and state a distinct value
        for arrays in p._table_arrays(p.tbe, p.dyn):
            for a in arrays:
                with torch.no_grad():
                    a.copy_(torch.rand(a.shape, generator=gen))

    before = _full_tables(ps, v1)
    ps[2] = EmbeddingPS(2, v1, 4, {"name": opt, "lr": 0.1}, seed=5)  # joins owning nothing
    for target in ([0, 1, 2], [2]):
        v2 = ps[0].vmap.reassigned(target) if 0 in ps[0].vmap.ps_ids else ps[2].vmap.reassigned(target)
        old = next(p.vmap for p in ps.values() if p.vmap.version == v2.version - 1)
        moves = old.moves(v2)
        exports = {s: ps[s].export_vshards([v for v, src, _ in moves if src == s]) for s in {m[1] for m in moves}}
        for k in target:
            ps[k].reconfigure(v2, [exports[s] for s in exports if any(src == s and d == k for _, src, d in moves)])
        for k in set(ps) - set(target):
            ps[k].vmap = v2
        after = _full_tables({k: ps[k] for k in target}, v2)
        assert len(after) == len(before)
        for a, b in zip(before, after):
            np.testing.assert_array_equal(a, b)


def _push_some(ps: EmbeddingPS, step: int, dim: int = 4) -> None:
    """One real pull + push of a few rows of every table this PS owns (single-hot)."""
    v = ps.vmap
    owned = v.owned(ps.index)
    if not len(owned):
        return
    idx = []
    for t, n in enumerate(SIZES):
        rows = [int(owned[(step + j) % len(owned)]) + v.num_vshards * (j % max(1, n // v.num_vshards)) for j in range(3)]
        rows = np.array([r if r < n else int(owned[0]) for r in rows])
        idx.append(v.route(rows, np.full(len(rows), t))[1])
    key = ("test", step)
    ps.pull(key, np.concatenate(idx).astype(np.int64), None)
    ps.push(key, np.full((3, len(SIZES) * dim), 0.5, dtype=np.float32))




def _round_one(ps: dict, old: VShardMap, new: VShardMap) -> list[int]:
    """Start a move ``old`` -> ``new``: every PS tracks, the new owners pre-copy (from
    their own thread). Returns the PS that send vshards."""
    moves = old.moves(new)
    for p in ps.values():
        p.track()
    senders = sorted({m[1] for m in moves})
    for k in new.ps_ids:
        ps[k].prepare(new, [(Called(ps[s]), vs) for s in senders if (vs := [v for v, src, d in moves if src == s and d == k])])
    return senders


def _two_round_move(ps: dict, old: VShardMap, new: VShardMap) -> None:
    """A live move ``old`` -> ``new`` with pushes during round 1 and after it, checked row
    for row (weights and optimizer state) against the same pushes on copies of the PS
    that do not move."""
    opt = ps[old.ps_ids[0]]._optimizer
    ref = {k: EmbeddingPS(k, old, 4, opt, seed=5) for k in old.ps_ids}
    payloads = [ps[k].snapshot()[1] for k in old.ps_ids]
    for r in ref.values():
        r.restore(old, payloads)
    moves, trained = old.moves(new), old.ps_ids
    senders = _round_one(ps, old, new)
    for step in range(6):  # training goes on during round 1
        for k in trained:
            _push_some(ps[k], step)
            _push_some(ref[k], step)
    for k in new.ps_ids:
        while not ps[k].prepared():
            pass
    for step in range(6, 9):
        for k in trained:
            _push_some(ps[k], step)
            _push_some(ref[k], step)
    delta = {s: ps[s].export_vshards([v for v, src, _ in moves if src == s], dirty_only=True) for s in senders}
    for k in new.ps_ids:
        ps[k].reconfigure(new, [delta[s] for s in delta if any(src == s and d == k for _, src, d in moves)])
    for k in set(ps) - set(new.ps_ids):
        ps[k].vmap = new
    assert sum(len(d["dirty"][1][0]) for d in delta.values()) > 0  # some moving rows changed during round 1
    for got, want in zip(_full_tables(ps, new), _full_tables(ref, old)):
        assert not np.isnan(want).any()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("opt", ["rowwise_adagrad", "sgd"])
def test_two_round_migration_carries_updates_made_during_the_precopy(opt):
    """On moving and on kept vshards alike, into new tables."""
    v1 = VShardMap.round_robin(SIZES, 8, 2)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": opt, "lr": 0.1}, seed=5) for k in range(3)}
    _two_round_move(ps, v1, v1.reassigned([0, 2]))  # PS 1 retires, PS 2 joins
    # Optimizer state moved too: one more identical push gives identical rows.
    before = ps[2].table_rows(1)[1].copy()
    _push_some(ps[2], 0)
    assert not np.array_equal(before, ps[2].table_rows(1)[1])


@pytest.mark.parametrize("opt", ["rowwise_adagrad", "sgd"])
def test_a_scale_out_and_back_moves_vshards_in_place_in_the_tables_that_stay(opt):
    """PS 0 and 1 give vshards to PS 2 and keep their tables with the freed slots, then
    take the vshards back into those slots while training goes on: neither move
    reallocates their tables, and every update is carried."""
    v1 = VShardMap.round_robin(SIZES, 12, 2)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": opt, "lr": 0.1}, seed=5) for k in range(3)}
    tables = {k: ps[k].tbe for k in (0, 1)}
    out = v1.reassigned([0, 1, 2])
    _two_round_move(ps, v1, out)
    back = out.reassigned([0, 1])
    assert all(v1.keeps_tables(k, out) and out.keeps_tables(k, back) for k in (0, 1))
    _two_round_move(ps, out, back)
    assert all(ps[k].tbe is tables[k] for k in (0, 1))


def test_a_switch_staged_on_every_ps_then_cancelled_leaves_each_on_its_map_and_tables():
    """The blocks a staged switch brings in go to free slots of the tables that stay: a
    switch cancelled after staging (another PS failed to stage) changes nothing served,
    and the next move is exact."""
    v1 = VShardMap.round_robin(SIZES, 12, 2)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": "rowwise_adagrad", "lr": 0.1}, seed=5) for k in range(3)}
    out = v1.reassigned([0, 1, 2])
    _two_round_move(ps, v1, out)
    back, before = out.reassigned([0, 1]), _full_tables(ps, out)
    senders, moves = _round_one(ps, out, back), out.moves(back)
    for k in back.ps_ids:
        while not ps[k].prepared():
            pass
    delta = {s: ps[s].export_vshards([v for v, src, _ in moves if src == s], dirty_only=True) for s in senders}
    for k in back.ps_ids:
        ps[k].stage_switch(back, list(delta.values()))
    for p in ps.values():
        p.cancel_migration()
    assert all(p.vmap is out for p in ps.values())
    for got, want in zip(_full_tables(ps, out), before):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(RuntimeError, match="no switch"):
        ps[0].commit_switch(back.version)
    _two_round_move(ps, out, back)


@pytest.mark.parametrize("opt", ["rowwise_adagrad", "sgd"])
def test_a_ps_added_with_reserved_slots_takes_its_first_vshards_into_the_tables_it_started_with(opt):
    v1 = VShardMap.round_robin(SIZES, 12, 2)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": opt, "lr": 0.1}, seed=5) for k in range(2)}
    reserved = v1.with_reserved(2, 4)
    assert reserved.version == v1.version and not len(reserved.owned(2))
    ps[2] = EmbeddingPS(2, reserved, 4, {"name": opt, "lr": 0.1}, seed=5)
    started_with = ps[2].tbe
    assert started_with.split_embedding_weights()[1].shape[0] == 4 * reserved.rows_per_vshard()[1]
    out = reserved.reassigned([0, 1, 2])
    assert out.capacity[2] == 4 and reserved.keeps_tables(2, out)
    _two_round_move(ps, reserved, out)
    assert ps[2].tbe is started_with
    with pytest.raises(ValueError, match="owns vshards"):
        v1.with_reserved(0, 4)


@pytest.mark.parametrize("opt", ["rowwise_adagrad", "sgd"])
def test_a_ps_that_gives_and_takes_in_one_move_never_fills_a_slot_still_trained(opt):
    """PS 0 gives vshard 6 away and takes 7 (a load-weighted plan can do this): 7 must not
    go into 6's slot, which pushes still update until the switch."""
    v1 = VShardMap.round_robin(SIZES, 8, 2)
    owner = v1.owner.copy()
    owner[6], owner[7] = 1, 0
    swap = v1.with_owner(owner)
    assert swap.slot[7] != v1.slot[6] or not v1.keeps_tables(0, swap)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": opt, "lr": 0.1}, seed=5) for k in range(2)}
    _two_round_move(ps, v1, swap)


@pytest.mark.parametrize("opt", ["rowwise_adagrad", "sgd"])
def test_a_ps_with_free_slots_that_gives_and_takes_fills_only_slots_free_before(opt):
    v1 = VShardMap.round_robin(SIZES, 12, 2)
    ps = {k: EmbeddingPS(k, v1, 4, {"name": opt, "lr": 0.1}, seed=5) for k in range(3)}
    out = v1.reassigned([0, 1, 2])
    _two_round_move(ps, v1, out)  # PS 0 and 1 now have two free slots each
    owner = out.owner.copy()
    give, take = int(out.owned(0)[0]), int(out.owned(1)[0])
    owner[give], owner[take] = 1, 0
    swap = out.with_owner(owner)
    assert out.keeps_tables(0, swap) and swap.slot[take] not in out.slot[out.owner == 0]
    tables = ps[0].tbe
    _two_round_move(ps, out, swap)
    assert ps[0].tbe is tables


def test_a_dynamic_table_ps_that_gives_and_takes_keeps_its_admitted_ids():
    from dlrover.ps.dynamic import vshard_of
    from dlrover.table_spec import TableSpec, rows_of

    tables = {0: TableSpec(kind="dynamic", capacity_rows=64, admit_after=1, eviction="lru")}
    v1 = VShardMap.round_robin(rows_of([50] * 26, tables), 8, 2, (0,))
    ps = {k: EmbeddingPS(k, v1, 4, {"name": "sgd", "lr": 0.1}, 3, tables=tables) for k in range(2)}
    ids = np.arange(1, 4000, dtype=np.int64)
    for k in (0, 1):
        mine = ids[v1.owner[vshard_of(ids, 8)] == k][:40]
        for step in range(2):  # seen twice: admitted
            idx = np.zeros(26 * len(mine), dtype=np.int64)
            idx[: len(mine)] = mine
            ps[k].push(("w", step), np.ones_like(ps[k].pull(("w", step), idx, None)))
    owner = v1.owner.copy()
    owner[6], owner[7] = 1, 0
    v2 = v1.with_owner(owner)
    assert not any(v1.keeps_tables(k, v2) for k in (0, 1))
    admitted = {k: set(ps[k].dynamic_ids(0).tolist()) for k in (0, 1)}
    ex = {0: ps[0].export_vshards([6]), 1: ps[1].export_vshards([7])}
    ps[0].reconfigure(v2, [ex[1]])
    ps[1].reconfigure(v2, [ex[0]])
    for k in (0, 1):
        kept = {i for i in admitted[k] if v2.owner[vshard_of(np.array([i]), 8)[0]] == k}
        assert kept and kept <= set(ps[k].dynamic_ids(0).tolist())


class TrainsBetweenCalls(Called):
    """A source PS that trains a step (``step``) before each export it is asked for."""

    def __init__(self, ps: EmbeddingPS, step: Callable[[], None]) -> None:
        super().__init__(ps)
        self._step = step

    def __getattr__(self, name: str) -> SimpleNamespace:
        if name != "export_vshards":
            return super().__getattr__(name)

        def export(vshards: list[int], **kw: bool) -> dict:
            self._step()
            return self._ps.export_vshards(vshards, **kw)

        return SimpleNamespace(remote=export)


def test_ids_a_precopy_moves_age_from_the_clock_of_the_call_that_carried_them():
    """PS 2 asks PS 0 for one vshard per call, and PS 0 trains a step before each: the
    moved ids that nothing looks up again must end as old on PS 2 as on a PS 0 that
    never moved (the same steps), each aged from its own call's clock, not from the
    clock of another call of the same source."""
    from dlrover.ps.dynamic import vshard_of
    from dlrover.table_spec import TableSpec, rows_of

    # admitted at first sight: the waiting room (one position per block row) plays no part
    tables = {0: TableSpec(kind="dynamic", capacity_rows=64, eviction="lru")}
    v1 = VShardMap.round_robin(rows_of([50] * 26, tables), 16, 2, (0,))
    ps = {k: EmbeddingPS(k, v1, 4, {"name": "sgd", "lr": 0.1}, 3, tables=tables) for k in range(3)}  # PS 2 owns nothing yet
    ref = EmbeddingPS(0, v1, 4, {"name": "sgd", "lr": 0.1}, 3, tables=tables)
    v2 = v1.reassigned([0, 1, 2])
    sent = [v for v, s, d in v1.moves(v2) if s == 0]
    ids = np.arange(1, 4000, dtype=np.int64)
    on0 = ids[v1.owner[vshard_of(ids, 16)] == 0]
    moving = np.concatenate([on0[vshard_of(on0, 16) == v][:3] for v in sent])  # 4 rows per vshard: all admitted
    staying = on0[~np.isin(vshard_of(on0, 16), sent)][:10]
    steps = iter(range(100))

    def look_up(some: np.ndarray) -> None:  # one training step of PS 0 and of its twin
        key, idx = ("w", next(steps)), np.zeros(26 * len(some), dtype=np.int64)
        idx[: len(some)] = some
        for p in (ps[0], ref):
            p.push(key, np.ones_like(p.pull(key, idx, None)))

    for _ in range(2):
        look_up(moving)
    look_up(staying)
    for p in ps.values():
        p.track()
    ps[2].prepare(v2, [(TrainsBetweenCalls(ps[0], lambda: look_up(staying)), [v]) for v in sent] + [(Called(ps[1]), [v]) for v, s, d in v1.moves(v2) if s == 1])
    for k in (0, 1):
        ps[k].prepare(v2, [])
    while not all(p.prepared() is True for p in ps.values()):
        pass
    look_up(staying)
    delta = {s: ps[s].export_vshards([v for v, src, _ in v1.moves(v2) if src == s], dirty_only=True) for s in (0, 1)}
    for k in ps:
        ps[k].reconfigure(v2, list(delta.values()))

    def ages(p: EmbeddingPS) -> dict[int, int]:
        key, age, freq = p.snapshot()[1]["tables"][0][-6:-3]
        return {int(x): int(a) for x, a, f in zip(key, age, freq) if f > 0 and x in set(moving.tolist())}

    got, want = ages(ps[2]), ages(ref)
    assert len(set(vshard_of(moving, 16).tolist())) > 1 and len(set(want.values())) == 1 and len(got) == len(moving)
    assert got == want


def test_slots_stay_put_and_freed_slots_are_filled_before_tables_grow():
    v1 = VShardMap.round_robin(SIZES, 12, 2)
    out = v1.reassigned([0, 1, 2])
    for k in (0, 1):  # gave away the end of its slot order: holes at the end, same capacity
        assert out.capacity[k] == 6 and out.at_slots(k).tolist()[:4] == v1.at_slots(k).tolist()[:4]
        assert out.at_slots(k).tolist()[4:] == [-1, -1]
    assert out.capacity[2] == 4 and sorted(out.slot[out.owner == 2].tolist()) == [0, 1, 2, 3]
    back = out.reassigned([0, 1])
    assert all(back.capacity[k] == 6 and -1 not in back.at_slots(k).tolist() for k in (0, 1))
    for vmap in (out, back):  # every row in exactly one place, and routing finds it there
        for t, n in enumerate(SIZES):
            found = []
            for k in vmap.ps_ids:
                rows = vmap.global_rows(k, t)
                local = np.flatnonzero(rows >= 0)
                owner, routed = vmap.route(rows[local], np.full(len(local), t))
                assert np.all(owner == k) and np.array_equal(routed, local)
                found += rows[local].tolist()
            assert sorted(found) == list(range(n))


def test_a_ps_left_under_half_full_or_with_dynamic_tables_gets_compact_tables():
    one = VShardMap.round_robin(SIZES, 12, 1)
    spread = one.reassigned([0, 1, 2, 3])  # PS 0 keeps 3 of its 12 slots
    assert spread.capacity[0] == 3 and not one.keeps_tables(0, spread)
    dyn = VShardMap.round_robin(SIZES, 12, 2, dynamic=(1,))
    out = dyn.reassigned([0, 1, 2])
    assert all(out.capacity[k] == 4 and not dyn.keeps_tables(k, out) for k in (0, 1))


def test_a_precopy_asks_each_source_in_turn_for_a_few_vshards_per_call():
    from dlrover.ps.moves import PRECOPY_CALL_BYTES, calls

    a, b = object(), object()
    small = PRECOPY_CALL_BYTES // 3  # three vshards to a call
    assert calls([(a, [1, 2, 3, 4, 5]), (b, [9])], small) == [(a, [1, 2, 3]), (b, [9]), (a, [4, 5])]
    big = PRECOPY_CALL_BYTES * 2  # bigger than a call: one vshard each
    assert calls([(a, [1, 2]), (b, [8, 9])], big) == [(a, [1]), (b, [8]), (a, [2]), (b, [9])]
    assert calls([], big) == []
