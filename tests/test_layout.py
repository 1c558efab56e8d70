"""A PS's tables in one flat TBE table, and a request's bags laid out for it: the answer
holds every bag in the documented order, an unadmitted id is left out of its bag, and
training one flat table is bit for bit training separate tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrover.ps.layout import flat_batch, table_spans
from dlrover.ps.migration import DirtyRows
from dlrover.ps.tables import PSTables, new_tbe

SIZES, DIM = [5, 40, 7], 4
OPTIMIZER = {"name": "rowwise_adagrad", "lr": 0.1}


def tables_with_known_rows(optimizer: dict = OPTIMIZER) -> PSTables:
    t = PSTables(SIZES, DIM, optimizer)
    with torch.no_grad():
        for i, w in enumerate(t.split_embedding_weights()):
            w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(i)))
    return t


def bag_sums(t: PSTables, rows: list[list[int]], table: int) -> torch.Tensor:
    """What each bag (the rows it holds, of ``table``) pools to, from the table's own view."""
    w = t.split_embedding_weights()[table].detach()
    return torch.stack([w[torch.tensor(r, dtype=torch.int64)].sum(0) if r else torch.zeros(DIM) for r in rows])


def test_a_uniform_request_is_answered_sample_major_as_tbe_of_separate_tables_would():
    """Every table b one-id bags: the answer's row i holds bag i of every table."""
    t, b = tables_with_known_rows(), 3
    rows = np.array([0, 4, 2, 39, 0, 17, 6, 6, 1], dtype=np.int64)  # table-major
    batch = flat_batch(rows, None, None, t.base)
    out = t(batch.indices, batch.offsets).detach().view(b, len(SIZES) * DIM)
    for table in range(len(SIZES)):
        want = bag_sums(t, [[int(r)] for r in rows[table * b : (table + 1) * b]], table)
        torch.testing.assert_close(out[:, table * DIM : (table + 1) * DIM], want, rtol=0, atol=0)


@pytest.mark.parametrize("multi_hot", [False, True])
def test_an_uneven_request_is_answered_bag_by_bag_table_major_without_padding(multi_hot):
    t = tables_with_known_rows()
    bags = np.array([1, 3, 0])  # table 2: no bag on this PS
    per_bag = [[3, 1], [0], [39, 39, 2], [5]] if multi_hot else [[3], [0], [39], [5]]
    rows = np.array([r for bag in per_bag for r in bag], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(bag) for bag in per_bag])]) if multi_hot else None
    batch = flat_batch(rows, offsets, bags, t.base)
    out = t(batch.indices, batch.offsets).detach()
    assert out.shape == (4, DIM) and batch.dropped is None
    want = torch.cat([bag_sums(t, per_bag[:1], 0), bag_sums(t, per_bag[1:], 1)])
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert table_spans(len(rows), offsets, bags, 3).tolist() == ([0, 2, 7, 7] if multi_hot else [0, 1, 4, 4])


def test_ids_not_admitted_leave_their_bags_and_are_counted_per_bag():
    """-1 (a dynamic table's id without a row) is not looked up; its bag still answers."""
    t = tables_with_known_rows()
    rows = np.array([2, -1, 7, -1, -1, 1], dtype=np.int64)  # uniform, b = 2, table-major
    batch = flat_batch(rows, None, None, t.base)
    assert batch.dropped.tolist() == [0, 0, 1, 1, 1, 0]  # sample-major: (s0,t0), (s0,t1), ...
    assert batch.bag_table.tolist() == [0, 1, 2, 0, 1, 2]
    assert batch.indices.tolist() == [2, 5 + 7, 45 + 1]
    out = t(batch.indices, batch.offsets).detach()
    torch.testing.assert_close(out[4], torch.zeros(DIM), rtol=0, atol=0)  # (s1, t1): only an unadmitted id


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adagrad", "sgd"])
def test_one_flat_table_trains_bit_for_bit_as_a_tbe_of_separate_tables(name):
    """The same bags through a TBE of the three tables (padded to equal bags) and through
    the flat table, three steps: same answers, same weights, same optimizer state, with
    every sparse optimizer offered."""
    optimizer = {"name": name, "lr": 0.1}
    flat, separate = tables_with_known_rows(optimizer), new_tbe(SIZES, DIM, optimizer)
    with torch.no_grad():
        for a, w in zip(separate.split_embedding_weights(), flat.split_embedding_weights()):
            a.copy_(w)
    rng = np.random.default_rng(1)
    for _ in range(3):
        bags = np.array([4, 2, 3])
        rows = np.concatenate([rng.integers(0, n, b) for n, b in zip(SIZES, bags)])
        grad = torch.randn(int(bags.sum()), DIM, generator=torch.Generator().manual_seed(int(rows.sum())))
        batch = flat_batch(rows, None, bags, flat.base)
        out = flat(batch.indices, batch.offsets)
        width = int(bags.max())  # separate tables: every table padded to ``width`` bags
        lengths = np.zeros((len(SIZES), width), dtype=np.int64)
        for i, b in enumerate(bags):
            lengths[i, :b] = 1
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths.reshape(-1))]))
        padded = separate(torch.from_numpy(rows), offsets)
        real = torch.from_numpy(np.flatnonzero(lengths.T.reshape(-1)))  # [width, T*D] viewed [width*T, D]
        real = real[np.argsort(real.numpy() % len(SIZES), kind="stable")]  # table-major
        torch.testing.assert_close(padded.detach().view(-1, DIM)[real], out.detach(), rtol=0, atol=0)
        g = torch.zeros(width * len(SIZES), DIM)
        g[real] = grad
        padded.backward(g.view(width, -1))
        out.backward(grad)
    for a, b in zip(separate.split_embedding_weights(), flat.split_embedding_weights()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if name != "sgd":  # SGD keeps no state
        for a, b in zip(separate.split_optimizer_states(), flat.split_optimizer_states(), strict=True):
            torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)


def test_dirty_rows_marks_the_flat_rows_of_a_batch_in_their_own_tables():
    dirty = DirtyRows(SIZES)
    rows, bags = np.array([4, 0, 39, 6], dtype=np.int64), np.array([1, 2, 1])
    dirty.mark(flat_batch(rows, None, bags, PSTables(SIZES, DIM, OPTIMIZER).base).indices)
    assert [np.flatnonzero(dirty.table(t)).tolist() for t in range(3)] == [[4], [0, 39], [6]]
