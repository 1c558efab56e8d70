"""``dlrover export RUN_DIR --out DIR``: a finished job's model as a self-contained
directory that :class:`dlrover.serving.model.ServedModel` (torch only) loads.

The job's ``final.pt`` (``<checkpoint.dir>/<job_id>/final.pt``, else in the run
directory, written by the master when the job succeeds) holds the global tables, the flat dense parameter vector and each
dynamic table's id map, which only dlrover's model code can put back into a DLRM. Here
the dense part becomes a ``torch.export`` program (graph and weights in one file, no
Python class needed to load it) and the tables plain tensors, with a manifest that says
how to use them. A dynamic table is exported with its default row appended as its last
row, and its map as two tensors (ids, rows): an id outside the map reads that last row.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import ValidationError
from torch import nn

from dlrover.data.schema import Schema, Transform
from dlrover.errors import DataError, SpecError, format_validation_error
from dlrover.serving.id_map import IdMap
from dlrover.model.dlrm import dense_arches
from dlrover.paths import out_dir
from dlrover.runlogs.event_file import read_events
from dlrover.serving.model import DENSE_FILE, FORMAT, HASHING, ID_MAPS_FILE, MANIFEST, SCORE, TABLES_FILE, FileDigest, Manifest, sha256_of
from dlrover.spec import JobSpec, ModelSpec


class DenseHead(nn.Module):
    """The DLRM after its embedding lookup: (dense features [B, D], pooled embeddings
    [B, F*E]) -> logits [B], the same modules and order as ``torchrec``'s ``DLRM.forward``
    so that it scores exactly as the trained model does."""

    def __init__(self, model: ModelSpec, schema: Schema, dense_vector: torch.Tensor) -> None:
        super().__init__()
        self.num_tables, self.dim = len(schema.sparse), model.embedding_dim
        self.dense_arch, self.inter_arch, self.over_arch = dense_arches(model, seed=0, schema=schema)  # weights set just below
        params = [p for arch in (self.dense_arch, self.inter_arch, self.over_arch) for p in arch.parameters()]  # dlrm.dense_parameters order
        want = sum(p.numel() for p in params)
        if dense_vector.numel() != want:
            raise ValueError(f"dense: {dense_vector.numel()} parameters, the job's model has {want}")
        # copies, not views into one vector: each weight is its own tensor in the export
        with torch.no_grad():
            for p, chunk in zip(params, dense_vector.to(torch.float32).split([p.numel() for p in params])):
                p.copy_(chunk.view_as(p))

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        sparse = pooled.reshape(pooled.shape[0], self.num_tables, self.dim)
        return self.over_arch(self.inter_arch(dense_features=self.dense_arch(dense), sparse_features=sparse)).squeeze(-1)


def dense_transform(schema: Schema) -> str:
    """What a server does to each dense column before the model, in words."""
    if not schema.dense:
        return "no dense column: the dense input is one constant 1.0"
    each = [f"{d.column}: {'log1p(max(x, 0))' if d.transform is Transform.LOG1P else 'x'}" for d in schema.dense]
    return "; ".join(each) + "; a missing value is 0"


def run_spec(run_dir: Path) -> JobSpec:
    """The spec the job ran with (``spec.json``, written by the driver, paths resolved)."""
    path = run_dir / "spec.json"
    if not path.is_file():
        raise DataError(f"{path}: no such file (is {run_dir} a run directory of dlrover run?)")
    try:
        return JobSpec.model_validate_json(path.read_text())
    except ValidationError as e:
        raise SpecError(format_validation_error(str(path), e)) from None


def find_final_model(run_dir: Path) -> tuple[Path, JobSpec]:
    """A run's ``final.pt`` (``<checkpoint.dir>/<job_id>/``, else the run directory's),
    and the job's spec."""
    spec = run_spec(run_dir)
    job_id = run_dir.resolve().name  # the driver names a run directory after its job
    path = (Path(spec.checkpoint.dir) / job_id if spec.checkpoint.dir else run_dir) / "final.pt"
    if not path.is_file():
        raise DataError(f"{path}: no such file (written when job {job_id} finishes; did it?)")
    return path, spec


@dataclass(frozen=True)
class FinalModel:
    """What a ``final.pt`` holds: global tables, the dense vector, the dynamic tables' maps."""

    tables: list[torch.Tensor]
    dense: torch.Tensor
    id_maps: dict[int, IdMap]


def load_final(path: Path, model: ModelSpec, schema: Schema) -> FinalModel:
    """The contents of a ``final.pt``, checked against the job's model."""
    try:
        doc = torch.load(path, weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a bad file
        # torch's first clause only: its zip reader appends a paragraph of advice
        first = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: not a readable torch file (truncated or corrupt?): {first}") from None
    for field in ("tables", "dense"):
        if not isinstance(doc, dict) or field not in doc:
            raise DataError(f"{path}: no {field!r} field (not a dlrover final model)")
    tables, dense = doc["tables"], doc["dense"]
    if not isinstance(tables, list) or not isinstance(dense, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in tables):
        raise DataError(f"{path}: 'tables' is not a list of tensors or 'dense' not a tensor (not a dlrover final model)")
    expected = [(n, model.embedding_dim) for n in schema.table_sizes()]
    for t, (w, want) in enumerate(zip(tables, expected)):
        if tuple(w.shape) != want:
            raise DataError(f"{path}: table {t} is {list(w.shape)}, the job's model has {list(want)}")
    if len(tables) != len(expected):
        raise DataError(f"{path}: {len(tables)} tables, the job's model has {len(expected)}")
    id_maps, stored = {}, doc.get("dynamic")
    for t in schema.dynamic():
        try:
            id_maps[t] = IdMap.from_doc(stored.get(t) if isinstance(stored, dict) else None, expected[t][0], model.embedding_dim)
        except ValueError as e:  # a final.pt from before dynamic tables were exported has none
            raise DataError(f"{path}: the id map of dynamic table {t} (model.tables.{schema.tables[t].name}): {e}") from None
    return FinalModel(tables, dense, id_maps)


def dense_program(spec: JobSpec, head: DenseHead) -> torch.export.ExportedProgram:
    """The dense part as a ``torch.export`` program (graph and weights), any batch size."""
    batch = torch.export.Dim("batch", min=1)
    example = (torch.zeros(2, spec.schema.dense_width), torch.zeros(2, len(spec.schema.sparse) * spec.model.embedding_dim))
    with torch.no_grad():
        return torch.export.export(head, example, dynamic_shapes=({0: batch}, {0: batch}))


def model_manifest(spec: JobSpec, job_id: str, source_sha: str, table_rows: list[int], files: list[FileDigest], dynamic: list[int]) -> Manifest:
    """The manifest of a model of ``spec``'s layout (an export's, or a published version's)."""
    schema = spec.schema
    return Manifest(
        format=FORMAT, job_id=job_id, source_sha256=source_sha, embedding_dim=spec.model.embedding_dim,
        table_rows=table_rows, dense_features=schema.dense_columns, sparse_features=schema.feature_names,
        dense_transform=dense_transform(schema), hashing=HASHING, score=SCORE, files=files, dynamic_tables=dynamic,
        feature_tables=schema.feature_tables(), mean_features=schema.mean_features(),
        features=spec.features.model_dump(mode="json") if spec.features else None,
        data={"format": spec.data.format, "header": spec.data.header, "delimiter": spec.data.delimiter, "columns": spec.data.columns},
    )  # fmt: skip


def export_run(run_dir: str | Path, out: str | Path) -> Path:
    """Write the model of a finished run to ``out``; returns the manifest's path."""
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: no such run directory")
    final, spec = find_final_model(run_dir)
    source_sha = sha256_of(final)
    written = [e.fields.get("sha256") for _, e in read_events(run_dir / "events.jsonl") if e.kind == "model_saved"]  # one a run
    if written and written[-1] != source_sha:
        raise DataError(f"{final}: its sha256 is not the one the job wrote (events.jsonl, model_saved): truncated or changed since")
    schema = spec.schema
    final_model = load_final(final, spec.model, schema)
    maps = final_model.id_maps
    # a dynamic table's default row is its last row: an id outside the map reads it
    tables = [torch.cat([w, maps[t].default[None].to(w.dtype)]) if t in maps else w for t, w in enumerate(final_model.tables)]
    try:
        head = DenseHead(spec.model, schema, final_model.dense).eval()
    except ValueError as e:
        raise DataError(f"{final}: {e}") from None
    out_dir(str(out))
    program = dense_program(spec, head)
    written = []
    files = [(DENSE_FILE, lambda p: torch.export.save(program, p)), (TABLES_FILE, lambda p: torch.save(tables, p))]
    if maps:
        files.append((ID_MAPS_FILE, lambda p: torch.save([[maps[t].ids, maps[t].rows] for t in sorted(maps)], p)))
    for name, save in files:
        tmp = out / f".tmp-{name}"  # the same extension: torch.export.save checks it
        save(str(tmp))
        os.replace(tmp, out / name)
        written.append(FileDigest.of(out / name))
    manifest = model_manifest(spec, run_dir.resolve().name, source_sha, [len(w) for w in tables], written, sorted(maps))
    manifest.write(out)
    return out / MANIFEST
