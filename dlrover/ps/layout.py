"""A PS request's bags as one flat TBE batch, in the order the PS answers them.

A request (``dlrover.ps.routing``) holds table-local row ids, table-major, in one of two
shapes. Uniform (``offsets`` and ``bags`` None): every table has the same number ``b`` of
bags of one id each; the answer is TBE's ``[b, T*D]``, its row ``i`` the ``i``-th bag of
every table, so the bags go to TBE sample-major. Otherwise ``bags[t]`` bags of table
``t`` (``offsets`` None when each holds one id); the answer is ``[num_bags, D]``, the bags
in table-major order. Either way TBE sees only real bags, of the PS's one flat table
(``dlrover.ps.tables.PSTables``): row ``r`` of table ``t`` is ``base[t] + r``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class FlatBatch:
    """What TBE is given, and per answered bag the ids left out of it."""

    indices: torch.Tensor  # flat rows
    offsets: torch.Tensor  # [num_bags + 1]
    dropped: np.ndarray | None = None  # per bag, ids not admitted (a dynamic table's); None: none
    bag_table: np.ndarray | None = None  # per bag, its table (set with ``dropped``)


def row_bases(sizes: list[int]) -> np.ndarray:
    """``[T + 1]``: table ``t``'s rows are flat rows ``base[t]`` to ``base[t + 1]``."""
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def table_spans(num_ids: int, offsets: np.ndarray | None, bags: np.ndarray | None, num_tables: int) -> np.ndarray:
    """``[T + 1]``: table ``t``'s ids are ``ids[spans[t]:spans[t + 1]]``."""
    if bags is None:
        return np.arange(num_tables + 1, dtype=np.int64) * (num_ids // num_tables)
    first_bag = np.concatenate([[0], np.cumsum(bags)]).astype(np.int64)
    return first_bag if offsets is None else offsets[first_bag]


def flat_batch(rows: np.ndarray, offsets: np.ndarray | None, bags: np.ndarray | None, base: np.ndarray) -> FlatBatch:
    """The TBE batch of a request whose ids are now table-local ``rows`` (-1: an id of a
    dynamic table not admitted, which the answer gives its table's default row)."""
    num_tables = len(base) - 1
    spans = table_spans(len(rows), offsets, bags, num_tables)
    flat = rows + np.repeat(base[:-1], np.diff(spans))
    keep = rows >= 0
    if bags is None:  # uniform: sample-major, TBE's [b, T*D]
        b = len(rows) // num_tables
        flat, keep = flat.reshape(num_tables, b).T.reshape(-1), keep.reshape(num_tables, b).T.reshape(-1)
    if keep.all():
        off = np.arange(len(flat) + 1, dtype=np.int64) if offsets is None else offsets
        return FlatBatch(torch.from_numpy(flat), torch.from_numpy(off))
    lengths = None if offsets is None else np.diff(offsets)  # only here: the common path needs none
    num_bags = len(flat) if lengths is None else len(lengths)
    bag_of_id = np.arange(num_bags) if lengths is None else np.repeat(np.arange(num_bags), lengths)
    kept = np.bincount(bag_of_id[keep], minlength=num_bags)
    off = np.zeros(num_bags + 1, dtype=np.int64)
    np.cumsum(kept, out=off[1:])
    all_ids = np.ones(num_bags, dtype=np.int64) if lengths is None else lengths
    bag_table = np.tile(np.arange(num_tables), len(rows) // num_tables) if bags is None else np.repeat(np.arange(num_tables), bags)
    return FlatBatch(torch.from_numpy(flat[keep]), torch.from_numpy(off), all_ids - kept, bag_table)
