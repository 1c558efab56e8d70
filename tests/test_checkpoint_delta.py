"""Incremental durable checkpoints: full + deltas of the rows pushed between cuts.

Real EmbeddingPS actors trained through the real push path, a real store on disk: a
chain replays to the state at its cut bit for bit, on any PS layout; a corrupt delta
costs only the deltas built on it; retention keeps what a kept delta needs; int8 loses at
most half a quantization step per value.
"""

from __future__ import annotations

import functools

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrover.checkpoint.chain import DurableChain, LinkWrite, load_latest_chain
from dlrover.checkpoint.incremental import pack_weights, unpack_weights
from dlrover.checkpoint.store import CheckpointStore
from dlrover.master.checkpoint import write_where_payloads_are
from dlrover.master.cluster import RayCluster
from dlrover.model.dlrm import PSClient, PSEmbeddingBagCollection, make_kjt, table_configs
from dlrover.ps.embedding_ps import EmbeddingPS
from dlrover.ps.vshard import VShardMap
from dlrover.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
SIZES = [3, 17, 100, 1000] + [300] * 22
DIM, V = 8, 16
MODEL = ModelSpec(embedding_dim=DIM, num_embeddings=SIZES, dense_arch=[DIM], over_arch=[1])
OPT = {"name": "rowwise_adagrad", "lr": 0.05}


class Job:
    """PS actors, a client pushing real gradients, and cuts as the Checkpointer takes them."""

    def __init__(self, ray, num_ps: int, store: CheckpointStore, full_every: int = 10, quantize: str = "none") -> None:
        self.ray, self.vmap = ray, VShardMap.round_robin(SIZES, V, num_ps)
        cls = ray.remote(EmbeddingPS)
        self.ps = [cls.remote(k, self.vmap, DIM, OPT, 0) for k in range(num_ps)]
        self.ebc = PSEmbeddingBagCollection(table_configs(MODEL), PSClient(self.ps, self.vmap, DIM, "w", get=ray.get))
        self.chain = DurableChain(store, full_every, quantize)
        self.rng, self.seq = np.random.default_rng(0), 0

    def train(self, steps: int) -> None:
        for _ in range(steps):  # Zipf-like ids: an interval touches some rows, not all
            sparse = (self.rng.zipf(1.3, size=(64, 26)) * 2654435761) % 2**32
            (self.ebc(make_kjt(sparse)).values() * torch.randn(64, 26 * DIM)).sum().backward()
            self.ray.get(self.ebc.take_push_refs())

    def cut(self) -> list[dict]:
        """Snapshot every PS (nothing in flight: the pushes above were waited for)."""
        self.seq += 1
        changed = self.ray.get([h.cut_changes.remote() for h in self.ps])
        snaps = [h.snapshot.options(num_returns=2).remote() for h in self.ps]  # as the master does
        self.chain.add_cut(self.seq, SIZES, changed)
        return [payload for _, payload in snaps]

    def durable(self, payloads: list) -> str:
        """Write the cut as the master does: each payload's file by a task where it is."""
        meta = {"seq": self.seq, "extra": {"vmap": {"table_sizes": SIZES, "num_vshards": V}}}
        return self.chain.write(self.chain.plan(self.seq), payloads, {"step": self.seq}, meta, parts=functools.partial(write_where_payloads_are, RayCluster()))[1]


def by_vshard(payloads: list[dict]) -> dict[tuple[int, int], list[np.ndarray]]:
    """(vshard, table) -> [weights, optimizer state] of that block, whatever the layout."""
    rpv = VShardMap(SIZES, V, np.zeros(V)).rows_per_vshard()
    out = {}
    for p in payloads:
        for i, v in enumerate(p["vshards"]):
            for t, states in enumerate(p["tables"]):
                out[int(v), t] = [np.asarray(a)[i * rpv[t] : (i + 1) * rpv[t]] for a in states]
    return out


def assert_bit_equal(got: list, want: list) -> None:
    """Payloads (dicts or their object refs) hold the same bits per vshard."""
    import ray

    g, w = (by_vshard([ray.get(p) if isinstance(p, ray.ObjectRef) else p for p in ps]) for ps in (got, want))
    assert g.keys() == w.keys()
    for key in w:
        for a, b in zip(g[key], w[key]):
            assert a.dtype == b.dtype == np.float32
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), key


@pytest.fixture(scope="module")
def chain_run(ray_local, tmp_path_factory):
    """full (cut 1), in-memory only (cut 2), delta (cut 3), delta (cut 4), then more
    training that no checkpoint holds."""
    root = tmp_path_factory.mktemp("delta") / "ckpt"
    job = Job(ray_local, 2, CheckpointStore(root, keep=10))
    job.train(3)
    cuts = {1: job.cut()}
    kinds = [job.durable(cuts[1])]
    for seq in (2, 3, 4):
        job.train(4)
        cuts[seq] = job.cut()
        if seq != 2:
            kinds.append(job.durable(cuts[seq]))
    job.train(2)
    return job, root, cuts, kinds


def test_delta_chain_restores_the_cut_bit_for_bit_on_any_layout(ray_local, chain_run):
    job, root, cuts, kinds = chain_run
    assert kinds == ["full", "delta", "delta"]
    store = CheckpointStore(root, keep=10)
    sizes = {s: sum(os.path.getsize(p) for p in Path(store.url(s)).iterdir()) for s in store.list()}
    for s in (3, 4):  # only the rows pushed since the previous durable cut
        rows = store.load(s)[0]["link"]["rows"]
        assert 0 < rows < sum(SIZES) / 2 and sizes[s] < sizes[1]
    chain, payloads = DurableChain(store).load()  # a fresh object, as after a master restart
    assert [link.step for link in chain.links] == [1, 3, 4] and chain.skipped == []
    assert_bit_equal(payloads, cuts[4])  # cut 2's rows are in delta 3 though cut 2 was not durable
    # Global row ids: the chain (written round-robin) restores under another map.
    other = VShardMap(SIZES, V, np.arange(V) // (V // 2), version=5)
    refs = [ray_local.put(p) for p in payloads]
    ray_local.get([h.restore.remote(other, refs) for h in job.ps])
    assert_bit_equal([p for _, p in ray_local.get([h.snapshot.remote() for h in job.ps])], cuts[4])


def test_corrupt_delta_falls_back_to_the_previous_chain(chain_run, tmp_path):
    _, root, cuts, _ = chain_run
    for bad, want_step in ((4, 3), (3, 1)):
        copy = tmp_path / f"bad{bad}"
        shutil.copytree(root, copy)
        path = copy / f"ckpt-{bad:08d}" / "emb_0.pt"  # ps-0's rows of the delta
        data = bytearray(path.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 8] = bytes(8)
        path.write_bytes(bytes(data))
        chain, payloads = DurableChain(CheckpointStore(copy, keep=10)).load()
        assert chain.step == want_step
        assert_bit_equal(payloads, cuts[want_step])
        assert f"ckpt-{bad:08d}/emb_0.pt: checksum mismatch" in chain.skipped[-1]
        if bad == 3:  # delta 4 is unusable too: it builds on 3
            assert chain.skipped[0] == f"{copy}/ckpt-00000004: depends on {copy}/ckpt-00000003/emb_0.pt: checksum mismatch (corrupt checkpoint)"


def test_restore_or_migration_forces_the_next_durable_checkpoint_full(ray_local, tmp_path):
    job = Job(ray_local, 2, CheckpointStore(tmp_path / "ckpt", keep=10))
    job.train(2)
    first = job.cut()
    assert job.durable(first) == "full"
    job.train(2)
    assert job.durable(job.cut()) == "delta"
    # A rollback rebuilds the tables: what changed since the last durable cut is unknown.
    ray_local.get([h.restore.remote(job.vmap, first) for h in job.ps])
    job.train(2)
    assert job.durable(job.cut()) == "full"
    job.train(2)
    assert job.durable(job.cut()) == "delta"
    # A migration: vshard 0 moves from ps-0 to ps-1.
    new = VShardMap(SIZES, V, np.where(np.arange(V) == 0, 1, job.vmap.owner), version=1)
    moved = ray_local.get(job.ps[0].export_vshards.remote([0]))
    ray_local.get([job.ps[0].reconfigure.remote(new, []), job.ps[1].reconfigure.remote(new, [moved])])
    job.ebc.client.set_routing(dict(enumerate(job.ps)), new)
    job.vmap = new
    job.train(1)
    assert job.durable(job.cut()) == "full"
    # full_every: the chain is cut after that many links.
    short = Job(ray_local, 1, CheckpointStore(tmp_path / "short", keep=10), full_every=2)
    kinds = []
    for _ in range(5):
        short.train(1)
        kinds.append(short.durable(short.cut()))
    assert kinds == ["full", "delta", "full", "delta", "full"]


def test_payloads_in_memory_and_from_disk_are_written_each_to_its_own_file_in_order(ray_local, tmp_path):
    """Refs of two PS on one node (one task writes both) and a payload already loaded
    from disk (another task) end up as ps_0..ps_2 in payload order, the same payload
    by value and by ref as the same bytes."""
    job = Job(ray_local, 2, CheckpointStore(tmp_path / "ckpt", keep=10))
    job.train(2)
    refs = job.cut()
    mixed = [refs[0], ray_local.get(refs[1]), refs[1]]
    link = LinkWrite(CheckpointStore(tmp_path / "out"), 1, "none", V, job.vmap.rows_per_vshard(), None)
    link.store.begin(1, {})
    written = write_where_payloads_are(RayCluster(), link, mixed)
    assert [key for key, _ in written] == ["ps_0", "ps_1", "ps_2"]
    files = {key: torch.load(tmp_path / "out" / "ckpt-00000001" / f"{key}.pt", weights_only=True) for key, _ in written}
    assert [np.asarray(f["vshards"]).tolist() for f in files.values()] == [np.asarray(ray_local.get(p)["vshards"]).tolist() for p in (refs[0], refs[1], refs[1])]
    assert written[1][1].sha256 == written[2][1].sha256  # the same payload, by value and by ref


def test_retention_keeps_the_full_checkpoint_a_kept_delta_needs(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    parents = {1: None, 2: 1, 3: 2, 4: None, 5: 4, 6: 5, 7: 6}
    expect = {1: [1], 2: [1, 2], 3: [1, 2, 3], 4: [1, 2, 3, 4], 5: [4, 5], 6: [4, 5, 6], 7: [4, 5, 6, 7]}
    for step, parent in parents.items():
        store.save(step, {"x": torch.full((4,), float(step))}, {"n": step}, parent=parent)
        assert store.list() == expect[step], step
        for kept in store.list():
            assert store.chain(kept)[0] in (1, 4)  # every kept delta reaches its full one
    chain = load_latest_chain(store)
    assert [link.step for link in chain.links] == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="parent 3 is not an older complete checkpoint"):
        store.save(8, {}, {}, parent=3)


@pytest.mark.parametrize("scale", [1e-4, 0.05, 3.0])
def test_int8_round_trip_error_is_bounded_per_row(scale):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((500, 64)) * scale * rng.uniform(0.01, 10, (500, 1))).astype(np.float32)
    w[0] = 0.25  # a constant row comes back exactly
    packed = pack_weights(w, "int8")
    assert packed["int8"].dtype == np.int8 and packed["scale"].shape == (500,)
    err = np.abs(unpack_weights(packed) - w).max(axis=1)
    step = (w.max(axis=1).astype(np.float64) - w.min(axis=1)) / 255
    assert np.all(err <= step / 2 + 4 * np.finfo(np.float32).eps * np.abs(w).max(axis=1)), (err / step).max()
    assert err[0] == 0
    half = unpack_weights(pack_weights(w, "fp16"))
    assert np.all(np.abs(half - w) <= np.abs(w) * 2**-11 + 2**-24)
    assert unpack_weights(pack_weights(w, "none")) is w


def test_bad_quantize_is_one_line_naming_the_field(synth_dir, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"data: {{paths: ['{synth_dir}/*.tsv'], shard_rows: 4096}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        "checkpoint: {quantize: int4, full_every: 3}\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    cmd = [sys.executable, "-m", "dlrover", "run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: ") and "checkpoint.quantize" in lines[0] and "int8" in lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
