"""``dlrover predict MODEL DATA --out SCORES.csv``: score rows with an exported model.

DATA is what ``data.paths`` accepts (a file, a glob or a directory; the layout the job
trained on: its ``features:`` and ``data.format``, ``header``, ``delimiter``, ``columns``,
which the export's manifest carries), read by the training reader with ``on_bad_line:
fail``: every input row gets its line, so a bad row stops the run naming ``file:line``
rather than shifting the scores of the rows after it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from dlrover.data.criteo import FileIndex, index_file
from dlrover.data.layout import CRITEO_LAYOUT, DataLayout
from dlrover.data.reader import FileReader, data_files
from dlrover.data.schema import FeaturesSpec, resolve
from dlrover.errors import DataError
from dlrover.paths import out_dir
from dlrover.serving.model import Manifest, ServedModel


def layout_of(manifest: Manifest) -> DataLayout:
    """How the files the model trained on were laid out, as its manifest says."""
    d = manifest.data
    if manifest.features is None and not d:  # exported before manifests carried the layout
        return CRITEO_LAYOUT
    features = FeaturesSpec.model_validate(manifest.features) if manifest.features is not None else None
    schema = resolve(features, {}, 1, npy=d.get("format") == "torchrec_npy")
    columns = tuple(d["columns"]) if d.get("columns") else None
    return DataLayout(schema, d.get("format", "auto"), d.get("header", True), d.get("delimiter"), columns)

def _labeled_or_not(layout: DataLayout, paths: list[str]) -> tuple[DataLayout, list[FileIndex]]:
    """The files' indexes, and the layout to read them with: the training one where every
    file holds the label column, else the same without it (new rows to score: the output
    then has no label column). Criteo's TSV and ``.npy`` days always carry their labels."""
    if layout.criteo or layout.format == "torchrec_npy":
        return layout, [index_file(p, layout=layout) for p in paths]
    bare = replace(layout, labeled=False)
    indexes = [index_file(p, layout=bare) for p in paths]
    labeled = all(layout.schema.label.column in (idx.columns or []) for idx in indexes)
    return (layout if labeled else bare), indexes


PREDICT_BATCH = 4096
PROGRESS_MIN_ROWS = 100_000  # a bar on stderr from this many rows on


def load_model(model_dir: str | Path, version: int | None = None) -> ServedModel:
    """An exported model directory, or a version of a ``publish.dir`` (default: the newest)."""
    from dlrover.serving.versions import load_version, versions

    if versions(model_dir):
        return load_version(model_dir, version).model
    if version is not None:
        raise DataError(f"--version: {model_dir} holds no published versions (a publish.dir has v00000001/, ...)")
    return ServedModel.load(model_dir)


def predict(model_dir: str | Path, data: str, out: str | Path, batch_size: int = PREDICT_BATCH, version: int | None = None) -> int:
    """Write ``label,score`` (a header, then one line per row of DATA, in file order then
    row order; score = click probability; ``score`` alone where DATA has no label
    column); returns the number of rows scored. ``version``: of a ``publish.dir``. The CSV
    appears only complete: it is written beside ``out`` and renamed at the end."""
    model = load_model(model_dir, version)
    layout = layout_of(model.manifest)
    try:
        paths = data_files([data], layout)
    except DataError as e:  # worded for a spec's field; here DATA is an argument
        raise DataError(str(e).removeprefix("data.paths: ")) from None
    layout, indexes = _labeled_or_not(layout, paths)
    total = sum(idx.rows for idx in indexes)
    reader = FileReader(on_bad_line="fail", layout=layout)
    out = Path(out)
    out_dir(str(out.parent.absolute()))
    tmp = out.with_name(f".{out.name}.tmp")
    done = 0
    try:
        with open(tmp, "w") as f, tqdm(total=total, unit="rows", unit_scale=True, disable=total < PROGRESS_MIN_ROWS, file=sys.stderr) as bar:
            f.write("label,score\n" if layout.labeled else "score\n")
            for idx in indexes:
                for a in range(0, idx.rows, batch_size):
                    batch, _ = reader.read(idx, a, min(idx.rows, a + batch_size))
                    lengths = None if batch.lengths is None else torch.from_numpy(batch.lengths)
                    scores = torch.sigmoid(model.logits(torch.from_numpy(batch.dense), torch.from_numpy(batch.sparse), lengths)).tolist()
                    if layout.labeled:
                        f.write("".join(f"{int(y)},{s:.9g}\n" for y, s in zip(batch.labels.tolist(), scores)))
                    else:
                        f.write("".join(f"{s:.9g}\n" for s in scores))
                    done += len(batch)
                    bar.update(len(batch))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return done
