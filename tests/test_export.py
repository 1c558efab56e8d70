"""``dlrover export`` and ``dlrover predict``: a finished job's model, exported, scores its
held-out rows as the trained model does, loads with torch alone, and refuses bad input
with one line naming the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrover.cli import main


@pytest.fixture(scope="module")
def trained(ray_local, synth_dir, tmp_path_factory):
    """A tiny job (1 worker, 2 PS) that saves its final model, its export, and its
    held-out rows as a TSV file."""
    from conftest import small_spec

    from dlrover.data.plan import DataPlan
    from dlrover.runner import run_job

    tmp = tmp_path_factory.mktemp("export")
    one_file = [str(synth_dir / "part-00000.tsv")]  # 18k rows to train, 2k held out
    spec = small_spec(synth_dir, data__paths=one_file, resources__workers=1, checkpoint__dir=str(tmp / "ckpt"))
    summary, path = run_job(spec, runs_dir=str(tmp / "runs"), progress="none")
    assert summary["status"] == "succeeded"
    plan = DataPlan.build(spec)
    held = []
    for p, train_rows in plan.train_rows.items():
        held += [line for line in Path(p).read_text().splitlines() if line.strip()][train_rows:]
    (tmp / "heldout.tsv").write_text("\n".join(held) + "\n")
    assert main(["export", str(path.parent), "--out", str(tmp / "model")]) == 0
    return {"tmp": tmp, "spec": spec, "summary": summary, "run_dir": path.parent, "model": tmp / "model", "heldout": tmp / "heldout.tsv"}


def predict_csv(model: Path, data: Path, out: Path) -> tuple[np.ndarray, np.ndarray]:
    assert main(["predict", str(model), str(data), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "label,score"
    rows = np.array([[float(x) for x in line.split(",")] for line in lines[1:]]).reshape(-1, 2)
    return rows[:, 0], rows[:, 1]


def trained_model_logits(trained: dict, data: Path) -> tuple[np.ndarray, np.ndarray]:
    """Labels and logits of ``data`` from the job's ``final.pt`` put back into TorchRec's
    DLRM (the worker's model, with local tables for the PS), read as the workers read."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dlrover.baseline import hashed
    from dlrover.data.criteo import index_file
    from dlrover.data.reader import FileReader
    from dlrover.model.dlrm import build_dense_dlrm, dense_parameters, make_kjt, table_configs

    spec = trained["spec"]
    final = torch.load(Path(spec.checkpoint.dir) / trained["summary"]["job_id"] / "final.pt", weights_only=True)
    configs = table_configs(spec.model)
    ebc = EmbeddingBagCollection(tables=configs)
    for cfg, w in zip(configs, final["tables"]):
        ebc.embedding_bags[cfg.name].weight.data.copy_(w)
    model = build_dense_dlrm(spec.model, ebc, spec.seed).eval()
    torch.nn.utils.vector_to_parameters(final["dense"], dense_parameters(model))
    sizes = np.array(spec.model.table_sizes(), dtype=np.int64)
    idx, reader = index_file(str(data)), FileReader()
    labels, logits = [], []
    with torch.no_grad():
        for a in range(0, idx.rows, spec.data.batch_size):
            batch, _ = reader.read(idx, a, min(idx.rows, a + spec.data.batch_size))
            logits.append(model(torch.from_numpy(batch.dense), make_kjt(hashed(batch, sizes))).squeeze(-1).numpy())
            labels.append(batch.labels)
    return np.concatenate(labels), np.concatenate(logits)


def test_the_exported_model_scores_the_held_out_rows_exactly_as_the_trained_model_does(trained):
    from dlrover.metrics.evaluation import evaluate_scores

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
    from dlrover.serving import Manifest, sha256_of

    m = Manifest.read(trained["model"])
    assert sorted(f.name for f in m.files) == ["dense.pt2", "tables.pt"]
    assert all(sha256_of(trained["model"] / f.name) == f.sha256 for f in m.files)
    final = Path(trained["spec"].checkpoint.dir) / m.job_id / "final.pt"
    assert m.source_sha256 == sha256_of(final)
    assert m.table_rows == [5000] * 26 and m.embedding_dim == 8 and m.job_id == trained["summary"]["job_id"]


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
pooled = torch.cat([t[rows[:, i]] for i, t in enumerate(tables)], dim=1)
torch.save({"x": x, "ids": ids, "scores": torch.sigmoid(dense(x, pooled))}, sys.argv[2])
"""


def test_the_exported_model_loads_and_scores_with_torch_alone(trained):
    from dlrover.serving import ServedModel

    out = trained["tmp"] / "alone.pt"
    subprocess.run([sys.executable, "-c", LOAD_WITH_TORCH_ALONE, str(trained["model"]), str(out)], check=True, capture_output=True)
    got = torch.load(out, weights_only=True)
    want = torch.sigmoid(ServedModel.load(trained["model"]).logits(got["x"], got["ids"]))
    assert torch.equal(got["scores"], want)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_export_of_a_run_without_a_checkpoint_dir_names_spec_json_and_the_setting(tmp_path, synth_dir, capsys):
    from conftest import small_spec

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    (run / "spec.json").write_text(small_spec(synth_dir).model_dump_json())
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    line = one_error_line(capsys)
    assert f"{run / 'spec.json'}: checkpoint.dir is not set" in line
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "m")]) == 2
    assert f"{tmp_path / 'nope'}: no such run directory" in one_error_line(capsys)


def test_export_refuses_a_job_with_a_dynamic_table_whose_id_map_final_pt_lacks(tmp_path, synth_dir, capsys):
    from conftest import small_spec

    run = tmp_path / "runs" / "t-1"
    run.mkdir(parents=True)
    spec = small_spec(synth_dir, checkpoint__dir=str(tmp_path / "ckpt"), model__tables={3: {"kind": "dynamic", "capacity_rows": 100}})
    (run / "spec.json").write_text(spec.model_dump_json())
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 2
    assert f"{run / 'spec.json'}: model.tables.3: kind dynamic: export supports hashed tables only" in one_error_line(capsys)


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


def test_predict_names_file_and_line_of_a_bad_data_row_and_writes_no_scores(trained, tmp_path, capsys):
    lines = trained["heldout"].read_text().splitlines()
    lines[2] = lines[2].replace("\t", " ", 3)  # too few fields
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines[:10]) + "\n")
    assert main(["predict", str(trained["model"]), str(bad), "--out", str(tmp_path / "s.csv")]) == 2
    assert one_error_line(capsys).startswith(f"error: {bad}:3: ")
    assert not (tmp_path / "s.csv").exists() and list(tmp_path.glob(".s.csv*")) == []
