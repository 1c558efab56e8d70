"""The PS actors serve exactly what a local TorchRec EmbeddingBagCollection would."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from conftest import gathered_table
from dlrover.model.dlrm import PSClient, PSEmbeddingBagCollection, make_kjt, table_configs
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.migration import DirtyRows
from dlrover.ps.shm import LocalLinks
from dlrover.ps.vshard import VShardMap
from dlrover.spec import ModelSpec
from dlrover.worker.lookahead import ring_slots

SIZES = [3, 17, 100, 1000] + [257] * 22
MODEL = ModelSpec(embedding_dim=8, num_embeddings=SIZES, dense_arch=[8], over_arch=[1])


def _ps_setup(ray, num_ps: int, vshards: int, lr: float = 0.1, shm: bool = False):
    vmap = VShardMap.round_robin(SIZES, vshards, num_ps)
    cls = ray.remote(EmbeddingPS)
    ps = [cls.remote(k, vmap, 8, {"name": "sgd", "lr": lr}, 0) for k in range(num_ps)]
    rng = np.random.default_rng(num_ps)
    weights = [rng.standard_normal((n, 8)).astype(np.float32) for n in SIZES]
    # Write every row to its owner through the public API; the local EBC gets the same.
    for t, w in enumerate(weights):
        owner = vmap.owner[np.arange(SIZES[t]) % vmap.num_vshards]
        ray.get([ps[k].set_table_rows.remote(t, np.flatnonzero(owner == k), w[owner == k]) for k in range(num_ps)])
    client = PSClient(ps, vmap, 8, "test-worker", get=ray.get)
    if shm:  # this process and the PS share the node: ids, answers and gradients in shared memory
        bags = 512 * len(SIZES)
        client.set_routing(client.ps, vmap, LocalLinks("test-worker", set(range(num_ps)), bags * 8, wait=ray.wait, slots=ring_slots(1), ids_capacity=2 * bags + 1))
    return vmap, ps, weights, PSEmbeddingBagCollection(table_configs(MODEL), client)


def _local_ebc(weights):
    ebc = EmbeddingBagCollection(tables=table_configs(MODEL))
    with torch.no_grad():
        for t, w in enumerate(weights):
            ebc.embedding_bags[f"t_C{t + 1}"].weight.copy_(torch.from_numpy(w))
    return ebc


@pytest.mark.parametrize("shm", [False, True])
@pytest.mark.parametrize("num_ps,vshards", [(1, 8), (2, 16), (3, 64)])
def test_pooled_embeddings_match_local_ebc(ray_local, num_ps, vshards, shm):
    vmap, ps, weights, ps_ebc = _ps_setup(ray_local, num_ps, vshards, shm=shm)
    ps_ebc.eval()
    sparse = np.random.default_rng(7).integers(0, 2**32, size=(300, 26))
    got = ps_ebc(make_kjt(sparse)).values()
    want = _local_ebc(weights)(make_kjt(sparse % np.array(SIZES))).values()
    assert got.shape == (300, 26 * 8)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("shm", [False, True])
def test_multi_hot_partial_sums_add_up(ray_local, shm):
    """Bags with several ids spread over several PS: partial sums add to the full pool."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    vmap, ps, weights, ps_ebc = _ps_setup(ray_local, 3, 12, shm=shm)
    ps_ebc.eval()
    rng = np.random.default_rng(1)
    lengths = torch.from_numpy(rng.integers(0, 4, size=26 * 50)).to(torch.int32)
    values = torch.from_numpy(rng.integers(0, 2**31, size=int(lengths.sum())))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"C{i + 1}" for i in range(26)], values=values, lengths=lengths)
    rows = torch.remainder(values, torch.repeat_interleave(torch.tensor(SIZES), lengths.view(26, 50).sum(1)))
    ref_kjt = KeyedJaggedTensor.from_lengths_sync(keys=kjt.keys(), values=rows, lengths=lengths)
    torch.testing.assert_close(ps_ebc(kjt).values(), _local_ebc(weights)(ref_kjt).values(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shm", [False, True])
def test_gradients_reach_the_right_rows(ray_local, shm):
    """One SGD step through the PS equals the same step on a local EBC."""
    lr = 0.1
    vmap, ps, weights, ps_ebc = _ps_setup(ray_local, 2, 16, lr=lr, shm=shm)
    sparse = np.random.default_rng(2).integers(0, 2**32, size=(128, 26))
    upstream = torch.randn(128, 26 * 8)
    (ps_ebc(make_kjt(sparse)).values() * upstream).sum().backward()
    ray_local.get(ps_ebc.take_push_refs())
    local = _local_ebc(weights)
    (local(make_kjt(sparse % np.array(SIZES))).values() * upstream).sum().backward()
    for t in range(26):
        w = local.embedding_bags[f"t_C{t + 1}"].weight
        expected = (w - lr * w.grad).detach().numpy()
        np.testing.assert_allclose(gathered_table(ray_local, ps, t, expected), expected, atol=1e-5)


def test_vshard_map_layout_covers_every_row_once():
    vmap = VShardMap.round_robin([10, 1000, 7], 16, 3)
    for t, n in enumerate([10, 1000, 7]):
        rows = np.concatenate([vmap.global_rows(k, t) for k in range(3)])
        rows = rows[rows >= 0]
        assert sorted(rows.tolist()) == list(range(n))
    with pytest.raises(ValueError):
        VShardMap.round_robin([10], 2, 3)


def test_a_rescale_moves_the_end_of_a_ps_slot_order_and_exports_it_without_a_copy():
    from dlrover.ps.migration import export_blocks

    v = VShardMap.round_robin([50, 7], 8, 2)
    grown = v.reassigned([0, 1, 2])
    for k in (0, 1):  # what each old PS gives away is the end of its slots
        owned, given = list(v.owned(k)), [vs for vs, src, _ in v.moves(grown) if src == k]
        assert given and owned[-len(given):] == given
    arrays = [[torch.arange(28 * r, dtype=torch.float32).view(-1, 4)] for r in (7, 1)]
    rpv = [7, 1]
    run, scattered = export_blocks(arrays, np.array([2, 3]), rpv), export_blocks(arrays, np.array([0, 2]), rpv)
    assert np.shares_memory(run[0][0], arrays[0][0].numpy()) and not np.shares_memory(scattered[0][0], arrays[0][0].numpy())
    assert np.array_equal(run[0][0], arrays[0][0].numpy()[14:28]) and np.array_equal(scattered[1][0], arrays[1][0].numpy()[[0, 2]])


def test_initial_weights_do_not_depend_on_the_number_of_ps():
    sizes = [70_000, 5]  # spans two init blocks
    tables = {}
    for num_ps in (1, 3):
        vmap = VShardMap.round_robin(sizes, 8, num_ps)
        full = [np.zeros((n, 4), np.float32) for n in sizes]
        for k in range(num_ps):
            ps = EmbeddingPS(k, vmap, 4, {"name": "sgd", "lr": 0.1}, seed=5)
            for t in range(len(sizes)):
                rows, w = ps.table_rows(t)
                full[t][rows] = w
        tables[num_ps] = full
    for a, b in zip(tables[1], tables[3]):
        np.testing.assert_array_equal(a, b)
        assert np.abs(a).max() > 0 and np.abs(a).max() <= (1 / len(a)) ** 0.5


def test_restoring_no_payloads_puts_back_the_seed_rows_under_the_new_map():
    """The launch cut (``Checkpointer.payloads`` source "initial"): a PS rebuilds its
    vshards of any map from the seed, whatever it trained or owned before."""
    sizes = [300, 40]
    v2 = VShardMap.round_robin(sizes, 8, 2)
    fresh = EmbeddingPS(1, v2, 4, {"name": "sgd", "lr": 0.1}, seed=5)
    ps = EmbeddingPS(1, VShardMap.round_robin(sizes, 8, 3), 4, {"name": "sgd", "lr": 0.1}, seed=5)
    rows, w = ps.table_rows(0)
    ps.set_table_rows(0, rows, w + 1.0)  # trained away from the seed
    assert ps.restore(v2, None) == 0
    for t in range(len(sizes)):
        (rows, w), (want_rows, want) = ps.table_rows(t), fresh.table_rows(t)
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(w, want)


def test_ids_on_counts_exactly_the_ids_routing_sends_to_each_ps():
    """Partial recovery counts a dead PS's lost updates with ``ids_on``: it must agree
    with the route the workers' pushes take."""
    from dlrover.data.batch import Batch

    vmap = VShardMap.round_robin(SIZES, 16, 3)
    sparse = np.random.default_rng(5).integers(0, 2**40, size=(500, len(SIZES)))
    batch = Batch(np.zeros(500, np.float32), np.zeros((500, 0), np.float32), sparse)
    routed = PSClient([None] * 3, vmap, 8, "w", get=None).route(make_kjt(sparse))
    ids, tables = batch.jagged()[0], batch.features_of_ids()
    for r in routed.requests:
        assert vmap.ids_on(ids, tables, [r.ps]) == r.dest.numel()
    assert vmap.ids_on(ids, tables, [0, 1, 2]) == sparse.size


@pytest.mark.parametrize("num_ps", [1, 2])
def test_many_steps_through_shared_memory_train_exactly_as_through_ray_objects(ray_local, num_ps):
    """More steps than slots, each prefetched one step ahead as workers do: the slots are
    reused only once their batch is done, so the tables end bit for bit the same."""
    rng = np.random.default_rng(9)
    batches = [rng.integers(0, 2**32, size=(200, 26)) for _ in range(7)]
    upstream = [torch.randn(200, 26 * 8, generator=torch.Generator().manual_seed(i)) for i in range(7)]
    tables = []
    for shm in (False, True):
        vmap, ps, _, ebc = _ps_setup(ray_local, num_ps, 16, shm=shm)
        kjts = [make_kjt(b) for b in batches]
        ebc.prefetch(kjts[0])
        for i, kjt in enumerate(kjts):
            if i + 1 < len(kjts):
                ebc.prefetch(kjts[i + 1])
            (ebc(kjt).values() * upstream[i]).sum().backward()
        ray_local.get(ebc.take_push_refs())
        tables.append([np.concatenate([ray_local.get(h.table_rows.remote(t))[1] for h in ps]) for t in range(26)])
    for a, b in zip(*tables):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shm", [False, True])
def test_pushes_carried_by_the_next_pull_train_exactly_as_pushes_sent_alone(ray_local, shm):
    """A prefetch sends the last backward's pushes in the same call as its pulls, applied
    first: every pull sees the same rows and the tables end bit for bit the same as when
    each push goes out alone. A batch that pulls from one PS only (ids 0: vshard 0) leaves
    the other PS's push to go out alone, still before that PS's next pull."""
    rng = np.random.default_rng(11)
    batches = [rng.integers(0, 2**32, size=(64, 26)), np.zeros((64, 26), dtype=np.int64)]
    batches += [rng.integers(0, 2**32, size=(64, 26)) for _ in range(3)]
    upstream = [torch.randn(64, 26 * 8, generator=torch.Generator().manual_seed(i)) for i in range(len(batches))]
    runs = []
    for carried in (False, True):
        vmap, ps, _, ebc = _ps_setup(ray_local, 2, 16, shm=shm)
        pooled = []
        for i, b in enumerate(batches):
            kjt = make_kjt(b)
            ebc.prefetch(kjt)
            out = ebc(kjt).values()
            pooled.append(out.detach().clone())
            (out * upstream[i]).sum().backward()
            if not carried:
                ray_local.get(ebc.take_push_refs())
        ray_local.get(ebc.take_push_refs())
        stats = ray_local.get([h.stats.remote() for h in ps])
        tables = [np.concatenate([ray_local.get(h.table_rows.remote(t))[1] for h in ps]) for t in range(26)]
        runs.append((pooled, tables, [(s.pulls, s.pushes, s.pending) for s in stats]))
    (pooled_a, tables_a, counts_a), (pooled_b, tables_b, counts_b) = runs
    for a, b in zip(pooled_a, pooled_b):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(tables_a, tables_b):
        np.testing.assert_array_equal(a, b)
    assert counts_a == counts_b == [(5, 5, 0), (4, 4, 0)]
