"""Multi-hot bags through the PS equal a local TorchRec ``EmbeddingBagCollection`` of the
same schema: variable-length bags (empty ones too), sum and mean pooling, a table shared
by two features. Bit for bit on one PS; within float rounding when a bag's ids are split
over several PS (their partial sums are added in another order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from conftest import gathered_table
from dlrover.data.batch import Batch
from dlrover.model.dlrm import PSClient, PSEmbeddingBagCollection, make_kjt, table_configs
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.vshard import VShardMap
from dlrover.spec import spec_from_dict

DIM, N = 8, 200
SPEC = spec_from_dict({
    "features": {"label": "y", "sparse": [
        "user",
        {"column": "history", "max_len": 20},
        {"column": "genres", "separator": "|", "max_len": 5},
        {"column": "liked", "table": "genres", "separator": "|", "max_len": 5},
    ]},
    "model": {"embedding_dim": DIM, "num_embeddings": 997, "dense_arch": [DIM], "over_arch": [1],
              "tables": {"history": {"pooling": "mean", "num_embeddings": 5003}, "genres": {"num_embeddings": 31}}},
    "data": {"paths": ["x"]},
})  # fmt: skip
SCHEMA = SPEC.schema


def _batch(seed: int) -> Batch:
    """Bags of 0..max_len ids per feature (the user always has one), raw 40-bit ids."""
    rng = np.random.default_rng(seed)
    lengths = np.stack([np.ones(N, np.int32)] + [rng.integers(0, f.max_len + 1, N).astype(np.int32) for f in SCHEMA.sparse[1:]])
    ids = rng.integers(0, 2**40, int(lengths.sum()))
    return Batch(np.zeros(N, np.float32), np.ones((N, 1), np.float32), ids, lengths)


def _setup(ray, num_ps: int, vshards: int, lr: float = 0.1):
    sizes = SCHEMA.table_sizes()
    vmap = VShardMap.round_robin(sizes, vshards, num_ps)
    ps = [ray.remote(EmbeddingPS).remote(k, vmap, DIM, {"name": "sgd", "lr": lr}, 0) for k in range(num_ps)]
    rng = np.random.default_rng(num_ps)
    weights = [rng.standard_normal((n, DIM)).astype(np.float32) for n in sizes]
    for t, w in enumerate(weights):
        owner = vmap.owner[np.arange(sizes[t]) % vmap.num_vshards]
        ray.get([ps[k].set_table_rows.remote(t, np.flatnonzero(owner == k), w[owner == k]) for k in range(num_ps)])
    client = PSClient(ps, vmap, DIM, "test-worker", get=ray.get, feature_tables=SCHEMA.feature_tables())
    return ps, weights, PSEmbeddingBagCollection(table_configs(SPEC.model, SCHEMA), client)


def _local(weights) -> EmbeddingBagCollection:
    ebc = EmbeddingBagCollection(tables=table_configs(SPEC.model, SCHEMA))
    with torch.no_grad():
        for t, w in zip(SCHEMA.tables, weights):
            ebc.embedding_bags[f"t_{t.name}"].weight.copy_(torch.from_numpy(w))
    return ebc


def _rows_kjt(batch: Batch):
    from dlrover.bench.baseline import local_kjt

    return local_kjt(batch, SCHEMA)


def test_the_batch_is_variable_length_with_empty_bags_and_a_shared_table():
    lengths = _batch(0).lengths
    assert (lengths[1:] == 0).any() and lengths[1].max() > 5
    assert SCHEMA.feature_tables() == [0, 1, 2, 2] and SCHEMA.mean_features() == [1]


@pytest.mark.parametrize("num_ps,vshards,exact", [(1, 8, True), (3, 24, False)])
def test_pooled_multi_hot_bags_equal_a_local_embedding_bag_collection(ray_local, num_ps, vshards, exact):
    ps, weights, ps_ebc = _setup(ray_local, num_ps, vshards)
    ps_ebc.eval()
    batch = _batch(1)
    got = ps_ebc(make_kjt(batch, SCHEMA.feature_names))
    want = _local(weights)(_rows_kjt(batch))
    assert got.keys() == want.keys() == SCHEMA.feature_names
    if exact:
        torch.testing.assert_close(got.values(), want.values(), rtol=0, atol=0)
    else:
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-6, atol=1e-6)


def test_a_step_through_the_ps_updates_rows_as_a_local_step_does(ray_local):
    """The gradient of mean bags is scaled by their length, a shared table gets both
    features' gradients: one SGD step equals the local EBC's."""
    lr = 0.1
    ps, weights, ps_ebc = _setup(ray_local, 2, 16, lr=lr)
    batch = _batch(2)
    upstream = torch.randn(N, len(SCHEMA.sparse) * DIM, generator=torch.Generator().manual_seed(0))
    kjt = make_kjt(batch, SCHEMA.feature_names)
    (ps_ebc(kjt).values() * upstream).sum().backward()
    applied = ray_local.get(ps_ebc.take_push_refs())
    split = sum(r.dest.numel() for r in ps_ebc.client.route(kjt).requests)  # (bag, PS holding some of its ids) pairs
    assert sum(applied) == split > int((batch.lengths > 0).sum())  # split bags update each of their PS
    local = _local(weights)
    (local(_rows_kjt(batch)).values() * upstream).sum().backward()
    for t, table in enumerate(SCHEMA.tables):
        w = local.embedding_bags[f"t_{table.name}"].weight
        expected = (w - lr * w.grad).detach().numpy()
        np.testing.assert_allclose(gathered_table(ray_local, ps, t, expected), expected, atol=1e-5)
    ids = sum(ray_local.get(h.stats.remote()).ids_updated for h in ps)
    assert ids == batch.num_ids
