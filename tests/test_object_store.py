"""``data.paths`` as ``s3://`` URLs, against a real S3 API: moto's server on loopback,
started by this module and stopped at its end. The server records every request it
serves (moto's recorder), so the tests see the byte ranges a shard's read asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from conftest import small_spec
from dlrover.data.batch import Batch
from dlrover.data.criteo import REMOTE_STRIDE, FileIndex, index_file
from dlrover.data.plan import DataPlan
from dlrover.data.reader import FileReader
from dlrover.data.synth import SynthConfig, generate
from dlrover.errors import DataError, SpecError
from dlrover.driver.localhead import free_port
from dlrover.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "dlrover-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
ENV = {**os.environ, **CREDENTIALS, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR", "RAY_IGNORE_UNHANDLED_ERRORS": "1"}


@dataclass(frozen=True)
class Seen:
    """One request the server answered: method, object key, and the bytes asked for
    (``[start, stop)``; None for a request without a Range header)."""

    method: str
    key: str
    range: tuple[int, int] | None


@dataclass
class S3:
    """The server: its endpoint, the local copies of what was uploaded, and its recorder."""

    endpoint: str
    local: Path

    def _recorder(self, action: str) -> bytes:
        method = "GET" if action == "download-recording" else "POST"
        req = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}", method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    def record(self) -> None:
        self._recorder("reset-recording")
        self._recorder("start-recording")

    def seen(self) -> list[Seen]:
        """Requests since :meth:`record`."""
        self._recorder("stop-recording")
        out = []
        for line in self._recorder("download-recording").decode().splitlines():
            if line.strip():
                entry = json.loads(line)
                key = entry["url"].split("?")[0].split(f"/{BUCKET}/", 1)[-1]
                rng = entry["headers"].get("Range")
                if rng:
                    a, b = rng.removeprefix("bytes=").split("-")
                    rng = (int(a), int(b) + 1)
                out.append(Seen(entry["method"], key, rng))
        return out


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 holding 2 TSV files (5000 rows each) under ``tsv/``
    and a Parquet copy of the first one (row groups of 700 rows) under ``pq/``."""
    import fsspec
    import pyarrow.parquet as pq

    from dlrover.data.parquet import tsv_to_parquet

    tmp = tmp_path_factory.mktemp("s3")
    local = tmp / "data"
    generate(str(local), SynthConfig(rows=10_000, files=2, seed=11), progress=False)
    tsv_to_parquet(str(local / "part-00000.tsv"), str(tmp / "whole.parquet"))
    pq.write_table(pq.read_table(tmp / "whole.parquet"), local / "part-00000.parquet", row_group_size=700)

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**ENV, "MOTO_RECORDER_FILEPATH": str(tmp / "recording.jsonl")}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.2)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in CREDENTIALS.items():
                mp.setenv(k, v)
            mp.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
            fs = fsspec.filesystem("s3")
            fs.mkdir(BUCKET)
            for name in ("part-00000.tsv", "part-00001.tsv"):
                fs.put_file(str(local / name), f"{BUCKET}/tsv/{name}")
            fs.put_file(str(local / "part-00000.parquet"), f"{BUCKET}/pq/part-00000.parquet")
            yield S3(endpoint, local)
    finally:
        server.terminate()
        server.wait(timeout=30)


def by_name(plan: DataPlan) -> dict[str, tuple[FileIndex, int]]:
    """A plan's files by base name: (index with the path left out, training rows)."""
    return {os.path.basename(p): (replace(idx, path=""), plan.train_rows[p]) for p, idx in plan.files.items()}


def reindexed(plan: DataPlan, stride: int) -> DataPlan:
    """The plan with its files indexed with seek points every ``stride`` rows."""
    return DataPlan({p: index_file(p, stride) for p in plan.files}, plan.train_rows)


def shards(plan: DataPlan, spec) -> list[tuple[str, int, int]]:
    q = plan.shard_queue(spec)
    return [(os.path.basename(s.path), s.start, s.stop) for s in map(q.shard, range(q.total_shards))]


def assert_same_rows(a: Batch, b: Batch) -> None:
    import numpy as np

    assert len(a) == len(b)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.sparse, b.sparse)


def test_plan_over_s3_has_the_shards_and_rows_of_the_local_files(s3):
    local = small_spec(s3.local, data__shard_rows=700)
    remote = small_spec(f"s3://{BUCKET}/tsv", data__shard_rows=700)
    plan_l, plan_r = DataPlan.build(local), DataPlan.build(remote)
    assert list(plan_r.files) == [f"s3://{BUCKET}/tsv/part-0000{i}.tsv" for i in range(2)]
    # the same rows and seek points (a URL's are denser: a read fetches from one)
    assert plan_r.files[f"s3://{BUCKET}/tsv/part-00000.tsv"].stride == REMOTE_STRIDE
    assert by_name(plan_r) == by_name(reindexed(plan_l, REMOTE_STRIDE))
    assert sum(idx.rows for idx in plan_r.files.values()) == 10_000
    assert shards(plan_r, remote) == shards(plan_l, local)
    assert [(os.path.basename(p), a, b) for p, a, b in plan_r.eval_ranges(700)] == [
        (os.path.basename(p), a, b) for p, a, b in plan_l.eval_ranges(700)
    ]
    # file:// URLs are local paths: the very same plan
    as_url = DataPlan.build(small_spec(f"file://{s3.local}", data__shard_rows=700))
    assert as_url.files == plan_l.files and as_url.train_rows == plan_l.train_rows


def test_a_shard_read_from_s3_is_one_byte_range_with_the_local_rows(s3):
    url = f"s3://{BUCKET}/tsv/part-00001.tsv"
    plan = DataPlan.build(small_spec(f"s3://{BUCKET}/tsv"))
    index = plan.files[url]
    local = DataPlan.build(small_spec(s3.local)).files[str(s3.local / "part-00001.tsv")]
    size = (s3.local / "part-00001.tsv").stat().st_size
    start, stop = 2100, 2400  # a shard in the middle, 6% of the file
    s3.record()
    batch, bad = FileReader().read(index, start, stop)
    seen = [r for r in s3.seen() if r.key == "tsv/part-00001.tsv"]
    assert bad == 0
    assert_same_rows(batch, FileReader().read(local, start, stop)[0])
    assert [r.method for r in seen] == ["GET"] and seen[0].range is not None, seen
    a, b = seen[0].range
    assert a == index.offsets[start // index.stride] and b - a < size / 4, (a, b, size)


def test_parquet_on_s3_row_groups_are_the_shards_and_reads_fetch_only_them(s3):
    url = f"s3://{BUCKET}/pq/part-00000.parquet"
    spec = small_spec(f"s3://{BUCKET}/pq", data__paths=[url], data__shard_rows=100_000, data__eval_fraction=0.0)
    plan = DataPlan.build(spec)
    index = plan.files[url]
    assert index.fmt == "parquet" and index.rows == 5000 and index.groups == [700] * 7 + [100]
    bounds = [(0, 700), (700, 1400), (1400, 2100), (2100, 2800), (2800, 3500), (3500, 4200), (4200, 4900), (4900, 5000)]
    assert shards(plan, spec) == [("part-00000.parquet", a, b) for a, b in bounds]
    # smaller shards never span a row group either: each read fetches one
    small = spec.model_copy(update={"data": spec.data.model_copy(update={"shard_rows": 300})})
    assert all(any(lo <= a and b <= hi for lo, hi in bounds) for _, a, b in shards(plan, small))
    # rows equal the TSV they were converted from, and a shard's read fetches byte ranges only
    tsv = DataPlan.build(small_spec(s3.local)).files[str(s3.local / "part-00000.tsv")]
    size = (s3.local / "part-00000.parquet").stat().st_size
    reader, local = FileReader(), FileReader()
    s3.record()
    batch, bad = reader.read(index, 2100, 2800)
    seen = [r for r in s3.seen() if r.key == "pq/part-00000.parquet" and r.method == "GET"]
    assert bad == 0
    assert_same_rows(batch, local.read(tsv, 2100, 2800)[0])
    assert seen and all(r.range is not None for r in seen), seen
    assert sum(b - a for a, b in {r.range for r in seen}) < size / 2, (seen, size)
    for a, b in [(0, 5000), (650, 1450), (4999, 5000)]:
        assert_same_rows(reader.read(index, a, b)[0], local.read(tsv, a, b)[0])


def dlrover_run(spec: Path, runs: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dlrover", "run", str(spec), "--runs-dir", str(runs), "--quiet"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_job_on_s3_data_trains_every_row_once(s3, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"data: {{paths: ['s3://{BUCKET}/tsv/*.tsv', 's3://{BUCKET}/pq/'], batch_size: 500, shard_rows: 1000, eval_fraction: 0.1}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        "resources: {workers: 2, ps: 1}\n"
    )
    proc = dlrover_run(spec, tmp_path / "runs", {**ENV, "FSSPEC_S3_ENDPOINT_URL": s3.endpoint})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(Path(proc.stdout.strip().splitlines()[-1].removeprefix("summary: ")).read_text())
    rows = 3 * (5000 - 500)  # three files, 10% of each held out
    assert summary["status"] == "succeeded"
    assert summary["samples_expected"] == summary["samples_trained"] == rows
    assert summary["samples_lost"] == 0


def test_a_job_following_an_s3_prefix_trains_each_file_put_there_once(s3, tmp_path):
    """Files put under ``stream/`` while the job starts and trains, each complete once its
    listing holds still: every row trained once, and the job ends at ``until`` rows."""
    import fsspec

    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"data: {{paths: ['s3://{BUCKET}/stream/'], batch_size: 500, shard_rows: 1000, eval_fraction: 0.1, follow: {{poll_s: 0.5, until: 15000}}}}\n"
        "model: {embedding_dim: 8, num_embeddings: 1000, dense_arch: [16, 8], over_arch: [16, 1]}\n"
        "resources: {workers: 2, ps: 1}\n"
    )
    env = {**ENV, "FSSPEC_S3_ENDPOINT_URL": s3.endpoint}
    cmd = [sys.executable, "-m", "dlrover", "run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fs = fsspec.filesystem("s3", endpoint_url=s3.endpoint, key=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        for name in ("part-00000.tsv", "part-00001.tsv", "part-00000.parquet"):
            fs.put_file(str(s3.local / name), f"{BUCKET}/stream/{name}")
            time.sleep(4)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(Path(out.strip().splitlines()[-1].removeprefix("summary: ")).read_text())
    rows = 3 * (5000 - 500)
    assert summary["status"] == "succeeded" and summary["samples_expected"] == summary["samples_trained"] == rows
    assert summary["ps_ids_updated"] == summary["ids_expected"] == 26 * rows


def test_urls_matching_nothing_or_of_unknown_scheme_are_errors_naming_data_paths(s3):
    with pytest.raises(DataError, match=rf"^data\.paths: s3://{BUCKET}/nothing-\*\.tsv: matches no data files$"):
        DataPlan.build(small_spec(f"s3://{BUCKET}", data__paths=[f"s3://{BUCKET}/nothing-*.tsv"]))
    with pytest.raises(DataError, match=r"^data\.paths: s3://no-such-bucket/x\.tsv: bucket 'no-such-bucket' does not exist \(or these credentials cannot see it\)$"):
        DataPlan.build(small_spec(f"s3://{BUCKET}", data__paths=["s3://no-such-bucket/x.tsv"]))
    with pytest.raises(SpecError, match=r"^job\.yaml: data\.paths: foo://bucket/x\.tsv: unknown storage scheme 'foo'"):
        spec_from_dict({"data": {"paths": ["foo://bucket/x.tsv"]}}, "job.yaml")


def test_unreachable_store_is_one_line_error_naming_data_paths(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(f"data: {{paths: ['s3://{BUCKET}/tsv/*.tsv']}}\n")
    runs = tmp_path / "runs"
    runs.mkdir()
    nobody = f"http://127.0.0.1:{free_port()}"
    proc = dlrover_run(spec, runs, {**ENV, "FSSPEC_S3_ENDPOINT_URL": nobody, "AWS_MAX_ATTEMPTS": "1"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: data.paths: s3://{BUCKET}/tsv/*.tsv: EndpointConnectionError: Could not connect"), lines
    assert list(runs.iterdir()) == []
