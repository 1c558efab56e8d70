"""The real ``torchrec.models.dlrm.DLRM``, with its embedding collection served by PS actors.

``PSEmbeddingBagCollection`` is a drop-in for TorchRec's ``EmbeddingBagCollection``: it
takes a ``KeyedJaggedTensor`` and returns a ``KeyedTensor`` of pooled embeddings. The
pooled values come from the PS actors (``PSClient``), and an autograd function hands the
pooled-output gradient back during ``loss.backward()``. ``prefetch(kjt)`` starts the pulls
early so that the lookups of step i+1 overlap the compute of step i; it also sends the
last backward's pushes, each in one call with the pull to the same PS (applied first), so
a step costs one call per PS rather than two. ``take_push_refs`` sends what is left.

TorchRec is imported where it is used, not with this module: the master imports the
worker's actor class (and so this module) but never builds a model, and importing
TorchRec costs 5-6 s of CPU per process.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import nn

from dlrover.ps.applied import BatchId
from dlrover.ps.routing import RoutedBatch, assemble, route, split_grad
from dlrover.ps.shm import LocalLinks, ShmSlice
from dlrover.ps.vshard import VShardMap
from dlrover.data.batch import Batch
from dlrover.data.schema import CRITEO, Schema
from dlrover.spec import ModelSpec
from dlrover.table_spec import Pooling

if TYPE_CHECKING:
    from torchrec.models.dlrm import DLRM, DenseArch, OverArch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

# TorchRec's DLRM asks torch.fx whether it is being traced; torch warns about that call
# once per process, in every worker's log. Not ours to fix, and not news to the user.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def table_configs(model: ModelSpec, schema: Schema | None = None) -> list[EmbeddingBagConfig]:
    """One config per table of the schema (Criteo's by default), its features named."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    schema = schema or model.schema()
    pooling = {Pooling.SUM: PoolingType.SUM, Pooling.MEAN: PoolingType.MEAN}
    return [
        EmbeddingBagConfig(
            name=f"t_{t.name}", embedding_dim=model.embedding_dim, num_embeddings=t.rows, feature_names=list(t.features), pooling=pooling[t.spec.pooling]
        )
        for t in schema.tables
    ]


def build_dense_dlrm(model: ModelSpec, ebc: nn.Module, seed: int, schema: Schema | None = None) -> DLRM:
    """TorchRec's ``DLRM`` (``model.arch: dlrm``) or ``DLRM_DCN`` (``dcn``) with
    deterministic dense init (same seed -> same MLP weights everywhere)."""
    from torchrec.models.dlrm import DLRM, DLRM_DCN

    torch.manual_seed(seed)
    shape = dict(
        embedding_bag_collection=ebc,
        dense_in_features=(schema or model.schema()).dense_width,
        dense_arch_layer_sizes=list(model.dense_arch),
        over_arch_layer_sizes=list(model.over_arch),
    )
    if model.arch == "dcn":
        return DLRM_DCN(**shape, dcn_num_layers=model.dcn.num_layers, dcn_low_rank_dim=model.dcn.low_rank_dim)
    return DLRM(**shape)


def dense_parameters(dlrm: DLRM) -> list[nn.Parameter]:
    """The MLP parameters (everything but the embedding collection), in a fixed order."""
    return [p for n, p in dlrm.named_parameters() if not n.startswith("sparse_arch.")]


def dense_arches(model: ModelSpec, seed: int, schema: Schema | None = None) -> tuple[DenseArch, nn.Module, OverArch]:
    """The dense part of ``build_dense_dlrm(model, ebc, seed, schema)`` as it initialises
    it, without a DLRM or an embedding collection: (bottom MLP, interaction, top MLP), in
    :func:`dense_parameters` order. Bit-identical because the DLRM draws its initial
    values only in these modules, built here in its order from the same seed (DLRM_DCN
    first builds DLRM's top MLP, then replaces it: drawn here too); the caller's random
    state is left as it was."""
    from torchrec.models.dlrm import DenseArch, InteractionArch, InteractionDCNArch, OverArch, choose
    from torchrec.modules.crossnet import LowRankCrossNet

    schema = schema or model.schema()
    features, d = len(schema.sparse), model.embedding_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dense = DenseArch(in_features=schema.dense_width, layer_sizes=list(model.dense_arch))
        over = OverArch(in_features=d + choose(features, 2) + features, layer_sizes=list(model.over_arch))
        if model.arch != "dcn":
            return dense, InteractionArch(num_sparse_features=features), over
        cross = LowRankCrossNet(in_features=(features + 1) * d, num_layers=model.dcn.num_layers, low_rank=model.dcn.low_rank_dim)
        over = OverArch(in_features=(features + 1) * d, layer_sizes=list(model.over_arch))
        return dense, InteractionDCNArch(num_sparse_features=features, crossnet=cross), over


def initial_dense_vector(model: ModelSpec, seed: int, schema: Schema | None = None) -> torch.Tensor:
    """The flat initial MLP parameters, in :func:`dense_parameters` order."""
    params = [p for arch in dense_arches(model, seed, schema) for p in arch.parameters()]
    return torch.nn.utils.parameters_to_vector(params).detach()


def initial_dense_array(model: ModelSpec, seed: int, schema: Schema | None = None) -> np.ndarray:
    """:func:`initial_dense_vector` as an array (what the dense PS starts from)."""
    return initial_dense_vector(model, seed, schema).numpy()


def make_kjt(sparse: np.ndarray | Batch, keys: list[str] | None = None) -> KeyedJaggedTensor:
    """A batch's ids (or ``[N, T]`` ids, one per feature) -> a key-major KJT. ``keys``:
    the schema's feature names (default Criteo's)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    batch = sparse if isinstance(sparse, Batch) else Batch(np.zeros(len(sparse), np.float32), np.zeros((len(sparse), 0), np.float32), sparse)
    values, lengths = batch.jagged()
    keys = keys or CRITEO.feature_names[: batch.num_features]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(values), lengths=torch.from_numpy(lengths.reshape(-1)))


@dataclass
class Lookup:
    """An in-flight pull: the routed batch and one ObjectRef per PS."""

    key: tuple
    routed: RoutedBatch
    refs: list[Any]
    train: bool
    batch: BatchId | None = None  # the pushes carry it: each PS applies a batch at most once
    pooled: torch.Tensor | None = None
    slots: dict[int, int] = field(default_factory=dict)  # PS id -> shared-memory slot of its answer
    issued: float = 0.0  # time.monotonic() when the pulls went out


@dataclass
class HeldPush:
    """A batch's pushes not all sent yet. Each goes out with the next pull to the same PS
    when there is one (``PSClient.start``: one call per PS a step, not two), the rest with
    ``PSClient.send``."""

    lookup: Lookup
    args: dict[int, tuple] = field(default_factory=dict)  # PS id -> the push's arguments, until sent
    refs: dict[int, Any] = field(default_factory=dict)  # PS id -> the push's ObjectRef, once sent


@dataclass
class PSClient:
    """Talks to the PS actors for one worker. ``ps``: Ray actor handles by PS id (a list
    means ids 0..n-1). ``set_routing`` swaps both at once after a PS migration."""

    ps: dict[int, Any] | list[Any]
    vmap: VShardMap
    dim: int
    owner_name: str
    get: Callable[[list[Any]], list[Any]]
    links: LocalLinks | None = None  # shared memory with the PS on this node (``set_routing``)
    latency_s: dict[int, float] = field(default_factory=dict)  # PS id -> injected link latency (chaos)
    feature_tables: list[int] | None = None  # the table of each feature (None: feature i is table i)
    _seq: Any = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if not isinstance(self.ps, dict):
            self.ps = dict(enumerate(self.ps))
        ft = torch.tensor(self.feature_tables if self.feature_tables is not None else range(len(self.vmap.table_sizes)), dtype=torch.int64)
        self._table_sizes = torch.tensor(self.vmap.table_sizes, dtype=torch.int64)[ft]  # per feature
        self._raw = torch.tensor([t in self.vmap.dynamic for t in ft.tolist()], dtype=torch.bool)  # dynamic: ids stay raw
        self.timings = {"route_s": 0.0, "issue_pull_s": 0.0, "wait_pull_s": 0.0, "push_s": 0.0}

    def route(self, kjt: KeyedJaggedTensor, put: Callable[[Any], Any] | None = None) -> RoutedBatch:
        """Split a batch by owning PS. Workers run this on their input thread, with
        ``put=ray.put`` so the id arrays for PS on other nodes are already in the object
        store when the pull is issued: the training thread then only sends references."""
        t0 = time.perf_counter()
        batch = kjt.stride()
        lengths = kjt.lengths().to(torch.int64)
        per_table = lengths.view(-1, batch).sum(1)
        values = kjt.values().to(torch.int64)
        rows = torch.remainder(values, torch.repeat_interleave(self._table_sizes, per_table))
        if self.vmap.dynamic:
            rows = torch.where(torch.repeat_interleave(self._raw, per_table), values, rows)
        routed = route(rows, lengths, batch, self.vmap, self.feature_tables)
        if put is not None:
            links = self.links  # set_routing may replace it meanwhile: read it once
            for r in routed.requests:
                if links is None or not links.takes_ids(r.ps, r.indices, r.offsets):
                    r.indices = put(r.indices)
                    r.offsets = None if r.offsets is None else put(r.offsets)
        self.timings["route_s"] += time.perf_counter() - t0
        return routed

    def set_routing(self, ps: dict[int, Any], vmap: VShardMap, links: LocalLinks | None = None) -> None:
        """Switch to a new vshard map and PS set (only between steps, with no lookup in
        flight), and to ``links`` with those of them on this node."""
        if self.links is not None:
            for k, segment in self.links.close().items():
                if k in self.ps:
                    self.ps[k].release.remote(segment)
        self.ps, self.vmap, self.links = dict(ps), vmap, links

    def start(
        self, kjt: KeyedJaggedTensor, train: bool = True, routed: RoutedBatch | None = None, batch: BatchId | None = None, carry: HeldPush | None = None
    ) -> Lookup:
        """Issue the pulls of one batch to its PS without waiting for them. A batch routed
        under an older vshard map (before a migration) is routed again. ``carry``: a
        batch's pushes not sent yet; each PS this batch pulls from gets its push in the
        same call, applied before the pull (``EmbeddingPS.push_pull``; its time counts as
        issuing the pull in ``timings``)."""
        if routed is None or routed.version != self.vmap.version:
            routed = self.route(kjt)
        t0 = time.perf_counter()
        key = (self.owner_name, next(self._seq))
        lookup = Lookup(key, routed, [], train, batch, issued=time.monotonic())
        for r in routed.requests:
            ring = self.links.ring(r.ps) if self.links is not None else None
            args: tuple = (key, r.indices, r.offsets, train, None, r.bags)
            if ring is not None:
                slot = lookup.slots[r.ps] = ring.take()
                in_slot = ring.write_ids(slot, r.indices, r.offsets) if isinstance(r.indices, np.ndarray) else None  # else put by route
                indices, offsets = in_slot or (r.indices, r.offsets)
                args = (key, indices, offsets, train, ring.answer_room(slot), r.bags)
            push = carry.args.pop(r.ps, None) if carry is not None else None
            if push is None:
                lookup.refs.append(self.ps[r.ps].pull.remote(*args))
            else:
                carry.refs[r.ps], pulled = self.ps[r.ps].push_pull.remote(push, *args)
                lookup.refs.append(pulled)
                self._reads(carry.lookup, r.ps, carry.refs[r.ps])
            if ring is not None:
                ring.reads(slot, lookup.refs[-1])
        self.timings["issue_pull_s"] += time.perf_counter() - t0
        return lookup

    def wait(self, lookup: Lookup) -> torch.Tensor:
        if lookup.pooled is None:
            t0 = time.perf_counter()
            late = max((self.latency_s.get(r.ps, 0.0) for r in lookup.routed.requests), default=0.0)
            if late > 0:  # a slow link: the answers arrive ``late`` after the pulls went out
                time.sleep(max(0.0, lookup.issued + late - time.monotonic()))
            parts = self.get(lookup.refs)
            for i, r in enumerate(lookup.routed.requests):
                if isinstance(parts[i], ShmSlice):  # the answer is in our slot: no copy
                    parts[i] = self.links.rings[r.ps].read(parts[i])
            lookup.pooled = assemble(lookup.routed, parts, self.dim)
            self.timings["wait_pull_s"] += time.perf_counter() - t0
        return lookup.pooled

    def hold(self, lookup: Lookup, grad: torch.Tensor) -> HeldPush:
        """Lay out a pulled batch's gradient for its PS (in shared memory where it goes
        through a slot) without sending it: ``start(carry=...)`` or ``send`` sends it."""
        t0 = time.perf_counter()
        held = HeldPush(lookup)
        for r, g in zip(lookup.routed.requests, split_grad(lookup.routed, grad, self.dim)):
            slot = lookup.slots.get(r.ps)
            ring = self.links.rings.get(r.ps) if self.links is not None and slot is not None else None
            room = ring.write(slot, g) if ring is not None else None
            held.args[r.ps] = (lookup.key, g if room is None else room, lookup.batch)
        self.timings["push_s"] += time.perf_counter() - t0
        return held

    def send(self, held: HeldPush) -> list[Any]:
        """Send the pushes ``start`` did not carry; every push's ObjectRef, in PS order."""
        t0 = time.perf_counter()
        for k, args in held.args.items():
            held.refs[k] = self.ps[k].push.remote(*args)
            self._reads(held.lookup, k, held.refs[k])
        held.args = {}
        self.timings["push_s"] += time.perf_counter() - t0
        return [held.refs[r.ps] for r in held.lookup.routed.requests]

    def _reads(self, lookup: Lookup, k: int, ref: Any) -> None:
        """``ref`` reads ``lookup``'s gradient from its slot with PS ``k``, if it has one."""
        if self.links is not None and k in lookup.slots and k in self.links.rings:
            self.links.rings[k].reads(lookup.slots[k], ref)


class _PooledFromPS(torch.autograd.Function):
    """Identity on the pooled tensor whose backward hands the gradient to the PS client."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, pooled: torch.Tensor, sink: Callable[[torch.Tensor], None]) -> torch.Tensor:
        ctx.sink = sink
        return pooled.view_as(pooled)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.sink(grad.detach())
        return None, None, None


class PSEmbeddingBagCollection(nn.Module):
    """``EmbeddingBagCollection`` look-alike whose tables live on PS actors."""

    def __init__(self, tables: list[EmbeddingBagConfig], client: PSClient | None = None) -> None:
        from torchrec.modules.embedding_configs import PoolingType

        super().__init__()
        self._configs = tables
        self._keys = [f for c in tables for f in c.feature_names]
        self._mean = [i for i, (c, _) in enumerate((c, f) for c in tables for f in c.feature_names) if c.pooling == PoolingType.MEAN]
        self.client = client
        # id(kjt) -> (kjt, lookup); holding the kjt keeps its id from being reused.
        self._prefetched: dict[int, tuple[KeyedJaggedTensor, Lookup]] = {}
        self.push_refs: list[Any] = []  # pushes sent, until taken
        self._held: HeldPush | None = None  # the last backward's pushes: the next prefetch carries them
        # A parameter-less module has nothing to hang the autograd node on; this anchor
        # (requires_grad, never updated) makes backward always reach _PooledFromPS.
        # A buffer, so that ``.to(device)`` moves it: its device is where the pooled
        # values go (a GPU worker's).
        self.register_buffer("_anchor", torch.zeros(1, requires_grad=True), persistent=False)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def prefetch(self, kjt: KeyedJaggedTensor, routed: RoutedBatch | None = None, batch: BatchId | None = None) -> None:
        """Start the lookups of ``kjt`` now; ``forward(kjt)`` later collects them (and its
        pushes carry ``batch``). The pushes of the last backward go in the same calls."""
        self._prefetched[id(kjt)] = (kjt, self.client.start(kjt, train=self.training, routed=routed, batch=batch, carry=self._held))

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        from torchrec.sparse.jagged_tensor import KeyedTensor

        hit = self._prefetched.pop(id(features), None)
        lookup = hit[1] if hit is not None else self.client.start(features, train=self.training)
        # The PS answer on the host; the model's device (a GPU worker's) gets it once.
        pooled = self.client.wait(lookup).to(self._anchor.device, non_blocking=True)
        if self.training:
            pooled = _PooledFromPS.apply(self._anchor, pooled, lambda g: self._hold(lookup, g.cpu()))
        if self._mean:  # the PS sums; a mean bag is its sum over its length (after the gradient hook: scaled too)
            pooled = pooled / self._mean_divisor(features).to(pooled.device)
        d = self._configs[0].embedding_dim
        return KeyedTensor(keys=self._keys, length_per_key=[d] * len(self._keys), values=pooled, key_dim=1)

    def _mean_divisor(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B, F*D]: the bag's length (1 for an empty bag) for mean features, 1 elsewhere.
        A division, as TorchRec's mean pooling: the same floats bit for bit."""
        f, d = len(self._keys), self._configs[0].embedding_dim
        lengths = features.lengths().view(f, -1).T.to(torch.float32)
        divisor = torch.ones_like(lengths)
        divisor[:, self._mean] = lengths[:, self._mean].clamp(min=1.0)
        return divisor.repeat_interleave(d, dim=1)

    def _hold(self, lookup: Lookup, grad: torch.Tensor) -> None:
        """Backward's gradient: held for the next prefetch to carry (an earlier batch's
        pushes still held go first: each PS applies a worker's pushes in batch order)."""
        self._send_held()
        self._held = self.client.hold(lookup, grad)

    def _send_held(self) -> None:
        if self._held is not None:
            self.push_refs.extend(self.client.send(self._held))
            self._held = None

    def reset(self) -> None:
        """Forget lookups and pushes of an aborted run."""
        self._prefetched.clear()
        self.push_refs, self._held = [], None

    def take_push_refs(self) -> list[Any]:
        """Send the pushes still held; the ObjectRefs of every push since the last take."""
        self._send_held()
        refs, self.push_refs = self.push_refs, []
        return refs
