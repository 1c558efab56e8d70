"""Split a KeyedJaggedTensor into one jagged lookup request per PS, and put the answers back.

This is TorchRec row-wise sharding done over Ray calls instead of collectives. Sum pooling
is linear, so each PS pools the ids it owns and returns partial sums only for the bags
that have at least one id on it; the worker adds the partial sums of all PS into the full
pooled output. A PS request holds those bags only, however unequal their numbers in the
tables (``dlrover.ps.layout``), so the bytes a step moves stay about ``B x T x D`` and the
PS's work about its share of the ids, however many PS there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dlrover.ps.vshard import VShardMap


@dataclass
class PSRequest:
    """One PS's share of a batch. ``indices``/``offsets`` go to the PS (TBE layout, table
    major); ``dest`` stays on the worker and says where each returned row goes."""

    ps: int
    indices: Any  # int64 local row ids (or an ObjectRef to them, see PSClient.route)
    offsets: Any  # int64 [num_bags + 1]; None when every bag holds exactly one id
    batch: int  # bags per table when uniform (``bags`` None), else 0
    bags: np.ndarray | None = None  # bags per table (None: ``batch`` in every table)
    # Bag (``sample * T + table``, a row of the pooled output viewed as [B*T, D]) of each
    # row of the PS's answer, in the order the answer holds them: ``gather`` is built from
    # it (multi-hot: one index_add_), and one index_select takes its gradient back out.
    dest: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    covers_all: bool = False  # every bag, in table-major order (one PS, single-hot): no scatter needed


@dataclass
class RoutedBatch:
    num_samples: int
    num_tables: int
    requests: list[PSRequest]
    version: int = 0  # of the VShardMap it was routed with: stale after a migration
    # Single-hot (every bag on exactly one PS): the row of the answers, concatenated in
    # request order, that each bag of the pooled output takes (one gather, no scatter).
    # None for multi-hot: a bag's partial sums from several PS are added up.
    gather: torch.Tensor | None = None


def route(values: torch.Tensor, lengths: torch.Tensor, batch: int, vmap: VShardMap, feature_tables: list[int] | None = None) -> RoutedBatch:
    """Route a key-major jagged batch (``values`` already row ids, ``lengths`` [F*B]).
    ``feature_tables``: each feature's table, features of a table next to each other
    (None: feature i looks up table i)."""
    num_tables = lengths.numel() // batch  # features: bags per sample in the pooled output
    ft = np.arange(num_tables) if feature_tables is None else np.asarray(feature_tables, dtype=np.int64)
    shared = len(ft) != len(vmap.table_sizes)  # some table serves several features
    lens = lengths.numpy()
    single_hot = bool(lens.size) and int(lens.min()) == 1 and int(lens.max()) == 1
    bag_of_value = np.arange(num_tables * batch) if single_hot else np.repeat(np.arange(num_tables * batch), lens)
    owner, local = vmap.route(values.numpy(), ft[bag_of_value // batch])
    if single_hot and vmap.num_ps == 1 and not shared:
        # The common Criteo case on one PS: the request is the whole batch as it is.
        req = PSRequest(vmap.ps_ids[0], local, None, batch, covers_all=True)
        return RoutedBatch(batch, num_tables, [req], vmap.version)
    requests = []
    for k in vmap.ps_ids:
        picked = np.flatnonzero(owner == k)  # ascending: the PS's ids stay table-major
        if picked.size == 0:
            continue
        if single_hot:  # one id per bag: the bag is the value's position
            ubags, counts = picked, None
        else:
            bags_k = bag_of_value[picked]
            first = np.flatnonzero(np.diff(bags_k, prepend=-1))
            ubags, counts = bags_k[first], np.diff(first, append=len(bags_k))
        bag_t = ubags // batch
        dest = (ubags - bag_t * batch) * num_tables + bag_t
        per_table = np.bincount(ft[bag_t], minlength=len(vmap.table_sizes))
        b_k = int(per_table.max())
        if single_hot and not shared and b_k * num_tables == len(ubags):  # uniform: no offsets, no bag counts
            # The answer is TBE's [b_k, T*D]: its row i holds the i-th bag of every table.
            dest = dest.reshape(num_tables, b_k).T.reshape(-1)
            requests.append(PSRequest(k, local[picked], None, b_k, None, torch.from_numpy(dest)))
            continue
        offsets = None
        if counts is not None:
            offsets = np.zeros(len(ubags) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
        requests.append(PSRequest(k, local[picked], offsets, 0, per_table, torch.from_numpy(dest)))
    gather = None
    if single_hot:
        gather = torch.empty(num_tables * batch, dtype=torch.int64)
        gather[torch.cat([r.dest for r in requests])] = torch.arange(num_tables * batch)
    return RoutedBatch(batch, num_tables, requests, vmap.version, gather)


def assemble(routed: RoutedBatch, partials: list[np.ndarray], dim: int) -> torch.Tensor:
    """Put each PS's partial sums into the pooled output [B, T*D] (added up where a bag's
    ids are on several PS)."""
    n, t = routed.num_samples, routed.num_tables
    if len(routed.requests) == 1 and routed.requests[0].covers_all:
        return torch.as_tensor(partials[0])  # already [B, T*D]: no copy at all
    rows = [torch.as_tensor(part).view(-1, dim) for part in partials]
    if routed.gather is not None:
        return torch.cat(rows).index_select(0, routed.gather).view(n, t * dim)
    pooled = torch.zeros(n * t, dim)
    for req, part in zip(routed.requests, rows):
        pooled.index_add_(0, req.dest, part)
    return pooled.view(n, t * dim)


def split_grad(routed: RoutedBatch, grad: torch.Tensor, dim: int) -> list[np.ndarray]:
    """The pooled-output gradient each PS needs, in the layout it answered in."""
    n, t = routed.num_samples, routed.num_tables
    if len(routed.requests) == 1 and routed.requests[0].covers_all:
        return [grad.contiguous().numpy()]
    g = grad.reshape(n * t, dim)
    out = []
    for req in routed.requests:
        rows = g.index_select(0, req.dest)
        if req.bags is None:
            rows = rows.view(req.batch, t * dim)
        out.append(rows.numpy())
    return out
