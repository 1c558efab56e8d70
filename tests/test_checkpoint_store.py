"""CheckpointStore: round trips, retention, and detection of every kind of corruption."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import uuid

import numpy as np
import pytest
import torch

from dlrover.checkpoint.store import CheckpointError, CheckpointInfo, CheckpointStore
from dlrover.errors import DLRoverError


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "w": torch.randn(4, 3, generator=g),
            "ids": torch.arange(5, dtype=torch.int64) + seed,
            "layers": [torch.ones(2), {"b": torch.zeros(3, dtype=torch.int64)}],
        },
        "np": {
            "f32": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3) + seed,
            "i64": np.arange(7, dtype=np.int64) * (seed + 1),
            "mask": np.array([True, False, True]),
            "scalar": np.float64(2.5),
        },
        "pair": (1, "two"),
        "steps": [1, 2, 3],
        "count": 42 + seed,
        "lr": 0.125,
        "name": "dlrm",
        "none": None,
    }


def _assert_same(a, b, where="") -> None:
    """Equal in type, dtype and value, recursively (tuples stay tuples)."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _ckpt(root, step: int) -> str:
    return os.path.join(str(root), f"ckpt-{step:08d}")


def _rewrite_manifest(root, step: int, edit) -> None:
    path = os.path.join(_ckpt(root, step), "manifest.json")
    with open(path) as f:
        m = json.load(f)
    edit(m)
    with open(path, "w") as f:
        json.dump(m, f)


def _save_steps(store: CheckpointStore, steps) -> None:
    for s in steps:
        store.save(s, {"state": _state(s)}, {"step": s})


def test_round_trip_local_dir(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    state, opt = _state(), {"lr": np.array([0.1, 0.2], dtype=np.float32)}
    meta = {"epoch": 3, "shards": ["a", "b"], "loss": 0.5, "nested": {"k": None}}
    info = store.save(7, {"state": state, "opt": opt}, meta)
    assert isinstance(info, CheckpointInfo)
    assert info.step == 7 and info.nbytes > 0 and info.write_s >= 0 and info.meta == meta
    assert info.path == str(tmp_path / "ckpt" / "ckpt-00000007")
    written = sum(f.stat().st_size for f in (tmp_path / "ckpt" / "ckpt-00000007").iterdir())
    assert info.nbytes == written
    assert sorted(os.listdir(info.path)) == ["manifest.json", "opt.pt", "state.pt"]
    assert store.list() == [7] and store.latest_step() == 7

    got_meta, files = store.load(7)
    assert got_meta == meta
    _assert_same(files["state"], state, "state")
    _assert_same(files["opt"], opt, "opt")
    assert isinstance(files["state"]["np"]["scalar"], np.float64)

    step, meta2, files2, skipped = CheckpointStore(str(tmp_path / "ckpt")).load_latest()
    assert (step, meta2, skipped) == (7, meta, [])
    _assert_same(files2["state"], state, "state")


def test_data_files_load_with_plain_torch_weights_only(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"state": _state()}, {})
    raw = torch.load(_ckpt(tmp_path, 1) + "/state.pt", weights_only=True)
    assert isinstance(raw["np"]["f32"], torch.Tensor) and raw["np"]["f32"].dtype == torch.float32
    manifest = json.loads((tmp_path / "ckpt-00000001" / "manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["step"] == 1
    assert manifest["files"]["state"]["numpy"] == [["np", "f32"], ["np", "i64"], ["np", "mask"]]
    assert manifest["files"]["state"]["numpy_scalars"] == [["np", "scalar"]]
    data = (tmp_path / "ckpt-00000001" / "state.pt").read_bytes()
    assert manifest["files"]["state"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["files"]["state"]["bytes"] == len(data)


def test_round_trip_fsspec_memory():
    root = f"memory://ckpt-test-{uuid.uuid4().hex}"
    store = CheckpointStore(root, keep=2)
    for s in (1, 2, 3):
        info = store.save(s, {"state": _state(s)}, {"s": s})
        assert info.path == f"{root}/ckpt-{s:08d}" and info.nbytes > 0
    assert store.list() == [2, 3]
    meta, files = store.load(2)
    assert meta == {"s": 2}
    _assert_same(files["state"], _state(2), "state")
    step, meta, files, skipped = store.load_latest()
    assert (step, meta, skipped) == (3, {"s": 3}, [])
    _assert_same(files["state"], _state(3), "state")


def test_memory_corruption_is_detected():
    import fsspec

    root = f"memory://ckpt-test-{uuid.uuid4().hex}"
    store = CheckpointStore(root)
    _save_steps(store, [1, 2])
    fs, path = fsspec.core.url_to_fs(root)
    pt = f"{path}/ckpt-00000002/state.pt"
    data = bytearray(fs.cat_file(pt))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(pt, bytes(data))
    step, _, _, skipped = store.load_latest()
    assert step == 1 and len(skipped) == 1 and "ckpt-00000002/state.pt: checksum mismatch" in skipped[0]


def test_retention_keeps_newest(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    _save_steps(store, range(1, 6))
    assert store.list() == [3, 4, 5]
    assert sorted(os.listdir(tmp_path)) == [f"ckpt-{s:08d}" for s in (3, 4, 5)]


def test_retention_never_drops_the_step_just_saved(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    _save_steps(store, [5, 6])
    store.save(3, {"state": _state(3)}, {})  # a job that rolled back
    assert store.list() == [3, 5, 6]
    assert store.load(3)[1]["state"]["count"] == 45


def test_corrupt_data_file_falls_back(tmp_path):
    store = CheckpointStore(tmp_path)
    _save_steps(store, [1, 2, 3])
    pt = _ckpt(tmp_path, 3) + "/state.pt"
    with open(pt, "r+b") as f:
        f.seek(os.path.getsize(pt) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))

    with pytest.raises(CheckpointError) as e:
        store.load(3)
    msg = str(e.value)
    assert msg == f"{pt}: checksum mismatch (corrupt checkpoint)"

    step, meta, files, skipped = store.load_latest()
    assert step == 2 and meta == {"step": 2}
    _assert_same(files["state"], _state(2), "state")
    assert skipped == [msg] and "state.pt" in skipped[0] and "\n" not in skipped[0]


def test_truncated_and_missing_data_files(tmp_path):
    store = CheckpointStore(tmp_path)
    _save_steps(store, [1, 2])
    pt = _ckpt(tmp_path, 2) + "/state.pt"
    size = os.path.getsize(pt)
    with open(pt, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(CheckpointError, match=rf"state\.pt: size {size - 10} != {size}"):
        store.load(2)
    os.remove(pt)
    with pytest.raises(CheckpointError, match=r"ckpt-00000002/state\.pt: missing"):
        store.load(2)
    assert store.load_latest()[0] == 1


@pytest.mark.parametrize("garbage", [b"", b'{"version": 1, "st', b"\xff\xfe not json", b"[1, 2]"])
def test_garbage_manifest_is_skipped(tmp_path, garbage):
    store = CheckpointStore(tmp_path)
    _save_steps(store, [1, 2])
    with open(_ckpt(tmp_path, 2) + "/manifest.json", "wb") as f:
        f.write(garbage)
    assert store.list() == [1, 2]  # complete (manifest present) but not valid
    with pytest.raises(CheckpointError, match=r"ckpt-00000002/manifest\.json: "):
        store.load(2)
    step, _, _, skipped = store.load_latest()
    assert step == 1 and len(skipped) == 1
    assert "ckpt-00000002/manifest.json" in skipped[0] and "\n" not in skipped[0]


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda m: m["meta"].update(step=99), "meta checksum mismatch"),
        (lambda m: m.pop("files"), "missing field(s) files"),
        (lambda m: m.update(version=2), "unsupported format version 2"),
        (lambda m: m.update(step=1), "step 1 does not match directory step 2"),
        (lambda m: m["files"]["state"].update(sha256="0" * 64), "state.pt: checksum mismatch"),
        (lambda m: m["files"].update({"../evil": m["files"]["state"]}), "bad file key '../evil'"),
    ],
)
def test_tampered_manifest_is_detected(tmp_path, edit, needle):
    store = CheckpointStore(tmp_path)
    _save_steps(store, [1, 2])
    _rewrite_manifest(tmp_path, 2, edit)
    with pytest.raises(CheckpointError) as e:
        store.load(2)
    assert needle in str(e.value)
    step, _, _, skipped = store.load_latest()
    assert step == 1 and len(skipped) == 1 and needle in skipped[0]


def test_incomplete_checkpoint_is_ignored_then_removed(tmp_path):
    store = CheckpointStore(tmp_path)
    _save_steps(store, [1, 2])
    os.remove(_ckpt(tmp_path, 2) + "/manifest.json")  # as if the save died before it
    os.makedirs(_ckpt(tmp_path, 9))  # a save of a later step still running
    assert store.list() == [1] and store.latest_step() == 1
    step, meta, _, skipped = store.load_latest()
    assert (step, meta, skipped) == (1, {"step": 1}, [])
    with pytest.raises(CheckpointError, match="manifest.json: missing"):
        store.load(2)

    store.save(3, {"state": _state(3)}, {})
    assert not os.path.exists(_ckpt(tmp_path, 2))  # older incomplete: removed
    assert os.path.isdir(_ckpt(tmp_path, 9))  # newer incomplete: left alone
    store.save(2, {"state": _state(2)}, {"again": True})  # re-saving an incomplete step works
    assert store.list() == [1, 2, 3] and store.load(2)[0] == {"again": True}


def test_all_corrupt(tmp_path):
    store = CheckpointStore(tmp_path)
    _save_steps(store, [1, 2])
    for s in (1, 2):
        with open(_ckpt(tmp_path, s) + "/state.pt", "ab") as f:
            f.write(b"x")
    with pytest.raises(CheckpointError) as e:
        store.load_latest()
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path}: no valid checkpoint (")
    assert "ckpt-00000002/state.pt" in msg and "ckpt-00000001/state.pt" in msg and "; " in msg
    assert "\n" not in msg


def test_missing_and_empty_root(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointError, match="does not exist") as e:
        CheckpointStore(str(missing)).load_latest()
    assert str(e.value) == f"{missing}: checkpoint directory does not exist"
    assert isinstance(e.value, DLRoverError)
    assert CheckpointStore(str(missing)).list() == []
    assert CheckpointStore(str(missing)).latest_step() is None

    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no checkpoint found$"):
        CheckpointStore(str(tmp_path / "empty")).load_latest()


def test_bad_arguments(tmp_path):
    store = CheckpointStore(tmp_path)
    for key in ("a/b", "../x", "", "a.b", "spa ce"):
        with pytest.raises(ValueError, match="key") as e:
            store.save(1, {key: torch.ones(1)}, {})
        assert repr(key) in str(e.value)
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        store.save(1, {"a": torch.ones(1)}, {"x": object()})
    with pytest.raises(ValueError, match=r"a\['x'\]\[1\]: unsupported value of type object"):
        store.save(1, {"a": {"x": [1, object()]}}, {})
    with pytest.raises(ValueError, match="numpy dtype"):
        store.save(1, {"a": np.array(["s"])}, {})
    with pytest.raises(ValueError, match="step"):
        store.save(-1, {}, {})
    with pytest.raises(ValueError, match="keep"):
        CheckpointStore(tmp_path, keep=0)
    assert os.listdir(tmp_path) == []  # validation failures wrote nothing

    store.save(1, {"a": torch.ones(1)}, {})
    with pytest.raises(ValueError, match="already exists"):
        store.save(1, {"a": torch.zeros(1)}, {})
    assert torch.equal(store.load(1)[1]["a"], torch.ones(1))


class _Evil:
    """Unpickling this would create a directory: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class _Plain:
    def __init__(self) -> None:
        self.x = 1


@pytest.mark.parametrize("evil", [False, True])
def test_non_tensor_pickle_is_refused(tmp_path, evil):
    """A pickle of an arbitrary class with a matching hash still fails: weights_only=True."""
    root, marker = tmp_path / "ckpt", tmp_path / "code-ran"
    store = CheckpointStore(root)
    _save_steps(store, [1])
    store.save(2, {"state": {"w": torch.ones(2)}}, {})
    buf = io.BytesIO()
    if evil:
        pickle.dump(_Evil(str(marker)), buf)
    else:
        torch.save(_Plain(), buf)
    data = buf.getvalue()
    pt = _ckpt(root, 2) + "/state.pt"
    with open(pt, "wb") as f:
        f.write(data)

    def match_hash(m):
        m["files"]["state"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))

    _rewrite_manifest(root, 2, match_hash)
    with pytest.raises(CheckpointError) as e:
        store.load(2)
    msg = str(e.value)
    assert msg.startswith(f"{pt}: cannot load (not a plain tensor archive, refused by weights_only=True")
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 400
    if not evil:
        assert "_Plain" in msg
    step, _, _, skipped = store.load_latest()
    assert step == 1 and skipped == [msg]
    assert not marker.exists()


@pytest.mark.parametrize(
    "value",
    [
        np.zeros((3, 4), dtype=np.float16),
        np.array([1, 2, 3], dtype=np.uint8),
        np.array([1, 2**40], dtype=np.uint64),
        np.array([1 + 2j], dtype=np.complex64),
        np.array(3.5, dtype=np.float32),  # 0-d
        np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],  # non-contiguous view
        np.arange(4, dtype=np.float64)[::-1],  # negative stride
        np.int64(7),
        np.bool_(True),
    ],
    ids=lambda v: f"{type(v).__name__}-{v.dtype}-{v.shape}",
)
def test_numpy_leaves_round_trip(tmp_path, value):
    store = CheckpointStore(tmp_path)
    store.save(1, {"x": value, "nested": {"v": [value]}}, {})
    files = store.load(1)[1]
    _assert_same(files["x"], value, "x")
    _assert_same(files["nested"], {"v": [value]}, "nested")


def test_file_url_root(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/c")
    info = store.save(4, {"a": {"t": torch.ones(3), "n": np.ones(2)}}, {"ok": 1})
    assert info.path == f"file://{tmp_path}/c/ckpt-00000004"
    assert os.path.isfile(tmp_path / "c" / "ckpt-00000004" / "manifest.json")
    assert not os.path.exists(tmp_path / "c" / "ckpt-00000004" / "manifest.json.tmp")
    step, meta, files, _ = CheckpointStore(tmp_path / "c").load_latest()
    assert (step, meta) == (4, {"ok": 1}) and isinstance(files["a"]["n"], np.ndarray)


def test_view_of_large_tensor_is_compacted(tmp_path):
    big = torch.arange(1_000_000, dtype=torch.float32)
    store = CheckpointStore(tmp_path)
    info = store.save(1, {"slice": big[10:20]}, {})
    assert info.nbytes < 10_000
    assert torch.equal(store.load(1)[1]["slice"], big[10:20])


def test_a_checkpoint_written_file_by_file_from_other_processes_loads_like_one_saved_at_once(tmp_path):
    """begin / write_file (here through a pickled copy of the store, as a Ray task gets it)
    / commit: the manifest records what each writer hashed while streaming its file."""
    store = CheckpointStore(tmp_path, keep=5)
    pending = store.begin(3, {"seq": 3})
    remote = pickle.loads(pickle.dumps(store))
    entries = {key: remote.write_file(3, key, _state(i)) for i, key in enumerate(["ps_0", "ps_1"])}
    assert store.list() == []  # no manifest yet: not a checkpoint
    info = store.commit(pending, entries)
    meta, files = store.load(3)
    assert meta == {"seq": 3} and info.nbytes > sum(e.nbytes for e in entries.values())
    for i, key in enumerate(["ps_0", "ps_1"]):
        _assert_same(files[key], _state(i), key)
        with open(tmp_path / "ckpt-00000003" / f"{key}.pt", "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == entries[key].sha256


def test_a_file_write_names_a_bad_key_and_begin_refuses_an_existing_step(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"a": torch.ones(1)}, {})
    with pytest.raises(ValueError, match="already exists"):
        store.begin(1, {})
    store.begin(2, {})
    with pytest.raises(ValueError, match="'../x'"):
        store.write_file(2, "../x", torch.ones(1))
    assert store.list() == [1]
