"""``dlrover export`` and ``dlrover predict``: a finished job's model, exported, scores its
held-out rows as the trained model does, loads with torch alone, and refuses bad input
with one line naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrover.cli.main import main


DYNAMIC = {  # synth_dir's first file: 841, 3727 and 4883 distinct ids in these columns
    0: {"kind": "dynamic", "capacity_rows": 2000, "admit_after": 1},
    3: {"kind": "dynamic", "capacity_rows": 1024, "admit_after": 2, "eviction": "lru"},
    6: {"kind": "dynamic", "capacity_rows": 1500, "admit_after": 1, "eviction": "ttl", "ttl_steps": 5},
}


def train_and_export(synth_dir, tmp: Path, **over) -> dict:
    """A tiny job (1 worker, 2 PS) that saves its final model, its export, and its
    held-out rows as a TSV file."""
    from conftest import small_spec

    from dlrover.data.plan import DataPlan
    from dlrover.driver.runner import run_job

    one_file = [str(synth_dir / "part-00000.tsv")]  # 18k rows to train, 2k held out
    spec = small_spec(synth_dir, data__paths=one_file, resources__workers=1, checkpoint__dir=str(tmp / "ckpt"), **over)
    summary, path = run_job(spec, runs_dir=str(tmp / "runs"), progress="none")
    assert summary["status"] == "succeeded"
    plan = DataPlan.build(spec)
    held = []
    for p, train_rows in plan.train_rows.items():
        held += [line for line in Path(p).read_text().splitlines() if line.strip()][train_rows:]
    (tmp / "heldout.tsv").write_text("\n".join(held) + "\n")
    assert main(["export", str(path.parent), "--out", str(tmp / "model")]) == 0
    return {"tmp": tmp, "spec": spec, "summary": summary, "run_dir": path.parent, "model": tmp / "model", "heldout": tmp / "heldout.tsv"}


@pytest.fixture(scope="module")
def trained(ray_local, synth_dir, tmp_path_factory):
    return train_and_export(synth_dir, tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def trained_dynamic(ray_local, synth_dir, tmp_path_factory):
    """The same with three dynamic tables (lfu, lru and ttl eviction)."""
    return train_and_export(synth_dir, tmp_path_factory.mktemp("export_dynamic"), model__tables=DYNAMIC, train__vshards=8)


def predict_csv(model: Path, data: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    assert main(["predict", str(model), str(data), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "label,score"
    rows = np.array([[float(x) for x in line.split(",")] for line in lines[1:]]).reshape(-1, 2)
    return rows[:, 0], rows[:, 1]


def trained_model_logits(trained: dict, data: Path) -> tuple[np.ndarray, np.ndarray]:
    """Labels and logits of ``data`` from the job's ``final.pt`` put back into TorchRec's
    DLRM (the worker's model, with local tables for the PS), read as the workers read. A
    dynamic table's ids go through its map (a dict here), the others to the default row,
    appended to the table."""
    import dataclasses

    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dlrover.bench.baseline import hashed
    from dlrover.data.criteo import index_file
    from dlrover.data.reader import FileReader
    from dlrover.model.dlrm import build_dense_dlrm, dense_parameters, make_kjt, table_configs

    spec = trained["spec"]
    final = torch.load(Path(spec.checkpoint.dir) / trained["summary"]["job_id"] / "final.pt", weights_only=True)
    maps = final["dynamic"]
    tables = [torch.cat([w, maps[t]["default"][None]]) if t in maps else w for t, w in enumerate(final["tables"])]
    configs = [dataclasses.replace(c, num_embeddings=len(w)) for c, w in zip(table_configs(spec.model), tables)]
    ebc = EmbeddingBagCollection(tables=configs)
    for cfg, w in zip(configs, tables):
        ebc.embedding_bags[cfg.name].weight.data.copy_(w)
    row_of = {t: dict(zip(m["ids"].tolist(), m["rows"].tolist())) for t, m in maps.items()}
    model = build_dense_dlrm(spec.model, ebc, spec.seed).eval()
    torch.nn.utils.vector_to_parameters(final["dense"], dense_parameters(model))
    idx, reader = index_file(str(data)), FileReader()
    labels, logits = [], []
    with torch.no_grad():
        for a in range(0, idx.rows, spec.data.batch_size):
            batch, _ = reader.read(idx, a, min(idx.rows, a + spec.data.batch_size))
            rows = hashed(batch, spec.schema).sparse
            for t, known in row_of.items():
                rows[:, t] = [known.get(x, len(tables[t]) - 1) for x in batch.sparse[:, t].tolist()]
            logits.append(model(torch.from_numpy(batch.dense), make_kjt(rows)).squeeze(-1).numpy())
            labels.append(batch.labels)
    return np.concatenate(labels), np.concatenate(logits)


@pytest.mark.parametrize("job", ["trained", "trained_dynamic"])
def test_the_exported_model_scores_the_held_out_rows_exactly_as_the_trained_model_does(job, request):
    """With dynamic tables too: the PS-served evaluation reads an unadmitted id's default
    row, the export reads the same row through its map."""
    from dlrover.metrics.auc import evaluate_scores

    trained = request.getfixturevalue(job)
    labels, scores = predict_csv(trained["model"], trained["heldout"], trained["tmp"] / "scores.csv")
    want_labels, want_logits = trained_model_logits(trained, trained["heldout"])
    assert len(scores) == trained["summary"]["eval_rows"] == 2000
    assert np.array_equal(labels, want_labels)
    np.testing.assert_allclose(scores, torch.sigmoid(torch.from_numpy(want_logits)).numpy(), rtol=1e-6, atol=1e-7)
    # the job's own final evaluation (its workers, PS-served tables) over the same rows
    metrics = evaluate_scores(labels, scores)
    assert metrics["auc"] == pytest.approx(trained["summary"]["auc"], abs=1e-9)
    assert metrics["logloss"] == pytest.approx(trained["summary"]["logloss"], abs=1e-6)


def test_the_manifest_lists_every_file_with_its_checksum_and_the_final_model_it_came_from(trained):
    from dlrover.serving.model import Manifest, sha256_of

    m = Manifest.read(trained["model"])
    assert sorted(f.name for f in m.files) == ["dense.pt2", "tables.pt"]
    assert all(sha256_of(trained["model"] / f.name) == f.sha256 for f in m.files)
    final = Path(trained["spec"].checkpoint.dir) / m.job_id / "final.pt"
    assert m.source_sha256 == sha256_of(final)
    assert m.table_rows == [5000] * 26 and m.embedding_dim == 8 and m.job_id == trained["summary"]["job_id"]
    assert m.dynamic_tables == []


def test_a_dynamic_table_is_exported_with_its_id_map_and_its_default_row_last(trained_dynamic):
    from dlrover.data.criteo import index_file
    from dlrover.data.reader import FileReader
    from dlrover.serving.model import Manifest, ServedModel

    m = Manifest.read(trained_dynamic["model"])
    assert sorted(f.name for f in m.files) == ["dense.pt2", "id_maps.pt", "tables.pt"]
    assert m.dynamic_tables == [0, 3, 6]
    assert [m.table_rows[t] for t in m.dynamic_tables] == [2001, 1025, 1501] and m.table_rows[1] == 5000
    served = ServedModel.load(trained_dynamic["model"])
    final = torch.load(Path(trained_dynamic["spec"].checkpoint.dir) / m.job_id / "final.pt", weights_only=True)
    held = index_file(str(trained_dynamic["heldout"]))
    ids = torch.from_numpy(FileReader().read(held, 0, held.rows)[0].sparse)
    rows = torch.stack([served.rows(ids[:, t].contiguous(), t) for t in range(ids.shape[1])], dim=1)
    for t in m.dynamic_tables:
        default = m.table_rows[t] - 1
        assert torch.equal(served.tables[t][default], final["dynamic"][t]["default"])
        assert torch.equal(served.tables[t][:default], final["tables"][t])
        assert bool((rows[:, t] != default).any()), t  # held-out ids admitted in training
        if t in (3, 6):  # and, in the tables smaller than their ids, ones not (any more)
            assert bool((rows[:, t] == default).any()), t
        known = dict(zip(final["dynamic"][t]["ids"].tolist(), final["dynamic"][t]["rows"].tolist()))
        assert rows[:, t].tolist() == [known.get(x, default) for x in ids[:, t].tolist()]
    assert len(final["dynamic"][3]["ids"]) <= 1024 and len(set(final["dynamic"][3]["rows"].tolist())) == len(final["dynamic"][3]["rows"])


LOAD_WITH_TORCH_ALONE = """
import json, sys
for name in ("dlrover", "torchrec", "fbgemm_gpu", "ray"):
    sys.modules[name] = None  # importing any of them now fails
import torch
d = sys.argv[1]
m = json.load(open(f"{d}/model.json"))
dense = torch.export.load(f"{d}/dense.pt2").module()
tables = torch.load(f"{d}/tables.pt", weights_only=True)
x, ids = torch.rand(5, 13), torch.randint(0, 2**31, (5, 26))
rows = torch.remainder(ids, torch.tensor(m["table_rows"]))
if m.get("dynamic_tables"):
    for t, (known, at) in zip(m["dynamic_tables"], torch.load(f"{d}/id_maps.pt", weights_only=True)):
        ids[:3, t] = known[:3]  # three admitted ids, two unknown ones
        i = torch.searchsorted(known, ids[:, t]).clamp(max=len(known) - 1)
        rows[:, t] = torch.where(known[i] == ids[:, t], at[i], m["table_rows"][t] - 1)
pooled = torch.cat([t[rows[:, i]] for i, t in enumerate(tables)], dim=1)
with torch.no_grad():
    torch.save({"x": x, "ids": ids, "scores": torch.sigmoid(dense(x, pooled))}, sys.argv[2])
"""


@pytest.mark.parametrize("job", ["trained", "trained_dynamic"])
def test_the_exported_model_loads_and_scores_with_torch_alone(job, request):
    from dlrover.serving.model import ServedModel

    trained = request.getfixturevalue(job)
    out = trained["tmp"] / "alone.pt"
    subprocess.run([sys.executable, "-c", LOAD_WITH_TORCH_ALONE, str(trained["model"]), str(out)], check=True, capture_output=True)
    got = torch.load(out, weights_only=True)
    want = torch.sigmoid(ServedModel.load(trained["model"]).logits(got["x"], got["ids"]))
    # another process may pick other matmul kernels (CI's host did): equal to float32 rounding
    torch.testing.assert_close(got["scores"], want)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_export_of_an_unfinished_run_names_the_final_pt_it_lacks(tmp_path, synth_dir, capsys):
    """Without checkpoint.dir a job leaves its model in its run directory."""
    from conftest import small_spec

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    (run / "spec.json").write_text(small_spec(synth_dir).model_dump_json())
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    line = one_error_line(capsys)
    assert f"{run / 'final.pt'}: no such file (written when job t-1 finishes; did it?)" in line
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "m")]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in one_error_line(capsys)


def test_export_names_the_dynamic_table_whose_id_map_a_final_pt_lacks(tmp_path, synth_dir, capsys):
    from conftest import small_spec

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    spec = small_spec(synth_dir, checkpoint__dir=str(tmp_path / "ckpt"), model__tables={3: {"kind": "dynamic", "capacity_rows": 100}})
    (run / "spec.json").write_text(spec.model_dump_json())
    final = tmp_path / "ckpt" / "t-1" / "final.pt"
    final.parent.mkdir(parents=True)
    tables = [torch.zeros(n, 8) for n in spec.schema.table_sizes()]
    torch.save({"tables": tables, "dense": torch.zeros(3), "job_id": "t-1"}, final)  # as written before maps were
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    assert f"{final}: the id map of dynamic table 3 (model.tables.C4): expected tensors ids, rows and default" in one_error_line(capsys)
    bad = {"ids": torch.tensor([5, 2]), "rows": torch.tensor([0, 1]), "default": torch.zeros(8)}
    torch.save({"tables": tables, "dense": torch.zeros(3), "dynamic": {3: bad}, "job_id": "t-1"}, final)
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    assert "ids must ascend and rows lie in 0..99" in one_error_line(capsys)


def test_export_names_a_missing_final_pt_and_a_final_pt_without_tables(tmp_path, synth_dir, capsys):
    from conftest import small_spec

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    (run / "spec.json").write_text(small_spec(synth_dir, checkpoint__dir=str(tmp_path / "ckpt")).model_dump_json())
    final = tmp_path / "ckpt" / "t-1" / "final.pt"
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    assert f"{final}: no such file" in one_error_line(capsys)
    final.parent.mkdir(parents=True)
    torch.save({"dense": torch.zeros(3), "job_id": "t-1"}, final)
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    assert f"{final}: no 'tables' field" in one_error_line(capsys)


def test_export_of_a_truncated_final_pt_is_one_short_line_naming_the_file(tmp_path, synth_dir, capsys):
    import json

    from conftest import small_spec

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    (run / "spec.json").write_text(small_spec(synth_dir).model_dump_json())
    final = run / "final.pt"
    torch.save({"tables": [torch.zeros(n, 8) for n in small_spec(synth_dir).schema.table_sizes()], "dense": torch.zeros(3)}, final)
    whole = final.read_bytes()
    final.write_bytes(whole[:3000])  # no event log: torch's reader finds the damage
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {final}: not a readable torch file") and len(line) - len(str(final)) < 150 and "miniz" not in line, line
    import hashlib

    (run / "events.jsonl").write_text(json.dumps({"at_s": 9.5, "kind": "model_saved", "path": str(final), "sha256": hashlib.sha256(whole).hexdigest()}) + "\n")
    final.write_bytes(whole[:-10])  # the job recorded what it wrote: the checksum names the damage
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    assert f"{final}: its sha256 is not the one the job wrote" in one_error_line(capsys)
    assert not (tmp_path / "m").exists()


def copy_model(trained: dict, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(trained["model"], tmp_path / "model"))


def test_predict_refuses_a_model_file_whose_checksum_does_not_match(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    raw = bytearray((model / "tables.pt").read_bytes())
    raw[-100] ^= 0xFF
    (model / "tables.pt").write_bytes(bytes(raw))
    assert main(["predict", str(model), str(trained["heldout"]), "--out", str(tmp_path / "s.csv")]) == 2
    assert f"{model / 'tables.pt'}: sha256 does not match" in one_error_line(capsys)
    assert not (tmp_path / "s.csv").exists()


def test_predict_names_a_missing_model_file_or_manifest(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    (model / "dense.pt2").unlink()
    assert main(["predict", str(model), str(trained["heldout"]), "--out", str(tmp_path / "s.csv")]) == 2
    assert f"{model / 'dense.pt2'}: no such file" in one_error_line(capsys)
    (model / "model.json").unlink()
    assert main(["predict", str(model), str(trained["heldout"]), "--out", str(tmp_path / "s.csv")]) == 2
    assert f"{model / 'model.json'}: no such file" in one_error_line(capsys)


def test_predict_names_the_field_of_a_malformed_manifest(trained, tmp_path, capsys):
    model = copy_model(trained, tmp_path)
    doc = json.loads((model / "model.json").read_text())
    for field, value, says in [("table_rows", "26 tables", "table_rows: input should be a valid array"),
                               ("files", [{"name": "tables.pt"}], "files.0.sha256: field required")]:
        (model / "model.json").write_text(json.dumps({**doc, field: value}))
        assert main(["predict", str(model), str(trained["heldout"]), "--out", str(tmp_path / "s.csv")]) == 2
        assert f"{model / 'model.json'}: {says}" in one_error_line(capsys)
    assert not (tmp_path / "s.csv").exists()


def test_predict_names_file_and_line_of_a_bad_data_row_and_writes_no_scores(trained, tmp_path, capsys):
    lines = trained["heldout"].read_text().splitlines()
    lines[2] = lines[2].replace("\t", " ", 3)  # too few fields
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines[:10]) + "\n")
    assert main(["predict", str(trained["model"]), str(bad), "--out", str(tmp_path / "s.csv")]) == 2
    assert one_error_line(capsys).startswith(f"error: {bad}:3: ")
    assert not (tmp_path / "s.csv").exists() and list(tmp_path.glob(".s.csv*")) == []


def test_served_ids_of_a_dynamic_table_read_their_rows_and_all_others_the_default_row(tmp_path, synth_dir):
    """Without a job: a final.pt whose dynamic table 3 admitted ids 7, 2**40 and -5 (the
    raw ids a PS maps), exported and loaded; the other ids, never admitted or evicted,
    read the default row, the hashed tables ``id mod rows``."""
    from conftest import small_spec

    from dlrover.serving.export import DenseHead
    from dlrover.model.dlrm import dense_arches
    from dlrover.serving.model import ServedModel

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    spec = small_spec(synth_dir, checkpoint__dir=str(tmp_path / "ckpt"), model__tables={3: {"kind": "dynamic", "capacity_rows": 100}})
    (run / "spec.json").write_text(spec.model_dump_json())
    gen = torch.Generator().manual_seed(0)
    tables = [torch.rand(n, 8, generator=gen) for n in spec.schema.table_sizes()]
    dense = torch.rand(sum(p.numel() for arch in dense_arches(spec.model, seed=0) for p in arch.parameters()), generator=gen)
    id_map = {"ids": torch.tensor([-5, 7, 2**40]), "rows": torch.tensor([99, 0, 42]), "default": torch.full((8,), 0.5)}
    final = tmp_path / "ckpt" / "t-1" / "final.pt"
    final.parent.mkdir(parents=True)
    torch.save({"tables": tables, "dense": dense, "dynamic": {3: id_map}, "job_id": "t-1"}, final)
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 0
    served = ServedModel.load(tmp_path / "m")
    ids = torch.randint(0, 2**31, (6, 26), generator=gen)
    ids[:, 3] = torch.tensor([7, 2**40, -5, 8, 99, 2**40 + 1])
    rows = torch.stack([served.rows(ids[:, t].contiguous(), t) for t in range(26)], dim=1)
    assert rows[:, 3].tolist() == [0, 42, 99, 100, 100, 100]  # 100: the default row, appended
    assert rows[:, 0].tolist() == (ids[:, 0] % 5000).tolist()
    want = [id_map["default"] if r == 100 else tables[3][r] for r in rows[:, 3].tolist()]
    pooled = torch.stack([torch.cat([torch.stack(want)[b] if t == 3 else tables[t][rows[b, t]] for t in range(26)]) for b in range(6)])
    x = torch.rand(6, 13, generator=gen)
    torch.testing.assert_close(served.logits(x, ids), DenseHead(spec.model, spec.schema, dense).eval()(x, pooled))
