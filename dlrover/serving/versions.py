"""Published model versions (``publish:``): a directory of versions, each a full model or
a delta of the embedding rows changed since its parent, that a server loads and follows.

``<publish.dir>/v00000007/`` holds ``model.json`` (the export's :class:`Manifest`),
``dense.pt2`` (the dense part, a ``torch.export`` program), ``tables.pt`` (a full
version: every table) or ``rows.pt`` (a delta: per table the global row ids changed
since the parent and their weights), and, written last, ``version.json``
(:class:`Version`). A version is written under a hidden name and renamed into place
once ``version.json`` is in it, so a reader never sees a torn one, and a writer killed
half way leaves the previous versions as they were.

``quantize`` packs the weights written (fp16, or int8 with a per-row scale and offset,
as the durable checkpoints do). Each version records ``state_sha256``: the digest of
every table as a reader has it after loading (dequantized, float32), so applying a delta
is checked bit for bit against the state the writer had at that version's cut.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic
import torch

from dlrover.checkpoint.incremental import pack_weights, unpack_weights
from dlrover.errors import DataError
from dlrover.serving.model import DENSE_FILE, MANIFEST, TABLES_FILE, FileDigest, Manifest, ServedModel, sha256_of

VERSION_FILE = "version.json"
ROWS_FILE = "rows.pt"


@dataclass(frozen=True)
class Version:
    """One published version: what it is built on, what it holds, and how it was cut."""

    version: int
    kind: Literal["full", "delta"]
    parent: int | None  # a delta's: the version it applies to
    base: int  # the full version its chain starts from (itself for a full one)
    quantize: str
    job_id: str
    rows_trained: int  # samples the model had trained at the cut
    watermark: list[str]  # data.follow: the files wholly trained at the cut, in arrival order
    at_s: float  # job time of the cut
    state_sha256: str  # of the tables as loaded (see the module docstring)
    changed_rows: int  # rows a delta holds (a full one: all)
    files: list[FileDigest]

    @classmethod
    def read(cls, version_dir: Path) -> "Version":
        path = version_dir / VERSION_FILE
        try:
            return pydantic.TypeAdapter(cls).validate_json(path.read_bytes(), strict=True)
        except (OSError, pydantic.ValidationError) as e:
            raise DataError(f"{path}: not a dlrover version manifest: {str(e).splitlines()[0]}") from None


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version:08d}"


def versions(root: str | Path) -> list[int]:
    """The complete versions under ``root`` (those with a ``version.json``), ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        if d.name.startswith("v") and d.name[1:].isdigit() and (d / VERSION_FILE).is_file():
            out.append(int(d.name[1:]))
    return sorted(out)


def global_tables(payloads: list[dict], table_sizes: list[int], num_vshards: int) -> list[np.ndarray]:
    """Each table's weights [rows, dim] from the PS payloads of a cut (row ``r`` lives in
    vshard ``r % V`` at ``r // V``; a payload holds its vshards' blocks back to back)."""
    out = []
    for t, n in enumerate(table_sizes):
        rpv = -(-n // num_vshards)
        dim = np.asarray(payloads[0]["tables"][t][0]).shape[1]
        table = np.empty((n, dim), dtype=np.float32)
        for p in payloads:
            w = np.asarray(p["tables"][t][0])
            for slot, v in enumerate(p["vshards"]):
                rows = np.arange(int(v), n, num_vshards)
                table[rows] = w[slot * rpv : slot * rpv + len(rows)]
        out.append(table)
    return out


def as_loaded(tables: list[np.ndarray], quantize: str) -> list[np.ndarray]:
    """The tables as a reader of a version written with ``quantize`` has them."""
    return tables if quantize == "none" else [unpack_weights(pack_weights(t, quantize)) for t in tables]


def state_digest(tables: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for t in tables:
        h.update(np.ascontiguousarray(t, dtype=np.float32).tobytes())
    return h.hexdigest()


def _packed(w: np.ndarray, quantize: str) -> object:
    """Weights as written: a tensor, or a dict of tensors (fp16; int8 with scale, offset)."""
    p = pack_weights(np.ascontiguousarray(w, dtype=np.float32), quantize)
    return torch.from_numpy(np.ascontiguousarray(p)) if not isinstance(p, dict) else {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in p.items()}


def _unpacked(obj: object) -> np.ndarray:
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return unpack_weights({k: v.numpy() for k, v in obj.items()})
    raise ValueError("weights are neither a tensor nor a packed dict")


def write_version(root: str | Path, v: Version, manifest: Manifest, dense: torch.export.ExportedProgram, tables: list[np.ndarray], rows: list[np.ndarray] | None) -> Path:
    """Write version ``v`` (``rows`` None: full, else the delta's global rows per table)
    and rename it into place; returns its directory. ``v.files`` and ``manifest.files``
    are filled in here."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = version_dir(root, v.version), root / f".v{v.version:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a writer killed half way
    tmp.mkdir()
    torch.export.save(dense, str(tmp / DENSE_FILE))
    if rows is None:
        torch.save([_packed(t, v.quantize) for t in tables], tmp / TABLES_FILE)
    else:
        torch.save([[torch.from_numpy(r.astype(np.int64)), _packed(t[r], v.quantize)] for t, r in zip(tables, rows)], tmp / ROWS_FILE)
    files = [FileDigest.of(tmp / name) for name in (DENSE_FILE, TABLES_FILE if rows is None else ROWS_FILE)]
    dataclasses.replace(manifest, files=files).write(tmp)
    files.append(FileDigest.of(tmp / MANIFEST))
    done = dataclasses.replace(v, files=files)
    (tmp / VERSION_FILE).write_text(json.dumps(dataclasses.asdict(done), indent=2) + "\n")
    if final.exists():  # a version of a master that died after renaming and before recording it
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _checked(d: Path) -> Version:
    v = Version.read(d)
    for f in v.files:
        if not (d / f.name).is_file() or sha256_of(d / f.name) != f.sha256:
            raise DataError(f"{d / f.name}: missing or its sha256 does not match {d / VERSION_FILE}")
    return v


@dataclass
class LoadedVersion:
    """A version as a server holds it: the model to score with and its record."""

    version: Version
    model: ServedModel


def load_version(root: str | Path, version: int | None = None) -> LoadedVersion:
    """Version ``version`` (default: the newest complete one): its full base, then each
    delta applied in order, checked against the digest each version recorded."""
    root = Path(root)
    have = versions(root)
    if not have:
        raise DataError(f"{root}: no complete model version (is it a publish.dir?)")
    want = have[-1] if version is None else version
    if want not in have:
        raise DataError(f"{root}: no complete version {want} (complete: {', '.join(map(str, have[-5:]))})")
    chain = [_checked(version_dir(root, want))]
    while chain[-1].kind == "delta":
        chain.append(_checked(version_dir(root, int(chain[-1].parent))))
    chain.reverse()
    base = version_dir(root, chain[0].version)
    tables = [np.array(_unpacked(t)) for t in torch.load(base / TABLES_FILE, weights_only=True)]
    for v in chain[1:]:
        tables = apply_rows(tables, version_dir(root, v.version))
    top = chain[-1]
    if state_digest(tables) != top.state_sha256:
        raise DataError(f"{version_dir(root, want)}: the tables after applying its chain do not match its state_sha256")
    return LoadedVersion(top, model_of(version_dir(root, want), tables))


def apply_rows(tables: list[np.ndarray], delta_dir: Path, shared: list[np.ndarray] = ()) -> list[np.ndarray]:
    """A delta's rows written into ``tables`` (in place; returned). A table that is one of
    ``shared`` (a served version's, read by requests under way) is copied first."""
    for t, (ids, w) in enumerate(torch.load(delta_dir / ROWS_FILE, weights_only=True)):
        if not len(ids):
            continue
        if any(tables[t] is x for x in shared):
            tables[t] = tables[t].copy()
        tables[t][ids.numpy()] = _unpacked(w)
    return tables


def model_of(d: Path, tables: list[np.ndarray]) -> ServedModel:
    """The model of version directory ``d`` with these tables."""
    manifest = Manifest.read(d)
    dense = torch.export.load(str(d / DENSE_FILE)).module()
    return ServedModel(manifest, dense, [torch.from_numpy(t) for t in tables], [])


def prune(root: str | Path, keep_fulls: int = 2) -> list[int]:
    """Remove the versions older than the ``keep_fulls``-th newest full one (a reader
    loading the chain before the newest keeps it); returns those removed."""
    root = Path(root)
    fulls = [n for n in versions(root) if Version.read(version_dir(root, n)).kind == "full"]
    if len(fulls) <= keep_fulls:
        return []
    oldest = fulls[-keep_fulls]
    gone = [n for n in versions(root) if n < oldest]
    for n in gone:
        shutil.rmtree(version_dir(root, n), ignore_errors=True)
    return gone
