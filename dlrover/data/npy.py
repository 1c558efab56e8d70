"""Criteo as TorchRec's own preprocessing leaves it (``data.format: torchrec_npy``), read
by memory map: a directory of ``day_{i}_labels.npy`` (int32 [N, 1]), ``day_{i}_dense.npy``
(float32 [N, 13], already ``log(x - min + 2)``: the schema's default transform here is
none) and either ``day_{i}_sparse.npy`` (int64 [N, 26], one id per feature) or MLPerf
DLRM-DCNv2's materialised multi-hot ``day_{i}_sparse_multi_hot.npz`` (members ``"0"`` ..
``"25"``, each [N, bag size] of ids), which is preferred when both are there.

A day is one "file" of the job (``DIR/day_{i}``), cut into row-range shards like any
other; a read maps only the rows it asks for. The ``.npz`` members are stored, not
compressed (``numpy.savez``), so each is mapped at its offset inside the archive.
Columns are positional: ``label``, ``I1..I13``, ``C1..C26``; a job's ``features:`` may
pick some of them.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from dataclasses import dataclass

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.layout import DataLayout
from dlrover.data.schema import CRITEO_DENSE, CRITEO_SPARSE, Transform
from dlrover.errors import DataError

_DAY = re.compile(r"^day_(\d+)_labels\.npy$")


def npy_days(paths: list[str]) -> list[str]:
    """The days (``DIR/day_{i}``, by day number) of the directories ``paths``."""
    days = []
    for d in paths:
        d = os.path.expanduser(d)
        if not os.path.isdir(d):
            raise DataError(f"data.paths: {d}: not a directory (torchrec_npy reads a directory of day_*_{{dense,sparse,labels}}.npy)")
        found = sorted((int(m.group(1)), os.path.join(d, f"day_{m.group(1)}")) for m in map(_DAY.match, os.listdir(d)) if m)
        if not found:
            raise DataError(f"data.paths: {d}: no day_*_labels.npy files")
        days += [stem for _, stem in found]
    return days


def _npz_member(path: str, zf: zipfile.ZipFile, name: str) -> np.ndarray:
    """One stored member of an ``.npz`` mapped in place (never read whole)."""
    info = zf.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        raise DataError(f"{path}: member {name} is compressed; write it with numpy.savez, not savez_compressed")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        f.seek(start)
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if fortran:
        raise DataError(f"{path}: member {name} is Fortran-ordered")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


@dataclass
class NpyDay:
    """A day's arrays, memory-mapped: the single-hot ``[N, 26]`` matrix, or MLPerf's
    multi-hot members (one ``[N, bag]`` array per Criteo feature)."""

    stem: str
    labels: np.ndarray
    dense: np.ndarray
    one_hot: np.ndarray | None
    multi_hot: list[np.ndarray] | None

    @classmethod
    def open(cls, stem: str) -> "NpyDay":
        def load(suffix: str) -> np.ndarray:
            path = f"{stem}_{suffix}.npy"
            try:
                return np.load(path, mmap_mode="r")
            except FileNotFoundError:
                raise DataError(f"{path}: no such file") from None
            except ValueError as e:
                raise DataError(f"{path}: not a readable .npy file: {e}") from None

        labels, dense = load("labels"), load("dense")
        npz = f"{stem}_sparse_multi_hot.npz"
        one_hot, multi_hot = None, None
        if os.path.isfile(npz):
            try:
                with zipfile.ZipFile(npz) as zf:
                    multi_hot = [_npz_member(npz, zf, f"{j}.npy") for j in range(len(CRITEO_SPARSE))]
            except (KeyError, zipfile.BadZipFile) as e:
                raise DataError(f"{npz}: not MLPerf's multi-hot archive (members 0..25): {e}") from None
            sparse_rows, width = {npz: len(a) for a in multi_hot}, len(multi_hot)
        else:
            one_hot = load("sparse")
            sparse_rows, width = {f"{stem}_sparse.npy": len(one_hot)}, one_hot.shape[1] if one_hot.ndim == 2 else 0
        rows = {f"{stem}_labels.npy": len(labels), f"{stem}_dense.npy": len(dense), **sparse_rows}
        if len(set(rows.values())) > 1:
            shown = ", ".join(f"{os.path.basename(n)} {r:,}" for n, r in rows.items())
            raise DataError(f"{stem}: the day's files hold different row counts ({shown})")
        if dense.ndim != 2 or dense.shape[1] != len(CRITEO_DENSE) or width != len(CRITEO_SPARSE):
            raise DataError(f"{stem}: expected {len(CRITEO_DENSE)} dense and {len(CRITEO_SPARSE)} sparse columns, got dense {list(dense.shape)} and {width} sparse")
        return cls(stem, labels, dense, one_hot, multi_hot)

    @property
    def rows(self) -> int:
        return len(self.labels)

    def read(self, layout: DataLayout, start: int, stop: int) -> tuple[Batch, np.ndarray, list[str]]:
        """Rows [start, stop) -> (good rows, bad row ordinals within them, reasons). Each
        array is copied once, from the mapped file into the batch."""
        s = layout.schema
        labels = np.asarray(self.labels[start:stop]).reshape(-1).astype(np.float32)
        if s.label.threshold is not None:
            labels = (labels >= s.label.threshold).astype(np.float32)
        bad = np.flatnonzero((labels != 0) & (labels != 1))
        reasons = [f"{self.stem}_labels.npy:{start + int(r) + 1}: label must be 0 or 1" for r in bad.tolist()]
        n = len(labels)
        if s.dense:
            dense = _columns(self.dense[start:stop], [CRITEO_DENSE.index(d.column) for d in s.dense], np.float32)
            for j, d in enumerate(s.dense):
                if d.transform is Transform.LOG1P:
                    dense[:, j] = np.log1p(np.maximum(dense[:, j], 0))
        else:
            dense = np.ones((n, 1), np.float32)
        cols = [CRITEO_SPARSE.index(f.column) for f in s.sparse]
        if self.one_hot is not None:
            batch = Batch(labels, dense, _columns(self.one_hot[start:stop], cols, np.int64))
        else:
            assert self.multi_hot is not None
            parts = [self.multi_hot[c] for c in cols]
            widths = [1 if a.ndim == 1 else a.shape[1] for a in parts]
            ids = np.empty(n * sum(widths), np.int64)
            at = 0
            for a, w in zip(parts, widths):
                ids[at : at + n * w].reshape(a[start:stop].shape)[...] = a[start:stop]
                at += n * w
            batch = Batch(labels, dense, ids, np.repeat(np.asarray(widths, np.int32)[:, None], n, axis=1))
        if len(bad):
            keep = np.ones(n, bool)
            keep[bad] = False
            batch = _rows(batch, keep)
        return batch, bad, reasons


def _columns(block: np.ndarray, cols: list[int], dtype: type) -> np.ndarray:
    """Columns ``cols`` of a mapped ``[n, k]`` block as a new ``dtype`` array (one copy
    when they are all of them, in order)."""
    if cols == list(range(block.shape[1])):
        return np.asarray(block, dtype=dtype).copy() if block.dtype == dtype else block.astype(dtype)
    return block[:, cols].astype(dtype)


def _rows(batch: Batch, keep: np.ndarray) -> Batch:
    """The rows of ``batch`` where ``keep`` (rare: a day with bad labels)."""
    if batch.lengths is None:
        return Batch(batch.labels[keep], batch.dense[keep], batch.sparse[keep])
    ids, lengths = batch.jagged()
    kept = np.repeat(np.tile(keep, len(lengths)), lengths.reshape(-1))
    return Batch(batch.labels[keep], batch.dense[keep], ids[kept], np.ascontiguousarray(lengths[:, keep]))


def write_multi_hot(in_dir: str, out_dir: str, bag_sizes: list[int], num_embeddings: list[int], seed: int = 0) -> list[str]:
    """MLPerf DLRM-DCNv2's materialised multi-hot layout from TorchRec's ``.npy`` days:
    feature j's id ``x`` becomes a fixed bag of ``bag_sizes[j]`` ids below
    ``num_embeddings[j]``, the first being ``x mod num_embeddings[j]`` and the rest drawn
    once per id (uniformly), so a given id always brings the same bag. Writes
    ``day_{i}_sparse_multi_hot.npz`` (``numpy.savez``: stored members ``"0"``..``"25"``)
    and links the days' labels and dense files beside it; returns the days written."""
    k = len(CRITEO_SPARSE)
    if len(bag_sizes) != k or len(num_embeddings) != k:
        raise DataError(f"--bag-sizes and --num-embeddings: {k} values each (one per Criteo feature), got {len(bag_sizes)} and {len(num_embeddings)}")
    if min(bag_sizes) < 1 or min(num_embeddings) < 1:
        raise DataError("--bag-sizes and --num-embeddings: every value must be >= 1")
    rng = np.random.default_rng(seed)
    tables = []
    for size, rows in zip(bag_sizes, num_embeddings):
        t = rng.integers(0, rows, size=(rows, size), dtype=np.int64)
        t[:, 0] = np.arange(rows)
        tables.append(t)
    os.makedirs(out_dir, exist_ok=True)
    days = npy_days([in_dir])
    for stem in days:
        sparse = np.load(f"{stem}_sparse.npy", mmap_mode="r")
        name = os.path.basename(stem)
        members = {str(j): tables[j][np.asarray(sparse[:, j], dtype=np.int64) % num_embeddings[j]] for j in range(k)}
        tmp = os.path.join(out_dir, f".{name}_sparse_multi_hot.npz")
        np.savez(tmp, **members)
        os.replace(tmp, os.path.join(out_dir, f"{name}_sparse_multi_hot.npz"))
        for part in ("labels", "dense"):
            src, dst = f"{stem}_{part}.npy", os.path.join(out_dir, f"{name}_{part}.npy")
            if os.path.abspath(src) != os.path.abspath(dst):
                shutil.copyfile(src, dst)
    return days
