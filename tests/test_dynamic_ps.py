"""Dynamic tables served by real PS actors: the same ids get the same rows and the same
pooled sums as a local reference of the map rules, under SGD updates and any PS count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrover.data.schema import CRITEO
from dlrover.model.dlrm import PSClient
from dlrover.ps.dynamic import vshard_of
from dlrover.ps.dynamic_tables import default_row
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.tables import init_rows
from dlrover.ps.vshard import VShardMap
from dlrover.table_spec import TableSpec, rows_of
from dynamic_reference import ReferenceMap

V, DIM, LR, SEED, CAP = 8, 4, 0.05, 3, 21  # 21 rows over 8 vshards: some vshards hold 2, some 3
TABLES = {
    0: TableSpec(kind="dynamic", capacity_rows=CAP, admit_after=1, eviction="lru"),
    4: TableSpec(kind="dynamic", capacity_rows=CAP, eviction="lfu"),
    9: TableSpec(kind="dynamic", capacity_rows=CAP, admit_after=2, eviction="ttl", ttl_steps=2),
}
SIZES = rows_of([50] * 26, TABLES)


class LocalTables:
    """Every table in one place: hashed rows by ``id % N``, dynamic rows by the reference
    map over all vshards, SGD applied per id occurrence."""

    def __init__(self) -> None:
        self.w = [init_rows(SEED, t, n, DIM, np.arange(n)) for t, n in enumerate(SIZES)]
        rpv = -(-CAP // V)
        valid = np.array([j * V + v < CAP for v in range(V) for j in range(rpv)])
        self.maps = {t: ReferenceMap(valid, rpv, s.admit_after, s.eviction.value, s.ttl_steps) for t, s in TABLES.items()}
        self.rpv, self.clock, self.evictions = rpv, 0, 0

    def rows(self, t: int, ids: list[int]) -> list[int]:
        """Global row of each id of a table this step (-1: the default row)."""
        if t not in self.maps:
            return [x % SIZES[t] for x in ids]
        block = dict(zip(ids, vshard_of(np.array(ids, dtype=np.int64), V).tolist()))
        pos, evicted = self.maps[t].lookup(ids, block, self.clock)
        self.evictions += len(evicted)
        for p in evicted:  # back to its initial value
            g = (p % self.rpv) * V + p // self.rpv
            self.w[t][g] = init_rows(SEED, t, CAP, DIM, np.array([g]))[0]
        return [-1 if pos[x] < 0 else (pos[x] % self.rpv) * V + pos[x] // self.rpv for x in ids]

    def step(self, bags: list[list[list[int]]], grad: torch.Tensor) -> torch.Tensor:
        """Pooled [B, T*D] of ``bags[t][b]``, then the SGD update by ``grad``."""
        self.clock += 1
        n = len(bags[0])
        pooled, touched = torch.zeros(n, len(SIZES), DIM), []
        for t, table in enumerate(bags):
            flat = [x for bag in table for x in bag]
            rows = iter(self.rows(t, flat) if flat else [])
            for b, bag in enumerate(table):
                for r in (next(rows) for _ in bag):
                    pooled[b, t] += default_row(SEED, t, CAP, DIM) if r < 0 else self.w[t][r]
                    if r >= 0:
                        touched.append((t, r, b))
        g = grad.view(n, len(SIZES), DIM)
        for t, r, b in touched:
            self.w[t][r] -= LR * g[b, t]
        return pooled.view(n, -1)


def _batch(rng: np.random.Generator, n: int) -> list[list[list[int]]]:
    """Per table, ``n`` bags of 0..3 ids; dynamic ids are raw 64-bit values from a skewed pool."""
    pool = (np.arange(40, dtype=np.int64) * 0x9E3779B97F4A7C1) ^ (1 << 62)
    out = []
    for t in range(len(SIZES)):
        lengths = rng.integers(0, 4, size=n)
        ids = pool[rng.zipf(1.5, size=int(lengths.sum())) % len(pool)] if t in TABLES else rng.integers(0, 2**40, size=int(lengths.sum()))
        out.append([list(map(int, part)) for part in np.split(ids, np.cumsum(lengths)[:-1])])
    return out


def _kjt(bags: list[list[list[int]]]) -> KeyedJaggedTensor:
    values = torch.tensor([x for table in bags for bag in table for x in bag], dtype=torch.int64)
    lengths = torch.tensor([len(bag) for table in bags for bag in table], dtype=torch.int32)
    return KeyedJaggedTensor.from_lengths_sync(keys=CRITEO.feature_names, values=values, lengths=lengths)


def train_and_compare(client, local, rng, n: int, bags_per_step: int = 48, *, get) -> None:
    """``n`` training steps through the PS and through the local reference: the pooled
    sums must agree (up to summation order) before each step's gradient is pushed."""
    for step in range(n):
        bags = _batch(rng, bags_per_step)
        lookup = client.start(_kjt(bags), train=True)
        got = client.wait(lookup)
        grad = torch.from_numpy(rng.standard_normal(got.shape).astype(np.float32))
        torch.testing.assert_close(got, local.step(bags, grad), rtol=1e-5, atol=1e-5, msg=f"step {step}")
        get(client.send(client.hold(lookup, grad)))


@pytest.mark.parametrize("num_ps", [1, 3])
def test_dynamic_tables_give_the_reference_rows_and_pooled_sums_under_updates(ray_local, num_ps):
    vmap = VShardMap.round_robin(SIZES, V, num_ps, tuple(TABLES))
    actor = ray_local.remote(EmbeddingPS)
    ps = [actor.remote(k, vmap, DIM, {"name": "sgd", "lr": LR}, SEED, tables=TABLES) for k in range(num_ps)]
    client, local = PSClient(ps, vmap, DIM, "w", get=ray_local.get), LocalTables()
    rng = np.random.default_rng(num_ps)
    train_and_compare(client, local, rng, 12, get=ray_local.get)
    for t, ref in local.maps.items():
        admitted = np.concatenate([ray_local.get(p.dynamic_ids.remote(t)) for p in ps])
        assert sorted(admitted.tolist()) == sorted(e[0] for e in ref.rows.values()) and len(ref.rows) > 0
    assert local.evictions > 0
    assert all(s.pending == 0 for s in ray_local.get([p.stats.remote() for p in ps]))


def test_a_dynamic_tables_map_moves_with_its_vshard_when_a_ps_joins(ray_local):
    v1 = VShardMap.round_robin(SIZES, V, 2, tuple(TABLES))
    actor = ray_local.remote(EmbeddingPS)
    ps = {k: actor.remote(k, v1, DIM, {"name": "sgd", "lr": LR}, SEED, tables=TABLES) for k in range(3)}  # ps-2 owns nothing yet
    client, local = PSClient({k: ps[k] for k in (0, 1)}, v1, DIM, "w", get=ray_local.get), LocalTables()
    rng = np.random.default_rng(5)

    def steps(n: int) -> None:
        train_and_compare(client, local, rng, n, get=ray_local.get)

    steps(6)
    v2 = v1.reassigned([0, 1, 2])
    moves = v1.moves(v2)
    assert any(dst == 2 for _, _, dst in moves)
    exports = {s: ps[s].export_vshards.remote([v for v, src, _ in moves if src == s]) for s in {src for _, src, _ in moves}}
    ray_local.get([ps[k].reconfigure.remote(v2, [exports[s] for s in exports if any(src == s and d == k for _, src, d in moves)]) for k in ps])
    client.set_routing(ps, v2)
    steps(6)  # the moved ids keep their rows, ages and counts: the same evictions as the reference
    for t, ref in local.maps.items():
        admitted = np.concatenate([ray_local.get(p.dynamic_ids.remote(t)) for p in ps.values()])
        assert sorted(admitted.tolist()) == sorted(e[0] for e in ref.rows.values())
    assert len(ray_local.get(ps[2].dynamic_ids.remote(0))) > 0



def ages(ray_local, ps: dict) -> dict:
    """Per dynamic table, the ids held (admitted and waiting) with their ages and counts,
    read from the PS's snapshots (which carry ages, as every payload does)."""
    out = {}
    for t in TABLES:
        held = set()
        for p in ps.values():
            key, age, freq, pkey, page, pcount = ray_local.get(p.snapshot.remote())[1]["tables"][t][-6:]
            held |= {("row", int(k), int(a), int(f)) for k, a, f in zip(key, age, freq) if f > 0}
            held |= {("waiting", int(k), int(a), int(c)) for k, a, c in zip(pkey, page, pcount) if c > 0}
        out[t] = held
    return out


def reference_ages(local: LocalTables) -> dict:
    return {
        t: {("row", x, local.clock - last, n) for x, last, n in ref.rows.values()} | {("waiting", x, local.clock - last, n) for x, last, n in ref.wait.values()}
        for t, ref in local.maps.items()
    }


def test_a_two_round_move_keeps_the_ages_of_the_ids_untouched_during_the_precopy(ray_local):
    """Live migration copies a moving vshard's map while training goes on (round 1), then
    at the switch only the rows looked up meanwhile (round 2). The ids not looked up since
    the precopy must have aged by the lookups trained in between, like the others, or the
    new owner evicts other ids than a PS that never moved (a joining PS's clock stands
    still until it serves). Round 1's batches are small, so that most ids sit it out."""
    v1 = VShardMap.round_robin(SIZES, V, 2, tuple(TABLES))
    actor = ray_local.remote(EmbeddingPS)
    ps = {k: actor.remote(k, v1, DIM, {"name": "sgd", "lr": LR}, SEED, tables=TABLES) for k in range(3)}  # ps-2 owns nothing yet
    client, local = PSClient({k: ps[k] for k in (0, 1)}, v1, DIM, "w", get=ray_local.get), LocalTables()
    rng = np.random.default_rng(11)

    def steps(n: int, bags_per_step: int = 48) -> None:
        train_and_compare(client, local, rng, n, bags_per_step, get=ray_local.get)

    steps(6)
    v2 = v1.reassigned([0, 1, 2])
    moves = v1.moves(v2)
    outgoing = {s: [v for v, src, _ in moves if src == s] for s in {src for _, src, _ in moves}}
    incoming = lambda k, payloads: [payloads[s] for s in payloads if any(src == s and d == k for _, src, d in moves)]  # noqa: E731
    ray_local.get([p.track.remote() for p in ps.values()])
    # One vshard per export call (a source listed once per vshard), each with its own clock.
    sources = lambda k: [(ps[s], [v]) for v, s, d in moves if d == k]  # noqa: E731
    ray_local.get([ps[k].prepare.remote(v2, sources(k)) for k in ps])
    steps(5, bags_per_step=3)  # round 1: training goes on
    while not all(ray_local.get([p.prepared.remote() for p in ps.values()])):
        pass
    dirty = {s: ps[s].export_vshards.remote(vs, dirty_only=True) for s, vs in outgoing.items()}
    ray_local.get([ps[k].reconfigure.remote(v2, incoming(k, dirty)) for k in ps])
    client.set_routing(ps, v2)
    assert ages(ray_local, ps) == reference_ages(local)
    evictions = local.evictions
    steps(6)  # same rows and sums as the reference: the same evictions
    assert local.evictions > evictions
    assert ages(ray_local, ps) == reference_ages(local)
