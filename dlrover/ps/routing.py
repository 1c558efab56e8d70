"""Split a KeyedJaggedTensor into one jagged lookup request per PS, and put the answers back.

This is TorchRec row-wise sharding done over Ray calls instead of collectives. Sum pooling
is linear, so each PS pools the ids it owns and returns partial sums only for the bags
that have at least one id on it; the worker adds the partial sums of all PS into the full
pooled output. Each PS request is a small TBE batch of ``B_k`` bags per table, where
``B_k`` is the largest number of non-empty bags any table has on that PS, so the bytes a
step moves stay about ``B x T x D`` however many PS there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dlrover.ps.vshard import VShardMap


@dataclass
class PSRequest:
    """One PS's share of a batch. ``indices``/``offsets`` go to the PS (TBE layout, table
    major); ``bag_n``/``bag_t`` stay on the worker and say where each returned row goes."""

    ps: int
    indices: Any  # int64 local row ids (or an ObjectRef to them, see PSClient.route)
    offsets: Any  # int64 [T * batch + 1]; None when every bag holds exactly one id
    batch: int
    bag_n: torch.Tensor  # sample of each non-empty bag, in the order the PS returns them
    bag_t: torch.Tensor  # table of each non-empty bag
    covers_all: bool = False  # every bag, in table-major order (one PS, single-hot): no scatter needed


@dataclass
class RoutedBatch:
    num_samples: int
    num_tables: int
    requests: list[PSRequest]
    version: int = 0  # of the VShardMap it was routed with: stale after a migration


def route(values: torch.Tensor, lengths: torch.Tensor, batch: int, vmap: VShardMap) -> RoutedBatch:
    """Route a key-major jagged batch (``values`` already row ids, ``lengths`` [T*B])."""
    num_tables = lengths.numel() // batch
    single_hot = bool(lengths.numel()) and int(lengths.min()) == 1 and int(lengths.max()) == 1
    bag_of_value = torch.arange(num_tables * batch) if single_hot else torch.repeat_interleave(torch.arange(num_tables * batch), lengths)
    owner, local = vmap.route(values, torch.div(bag_of_value, batch, rounding_mode="floor"))
    if single_hot and vmap.num_ps == 1:
        # The common Criteo case on one PS: the request is the whole batch as it is.
        bag_t = torch.div(bag_of_value, batch, rounding_mode="floor")
        req = PSRequest(vmap.ps_ids[0], local.numpy(), None, batch, bag_of_value - bag_t * batch, bag_t, covers_all=True)
        return RoutedBatch(batch, num_tables, [req], vmap.version)
    requests = []
    for k in vmap.ps_ids:
        sel = owner == k
        vals_k = local[sel]
        bags_k = bag_of_value[sel]
        if vals_k.numel() == 0:
            continue
        if single_hot:  # one id per bag: every selected bag is distinct already
            ubags, counts = bags_k, torch.ones_like(bags_k)
        else:
            ubags, counts = torch.unique_consecutive(bags_k, return_counts=True)
        bag_t = torch.div(ubags, batch, rounding_mode="floor")
        bag_n = ubags - bag_t * batch
        per_table = torch.bincount(bag_t, minlength=num_tables)
        b_k = int(per_table.max())
        table_start = torch.cumsum(per_table, 0) - per_table
        j = torch.arange(len(ubags)) - table_start[bag_t]
        lens = torch.zeros(num_tables, b_k, dtype=torch.int64)
        lens[bag_t, j] = counts
        if single_hot and b_k * num_tables == len(ubags):  # every padded bag is used: no offsets
            requests.append(PSRequest(k, vals_k.numpy(), None, b_k, bag_n, bag_t))
            continue
        offsets = torch.zeros(num_tables * b_k + 1, dtype=torch.int64)
        torch.cumsum(lens.view(-1), 0, out=offsets[1:])
        requests.append(PSRequest(k, vals_k.numpy(), offsets.numpy(), b_k, bag_n, bag_t))
    return RoutedBatch(batch, num_tables, requests, vmap.version)


def _table_major(part: torch.Tensor, req: PSRequest, num_tables: int, dim: int) -> torch.Tensor:
    """Rows of a PS answer in table-major bag order, whatever layout it came in."""
    if req.offsets is None:  # TBE layout [batch, T*D], every bag non-empty
        return part.view(req.batch, num_tables, dim).transpose(0, 1).reshape(-1, dim)
    return part


def assemble(routed: RoutedBatch, partials: list[np.ndarray], dim: int) -> torch.Tensor:
    """Add each PS's partial sums into the pooled output [B, T*D]."""
    n, t = routed.num_samples, routed.num_tables
    if len(routed.requests) == 1 and routed.requests[0].covers_all:
        return torch.as_tensor(partials[0])  # already [B, T*D]: no copy at all
    pooled = torch.zeros(n, t, dim)
    for req, part in zip(routed.requests, partials):
        rows = _table_major(torch.as_tensor(part), req, t, dim)
        pooled.index_put_((req.bag_n, req.bag_t), rows, accumulate=True)
    return pooled.view(n, t * dim)


def split_grad(routed: RoutedBatch, grad: torch.Tensor, dim: int) -> list[np.ndarray]:
    """The pooled-output gradient each PS needs, in the layout it answered in."""
    n, t = routed.num_samples, routed.num_tables
    if len(routed.requests) == 1 and routed.requests[0].covers_all:
        return [grad.contiguous().numpy()]
    g = grad.reshape(n, t, dim)
    out = []
    for req in routed.requests:
        rows = g[req.bag_n, req.bag_t]
        if req.offsets is None:
            rows = rows.view(t, req.batch, dim).transpose(0, 1).reshape(req.batch, t * dim)
        out.append(rows.contiguous().numpy())
    return out


def nonempty_bags(offsets: torch.Tensor) -> torch.Tensor:
    """Positions (table-major) of the bags with at least one id: what a PS returns."""
    return torch.nonzero(offsets[1:] > offsets[:-1]).view(-1)
