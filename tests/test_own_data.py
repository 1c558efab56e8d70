"""A user's own data on real actors: a CSV click log with a header and 22 string-id
columns (no dense column), and Parquet with a variable-length ``list<int64>`` column
pooled by mean. Each job trains every row's ids exactly once, reaches the AUC of a
single-process TorchRec model of the same schema, and its export scores as it does; so
does the Parquet schema under DLRM_DCN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrover.bench.baseline import train_local
from dlrover.data.synth_schema import SchemaSynthConfig, generate_for_schema
from dlrover.driver.runner import run_job
from dlrover.spec import spec_from_dict

AVAZU_LIKE = {"label": "click", "sparse": [f"c{i:02d}" for i in range(22)]}
WATCHES = {
    "label": {"column": "rating", "threshold": 4},
    "dense": ["watch_s", "age_days"],
    "sparse": [{"column": "user", "ids": "int"}, {"column": "history", "max_len": 12}, "country"],
}
SMALL = {"embedding_dim": 8, "num_embeddings": 4000, "dense_arch": [32, 8], "over_arch": [64, 32, 1]}


def _spec(data_dir, features, paths, tables=None, **data):
    return spec_from_dict({
        "name": "own", "features": features, "model": {**SMALL, "tables": tables or {}},
        "data": {"paths": [f"{data_dir}/{paths}"], "epochs": 2, "batch_size": 512, "eval_fraction": 0.1, "shard_rows": 4096, **data},
        "resources": {"workers": 2, "ps": 2, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 2048, "ps_memory_mb": 1024},
    })  # fmt: skip


def _trained(spec, fmt, tmp):
    generate_for_schema(str(tmp / "data"), spec.layout(), SchemaSynthConfig(rows=50_000, files=2, seed=7), fmt)
    summary, path = run_job(spec, runs_dir=str(tmp / "runs"), progress="none")
    return {"spec": spec, "summary": summary, "run": path.parent, "tmp": tmp}


@pytest.fixture(scope="module")
def csv_job(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own_csv")
    return _trained(_spec(tmp / "data", AVAZU_LIKE, "*.csv"), "csv", tmp)


@pytest.fixture(scope="module")
def parquet_job(ray_local, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own_parquet")
    spec = _spec(tmp / "data", WATCHES, "*.parquet", tables={"history": {"pooling": "mean"}})
    return _trained(spec, "parquet", tmp)


@pytest.fixture(scope="module")
def dcn_job(ray_local, tmp_path_factory):
    """The Parquet schema under TorchRec's DLRM_DCN (a low-rank cross network)."""
    tmp = tmp_path_factory.mktemp("own_dcn")
    spec = _spec(tmp / "data", WATCHES, "*.parquet", tables={"history": {"pooling": "mean"}})
    model = {**spec.model.model_dump(), "arch": "dcn", "dcn": {"num_layers": 2, "low_rank_dim": 4}, "over_arch": [32, 1]}
    return _trained(spec_from_dict({**spec.model_dump(mode="json", exclude_unset=True), "model": model}), "parquet", tmp)


@pytest.mark.parametrize("job", ["csv_job", "parquet_job", "dcn_job"])
def test_every_id_of_every_row_is_trained_exactly_once(job, request):
    s = request.getfixturevalue(job)["summary"]
    assert s["status"] == "succeeded" and s["samples_trained"] == s["samples_expected"] == 2 * 45_000
    assert s["ps_ids_updated"] == s["ids_expected"] > 0, (s["ps_ids_updated"], s["ids_expected"])


def test_a_variable_length_bag_is_really_variable(parquet_job):
    s = parquet_job["summary"]
    # 3 features; the history holds 0..12 ids: more ids than bags, and empty bags push nothing
    assert s["ids_expected"] > s["ps_bags_updated"] and s["ids_expected"] != 3 * s["samples_expected"]


@pytest.mark.parametrize("job", ["csv_job", "parquet_job"])
def test_auc_matches_single_process_torchrec_of_the_same_schema(job, request):
    trained = request.getfixturevalue(job)
    spec, s = trained["spec"], trained["summary"]
    local = train_local(spec, threads=2)
    assert local.samples == s["samples_expected"]
    assert s["auc"] > 0.6, s
    assert abs(s["auc"] - local.metrics["auc"]) <= 0.01, (s["auc"], local.metrics["auc"])


@pytest.mark.parametrize("job", ["csv_job", "parquet_job", "dcn_job"])
def test_the_exported_model_scores_as_the_trained_model(job, request):
    """``dlrover export`` of the run (its model is in the run directory: no checkpoint.dir
    needed), then ``dlrover predict`` of the held-out file: equal to the trained model's
    scores, computed by a TorchRec DLRM holding final.pt's weights."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dlrover.bench.baseline import local_kjt
    from dlrover.cli.main import main
    from dlrover.data.criteo import index_file
    from dlrover.data.reader import FileReader
    from dlrover.model.dlrm import build_dense_dlrm, dense_parameters, table_configs

    trained = request.getfixturevalue(job)
    spec, tmp = trained["spec"], trained["tmp"]
    assert main(["export", str(trained["run"]), "--out", str(tmp / "model")]) == 0
    data = sorted((tmp / "data").glob("part-*"))[-1]
    assert main(["predict", str(tmp / "model"), str(data), "--out", str(tmp / "scores.csv")]) == 0
    got = np.loadtxt(tmp / "scores.csv", delimiter=",", skiprows=1)

    final = torch.load(trained["run"] / "final.pt", weights_only=True)
    ebc = EmbeddingBagCollection(tables=table_configs(spec.model, spec.schema))
    for cfg, w in zip(table_configs(spec.model, spec.schema), final["tables"]):
        ebc.embedding_bags[cfg.name].weight.data.copy_(w)
    model = build_dense_dlrm(spec.model, ebc, spec.seed, spec.schema).eval()
    torch.nn.utils.vector_to_parameters(final["dense"], dense_parameters(model))
    idx = index_file(str(data), layout=spec.layout())
    batch, _ = FileReader(layout=spec.layout()).read(idx, 0, idx.rows)
    with torch.no_grad():
        want = torch.sigmoid(model(torch.from_numpy(batch.dense), local_kjt(batch, spec.schema)).squeeze(-1)).numpy()
    assert got.shape == (idx.rows, 2) and (got[:, 0] == batch.labels).all()
    np.testing.assert_allclose(got[:, 1], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("job", ["csv_job", "parquet_job"])
def test_rows_without_the_label_column_are_scored_alike(job, request):
    """New rows to score hold no label: predict writes one score a row, the same scores."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from dlrover.cli.main import main

    trained = request.getfixturevalue(job)
    spec, tmp = trained["spec"], trained["tmp"]
    model = tmp / "model-unlabeled"
    assert main(["export", str(trained["run"]), "--out", str(model)]) == 0
    data = sorted((tmp / "data").glob("part-*"))[-1]
    label = spec.schema.label.column
    bare = tmp / f"unlabeled{data.suffix}"
    if data.suffix == ".parquet":
        pq.write_table(pq.read_table(data).drop_columns([label]), bare)
    else:
        pacsv.write_csv(pacsv.read_csv(data).drop_columns([label]), bare)
    assert main(["predict", str(model), str(data), "--out", str(tmp / "with.csv")]) == 0
    assert main(["predict", str(model), str(bare), "--out", str(tmp / "without.csv")]) == 0
    assert (tmp / "without.csv").read_text().splitlines()[0] == "score"
    with_label = np.loadtxt(tmp / "with.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(np.loadtxt(tmp / "without.csv", skiprows=1), with_label[:, 1])
