"""Criteo preprocessed by TorchRec's own ``BinaryCriteoUtils.tsv_to_npys``, and MLPerf
DLRM-DCNv2's multi-hot days made from it (``dlrover data multihot``): read by memory map,
trained on real actors with every id once, and scored by the export as by the model."""

from __future__ import annotations

import numpy as np
import pytest
from torchrec.datasets.criteo import BinaryCriteoUtils

from dlrover.bench.baseline import train_local
from dlrover.cli.main import main
from dlrover.data.criteo import index_file
from dlrover.data.reader import FileReader, data_files
from dlrover.data.tsv import read_whole_tsv
from dlrover.errors import DataError
from dlrover.spec import spec_from_dict

BAGS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # MLPerf's: 214 ids a sample


@pytest.fixture(scope="module")
def npy_dir(synth_dir_large, tmp_path_factory):
    """The suite's synthetic Criteo TSV (120k rows), one day per file, as TorchRec writes it."""
    out = tmp_path_factory.mktemp("npy")
    for i, tsv in enumerate(sorted(synth_dir_large.glob("*.tsv"))):
        BinaryCriteoUtils.tsv_to_npys(str(tsv), str(out / f"day_{i}_dense.npy"), str(out / f"day_{i}_sparse.npy"), str(out / f"day_{i}_labels.npy"))
    return out


def _spec(path, **over):
    doc = {
        "name": "npy", "model": {"embedding_dim": 8, "num_embeddings": 5000, "dense_arch": [32, 8], "over_arch": [64, 32, 1]},
        "data": {"paths": [str(path)], "format": "torchrec_npy", "epochs": 1, "batch_size": 1024, "eval_fraction": 0.1, "shard_rows": 4096},
        "resources": {"workers": 2, "ps": 2, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 2048, "ps_memory_mb": 1024},
    }  # fmt: skip
    doc.update(over)
    return spec_from_dict(doc)


def test_a_day_reads_the_rows_of_the_tsv_it_was_made_from(npy_dir, synth_dir_large):
    layout = _spec(npy_dir).layout()
    days = data_files([str(npy_dir)], layout)
    assert [d.rsplit("/", 1)[1] for d in days] == ["day_0", "day_1"]
    idx = index_file(days[0], layout=layout)
    batch, bad = FileReader(layout=layout).read(idx, 100, 612)
    raw, _, _ = read_whole_tsv(str(sorted(synth_dir_large.glob("*.tsv"))[0]), "fail")
    assert bad == 0 and batch.lengths is None
    np.testing.assert_array_equal(batch.sparse, raw.sparse[100:612])
    np.testing.assert_array_equal(batch.labels, raw.labels[100:612])
    # TorchRec's transform (log(x - min + 2)), kept as it is: the npy default is transform none
    np.testing.assert_allclose(batch.dense, np.log(raw.dense[100:612] - raw.dense.min() + 2), rtol=1e-6)


def test_multihot_days_hold_mlperfs_bags(npy_dir, tmp_path):
    out = tmp_path / "mh"
    sizes = ",".join(map(str, BAGS))
    assert main(["data", "multihot", "--in", str(npy_dir), "--out", str(out), "--bag-sizes", sizes, "--num-embeddings", ",".join(["1000"] * 26)]) == 0
    layout = _spec(out).layout()
    days = data_files([str(out)], layout)
    batch, _ = FileReader(layout=layout).read(index_file(days[0], layout=layout), 0, 50)
    assert batch.lengths.tolist() == [[b] * 50 for b in BAGS] and batch.num_ids == 214 * 50
    assert (batch.sparse >= 0).all() and (batch.sparse < 1000).all()
    one_hot = np.load(npy_dir / "day_0_sparse.npy")[:50]
    first = np.split(batch.sparse, np.cumsum([b * 50 for b in BAGS])[:-1])
    for j, ids in enumerate(first):  # each bag starts with the one-hot id (mod the table size)
        np.testing.assert_array_equal(ids.reshape(50, BAGS[j])[:, 0], one_hot[:, j] % 1000)


def test_days_with_different_row_counts_name_the_files(npy_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for part in ("dense", "sparse", "labels"):
        a = np.load(npy_dir / f"day_0_{part}.npy")
        np.save(bad / f"day_0_{part}.npy", a[:-1] if part == "labels" else a)
    with pytest.raises(DataError, match=r"day_0: the day's files hold different row counts \(day_0_labels.npy 59,999, day_0_dense.npy 60,000"):
        index_file(str(bad / "day_0"), layout=_spec(bad).layout())


def test_a_job_on_npy_days_trains_every_id_once_and_exports(ray_local, npy_dir, tmp_path):
    from dlrover.driver.runner import run_job

    spec = _spec(npy_dir, data={**_spec(npy_dir).data.model_dump(), "epochs": 2})
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_trained"] == s["samples_expected"] == 2 * 108_000
    assert s["ps_ids_updated"] == s["ids_expected"] == 26 * 2 * 108_000
    local = train_local(spec, threads=2)  # single-process TorchRec on the same days
    assert s["auc"] > 0.55 and abs(s["auc"] - local.metrics["auc"]) <= 0.01, (s["auc"], local.metrics["auc"])
    assert main(["export", str(path.parent), "--out", str(tmp_path / "model")]) == 0
    assert main(["predict", str(tmp_path / "model"), str(npy_dir), "--out", str(tmp_path / "scores.csv")]) == 0
    scores = np.loadtxt(tmp_path / "scores.csv", delimiter=",", skiprows=1)
    assert scores.shape == (120_000, 2) and 0 < scores[:, 1].min() < scores[:, 1].max() < 1
