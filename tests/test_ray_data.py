"""Training from a ``ray.data.Dataset`` (``data.source: ray_data``) with real actors.

The big job runs in a Ray of its own (``tests/ray_data_job.py``), its object store capped
below the Dataset's size and its spilling watched: a ``read_parquet -> map_batches``
pipeline trains every row once per epoch through a SIGKILLed worker and a live scale-out,
with nothing written to disk. Bad input is one line, before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ray_data_pipeline
from ray_data_pipeline import FEATURES, MODEL, click_log, without_tags, write_click_log

HERE = Path(__file__).resolve().parent
STORE_MB = 80  # Ray's least is 75 MiB
ROWS, EPOCHS = 160_000, 2


def ids_in(paths: list[str]) -> int:
    """The ids one epoch of the log carries after preprocessing, counted from the files:
    a site and an app a row, and its tags up to ``max_len`` 4."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tables = [pq.read_table(p, columns=["tags"]) for p in paths]
    lengths = np.concatenate([pc.list_value_length(t.column("tags")).to_numpy(zero_copy_only=False) for t in tables])
    return int(2 * len(lengths) + np.minimum(lengths, 4).sum())


def by_value(module) -> None:
    """A dataset given to run_job carries its functions; ones of a module Ray's workers
    cannot import must travel by value (functions of ``__main__`` always do)."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(module)


def stream_spec(**data):
    from dlrover.spec import spec_from_dict

    return spec_from_dict({
        "name": "rd", "features": FEATURES, "model": MODEL,
        "data": {"source": "ray_data", "batch_size": 1024, "shard_rows": 4096, **data},
        "resources": {"workers": 2, "ps": 2, "worker_memory_mb": 2048, "ps_memory_mb": 1024},
    })  # fmt: skip


@pytest.mark.ray
def test_a_pipeline_bigger_than_the_store_trains_every_row_once_through_a_worker_kill_and_a_scale_out(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ray_data_pipeline import preprocess

    paths = write_click_log(str(tmp_path / "log"), ROWS, files=4)
    size = preprocess(pa.concat_tables([pq.read_table(p) for p in paths])).nbytes
    assert size > STORE_MB << 20  # the Dataset does not fit in the store
    spill = tmp_path / "spill"
    spill.mkdir()
    cmd = [sys.executable, str(HERE / "ray_data_job.py"), "--data", str(tmp_path / "log"), "--runs", str(tmp_path / "runs"), "--spill", str(spill),
           "--store-mb", str(STORE_MB), "--epochs", str(EPOCHS), "--kill-after", str(ROWS // 2), "--scale-out", "--out", str(tmp_path / "result.json")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    s = r["summary"]
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["samples_replayed"] == 0
    assert s["samples_expected"] == s["samples_trained"] == ROWS * EPOCHS
    assert s["ps_ids_updated"] == s["ids_expected"] == ids_in(paths) * EPOCHS  # each id applied exactly once
    (death,) = [f for f in s["failures"] if f["kind"] == "worker_death"]
    assert r["killed_pid"] and death["actor"].endswith("worker-0") and death["replacement"]
    (out_event,) = [e for e in s["scale_events"] if e["kind"] == "scale_out"]
    assert out_event["vshards_moved"] > 0 and (s["final_config"]["workers"], s["final_config"]["ps"]) == (3, 3)
    # Each epoch streamed once, whole: the dead worker's rows came from the blocks it left pinned.
    assert [(e["epoch"], e["rows"]) for e in r["epochs_streamed"]] == [(e, ROWS) for e in range(EPOCHS)]
    assert (r["spilled_bytes"], r["spill_files"], r["fallback_bytes"]) == (0, 0, 0)  # nothing reached the disk


@pytest.mark.ray
def test_a_dataset_given_to_dlrover_run_trains_a_files_spec_from_the_dataset(ray_local, tmp_path, monkeypatch):
    import dlrover
    from dlrover.spec import spec_from_dict

    paths = write_click_log(str(tmp_path / "log"), 20_000, files=2)
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "log"))
    by_value(ray_data_pipeline)  # Ray's workers cannot import the tests' modules
    spec = spec_from_dict({"name": "rd", "features": FEATURES, "model": MODEL, "data": {"paths": ["unused/*.parquet"], "eval_fraction": 0.1, "shard_rows": 4096},
                           "resources": {"workers": 2, "ps": 1, "worker_memory_mb": 2048, "ps_memory_mb": 1024}})  # fmt: skip
    r = dlrover.run(spec, runs_dir=tmp_path / "runs", progress="none", dataset=click_log())
    assert r.status == "succeeded" and r.samples_trained == r.samples_expected == 20_000
    assert r.ps_ids_updated == r.ids_expected == ids_in(paths)
    assert json.loads((r.run_dir / "spec.json").read_text())["data"]["source"] == "ray_data"


@pytest.mark.ray
def test_a_dataset_missing_a_feature_column_is_one_line_naming_it_and_writes_nothing(ray_local, tmp_path, monkeypatch):
    from dlrover.driver.runner import run_job
    from dlrover.errors import DataError

    write_click_log(str(tmp_path / "log"), 2000, files=1)
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "log"))
    by_value(ray_data_pipeline)
    with pytest.raises(DataError) as e:
        run_job(stream_spec(), runs_dir=str(tmp_path / "runs"), progress="none", dataset=without_tags())
    assert str(e.value).startswith("dataset: no column tags (the features name them); its columns: click, price, d0, ")
    assert "\n" not in str(e.value) and not (tmp_path / "runs").exists()


def test_a_ray_data_spec_naming_a_function_that_does_not_exist_exits_2_in_one_line(tmp_path, capsys, monkeypatch):
    from dlrover.cli.main import main

    spec = tmp_path / "job.yaml"
    spec.write_text(f"features: {json.dumps(FEATURES)}\nmodel: {json.dumps(MODEL)}\ndata: {{source: ray_data, dataset: 'ray_data_pipeline:no_such_log'}}\n")
    monkeypatch.chdir(HERE)
    assert main(["run", str(spec), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: data.dataset: ray_data_pipeline:no_such_log: module ray_data_pipeline has no function no_such_log"]
    assert not (tmp_path / "runs").exists()


def test_a_ray_data_spec_without_a_dataset_function_or_a_dataset_is_one_line(tmp_path):
    from dlrover.driver.runner import run_job
    from dlrover.errors import SpecError

    with pytest.raises(SpecError, match="^data.source: ray_data needs data.dataset"):
        run_job(stream_spec(), runs_dir=str(tmp_path / "runs"), progress="none")


@pytest.mark.ray
def test_the_data_bench_times_ray_data_against_the_file_reader_on_the_same_arrays(ray_local):
    from dlrover.bench.readers import run_data_bench

    r = run_data_bench(rows=3000, repeats=1, shard_rows=1024, formats=["ray_data"])
    (row,) = r["formats"]
    assert row["format"] == "ray_data" and row["rows"] == 3000 and row["ids"] > 3000 * 26
    assert row["dlrover_rows_per_s"] > 0 and row["reference_rows_per_s"] > 0 and row["ratio"] > 0
    assert r["min_ratio"] is None  # of the readers against pandas: none ran


@pytest.mark.ray
def test_the_pipelines_own_error_is_one_line_whichever_block_raises_it(ray_local, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from dlrover.driver.runner import run_job
    from dlrover.errors import DataError

    paths = write_click_log(str(tmp_path / "log"), 8000, files=4)
    bad = pq.read_table(paths[-1])
    pq.write_table(bad.set_column(bad.column_names.index("price_cents"), "price_cents", pc_negative(bad.column("price_cents"))), paths[-1])
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "log"))
    by_value(ray_data_pipeline)
    with pytest.raises(DataError) as e:  # on the driver's first batch, or in the master's stream
        run_job(stream_spec(), runs_dir=str(tmp_path / "runs"), progress="none", dataset=ray_data_pipeline.with_price_check())
    assert str(e.value) == "dataset: ValueError: price must be positive"


def pc_negative(col):
    import pyarrow.compute as pc

    return pc.negate(pc.add(col, 1))
