"""An exported model, as ``dlrover predict`` (or any serving process) loads it.

A model directory holds ``model.json`` (the :class:`Manifest`), ``dense.pt2`` (a
``torch.export`` program: DenseArch, interaction and OverArch of the DLRM, taking the
dense features and the pooled embeddings), ``tables.pt`` (the embedding tables, a list
of [rows, dim] tensors) and, for a job with dynamic tables, ``id_maps.pt`` (each one's
admitted ids and their rows). The directory loads with torch alone: no Ray, no TorchRec,
nothing of dlrover (``tests/test_export.py`` does it so); this module adds a typed check
of the manifest (pydantic) and the checksums. The lookup (``row = id mod rows`` of the
feature's table, or a dynamic table's map) is :meth:`ServedModel.rows`; each feature's
bag is pooled by sum, or by mean for ``mean_features``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pydantic
import torch

from dlrover.errors import DataError

FORMAT = "dlrover-dlrm/1"
MANIFEST = "model.json"
DENSE_FILE = "dense.pt2"
TABLES_FILE = "tables.pt"
ID_MAPS_FILE = "id_maps.pt"
HASHING = (
    "row = id mod table_rows[t], t = feature_tables[f] (ids >= 0: hex categories decode, string ids hash to 63 bits); for t in dynamic_tables: "
    "row = rows[i] where ids[i] == id, (ids, rows) = id_maps.pt[dynamic_tables.index(t)], else table_rows[t] - 1 (the default row)"
)
SCORE = "sigmoid(dense.pt2(dense_features, pooled)); pooled = concat over features f of the sum (mean: average) of tables[t][row] over f's ids"


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 16 MiB pieces (tables may be GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(16 << 20):
            h.update(piece)
    return h.hexdigest()


@dataclass(frozen=True)
class FileDigest:
    """A file of the model directory and the sha256 it must have: a truncated copy or a
    file from another export is refused instead of scoring with the wrong weights."""

    name: str
    sha256: str
    bytes: int

    @classmethod
    def of(cls, path: Path) -> "FileDigest":
        return cls(path.name, sha256_of(path), path.stat().st_size)


@dataclass(frozen=True)
class Manifest:
    """What a server must know besides the tensors: the input layout, how a raw id becomes
    a table row, and which files (with their checksums) make up the model."""

    format: str
    job_id: str
    source_sha256: str  # of the job's final.pt: which trained model this is
    embedding_dim: int
    table_rows: list[int]
    dense_features: list[str]  # columns of the dense input, in order (none: one constant 1.0 input)
    sparse_features: list[str]  # columns of the id input, in order
    dense_transform: str
    hashing: str
    score: str
    files: list[FileDigest]
    dynamic_tables: list[int] = dataclasses.field(default_factory=list)  # ids mapped by id_maps.pt
    feature_tables: list[int] = dataclasses.field(default_factory=list)  # table of each sparse feature (empty: feature i, table i)
    mean_features: list[int] = dataclasses.field(default_factory=list)  # features pooled by mean (the rest: sum)
    features: dict | None = None  # the job's ``features:`` section (None: Criteo's layout)
    data: dict = dataclasses.field(default_factory=dict)  # the job's data.format, header, delimiter, columns

    def write(self, model_dir: Path) -> None:
        """Written last and atomically (tmp + rename): a directory with a manifest is whole."""
        tmp = model_dir / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        os.replace(tmp, model_dir / MANIFEST)

    @classmethod
    def read(cls, model_dir: Path) -> "Manifest":
        """The manifest, every field type-checked (pydantic): one DataError naming the
        field of a wrong or missing one."""
        path = model_dir / MANIFEST
        if not path.is_file():
            raise DataError(f"{path}: no such file (is {model_dir} a directory written by dlrover export?)")
        try:
            manifest = pydantic.TypeAdapter(cls).validate_json(path.read_bytes(), strict=True)
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise DataError(f"{path}: {where + ': ' if where else ''}{err['msg'][0].lower()}{err['msg'][1:]}") from None
        if manifest.format != FORMAT:
            raise DataError(f"{path}: format {manifest.format!r}, expected {FORMAT!r}")
        return manifest


@dataclass
class ServedModel:
    """A loaded model directory: scores rows given their dense features and raw ids."""

    manifest: Manifest
    dense: torch.nn.Module
    tables: list[torch.Tensor]
    id_maps: list[tuple[torch.Tensor, torch.Tensor]]  # (ids ascending, rows) per dynamic table

    @classmethod
    def load(cls, model_dir: str | Path) -> "ServedModel":
        """Read and check a model directory: every listed file present with its sha256,
        the tables of the manifest's shapes. Each problem is one DataError naming the file."""
        d = Path(model_dir)
        manifest = Manifest.read(d)
        for f in manifest.files:
            path = d / f.name
            if not path.is_file():
                raise DataError(f"{path}: no such file (listed in {d / MANIFEST})")
            if sha256_of(path) != f.sha256:
                raise DataError(f"{path}: sha256 does not match {d / MANIFEST} (corrupt or replaced file)")
        listed = {f.name for f in manifest.files}
        for name in (DENSE_FILE, TABLES_FILE, *([ID_MAPS_FILE] if manifest.dynamic_tables else [])):
            if name not in listed:
                raise DataError(f"{d / MANIFEST}: files: {name} is not listed")
        dense = torch.export.load(str(d / DENSE_FILE)).module()
        # mmap: a table is paged in as ids touch it, not read whole before the first score
        tables = torch.load(d / TABLES_FILE, weights_only=True, mmap=True)
        shapes = [tuple(getattr(t, "shape", ())) for t in tables] if isinstance(tables, list) else None
        expected = [(n, manifest.embedding_dim) for n in manifest.table_rows]
        if shapes != expected:
            raise DataError(f"{d / TABLES_FILE}: tables of shapes {shapes}, {d / MANIFEST} says {expected}")
        id_maps = torch.load(d / ID_MAPS_FILE, weights_only=True) if manifest.dynamic_tables else []
        sizes = [manifest.table_rows[t] for t in manifest.dynamic_tables]
        if not isinstance(id_maps, list) or len(id_maps) != len(sizes) or not all(_is_map(m, n) for m, n in zip(id_maps, sizes)):
            raise DataError(f"{d / ID_MAPS_FILE}: expected {len(sizes)} pairs (ids ascending, rows below the default row) for dynamic_tables {manifest.dynamic_tables}")
        return cls(manifest, dense, tables, [(m[0], m[1]) for m in id_maps])

    def feature_tables(self) -> list[int]:
        m = self.manifest
        return m.feature_tables or list(range(len(m.sparse_features)))

    def rows(self, ids: torch.Tensor, table: int) -> torch.Tensor:
        """The row of table ``table`` each raw id reads: ``id mod rows``, or through a
        dynamic table's map, where an id not in it (never admitted, or evicted) reads the
        default row."""
        m = self.manifest
        if table not in m.dynamic_tables:
            return torch.remainder(ids, m.table_rows[table])
        known, at = self.id_maps[m.dynamic_tables.index(table)]
        row = torch.full_like(ids, m.table_rows[table] - 1)
        if len(known):
            i = torch.searchsorted(known, ids).clamp(max=len(known) - 1)
            hit = known[i] == ids
            row[hit] = at[i[hit]]
        return row

    def logits(self, dense: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B] of rows with ``dense`` [B, D] (already transformed, see
        ``Manifest.dense_transform``) and raw int64 ``ids``: [B, F], one per feature, or
        with ``lengths`` [F, B] the ids flat, feature by feature (a KeyedJaggedTensor's order)."""
        f = len(self.manifest.sparse_features)
        if lengths is None:
            b = ids.shape[0]
            ids, lengths = ids.T.reshape(-1), torch.ones(f, b, dtype=torch.int64)
        b = lengths.shape[1]
        per_feature = torch.split(ids, lengths.sum(dim=1).tolist())
        mean = set(self.manifest.mean_features)
        pooled = []
        for i, (x, t) in enumerate(zip(per_feature, self.feature_tables())):
            offsets = torch.zeros(b, dtype=torch.int64)
            offsets[1:] = torch.cumsum(lengths[i, :-1].to(torch.int64), 0)
            mode = "mean" if i in mean else "sum"
            pooled.append(torch.nn.functional.embedding_bag(self.rows(x.contiguous(), t), self.tables[t], offsets, mode=mode))
        with torch.no_grad():
            return self.dense(dense, torch.cat(pooled, dim=1))


def _is_map(pair: object, num_rows: int) -> bool:
    """A pair of int64 vectors of one length: ids ascending, rows below the default row."""
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(a, torch.Tensor) for a in pair)):
        return False
    ids, rows = pair
    if ids.dtype != torch.int64 or rows.dtype != torch.int64 or ids.dim() != 1 or ids.shape != rows.shape:
        return False
    return not len(ids) or (bool((ids[1:] > ids[:-1]).all()) and int(rows.min()) >= 0 and int(rows.max()) < num_rows - 1)
