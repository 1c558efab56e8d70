import gzip
import json
import os

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from dlrover.data.batch import Batch
from dlrover.data.criteo import NUM_DENSE, NUM_SPARSE, detect_format, expand_paths, index_file
from dlrover.data.parquet import tsv_to_parquet
from dlrover.data.reader import FileReader
from dlrover.data.synth import Oracle, SynthConfig, best_auc, generate
from dlrover.data.tsv import hex_to_int, parse_tsv_lines
from dlrover.errors import DataError


def make_line(label="1", dense=None, sparse=None) -> str:
    dense = dense if dense is not None else [str(j) for j in range(NUM_DENSE)]
    sparse = sparse if sparse is not None else [f"{j:08x}" for j in range(1, NUM_SPARSE + 1)]
    return "\t".join([label, *dense, *sparse])


def read_all(path: str, **kw) -> Batch:
    index = index_file(path)
    batch, bad = FileReader(**kw).read(index, 0, index.rows)
    assert bad == 0
    return batch


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert len(a) == len(b)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.sparse, b.sparse)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("synth"))
    meta = generate(out, SynthConfig(rows=3001, files=3, seed=1), progress=False)
    return out, meta


# ----------------------------------------------------------------------- synth


def test_synth_writes_files_rows_and_metadata(synth_dir):
    out, meta = synth_dir
    names = sorted(n for n in os.listdir(out) if n.startswith("part-"))
    assert names == ["part-00000.tsv", "part-00001.tsv", "part-00002.tsv"]
    total = 0
    for name in names:
        with open(os.path.join(out, name)) as f:
            lines = f.read().splitlines()
        assert all(len(line.split("\t")) == 40 for line in lines)
        total += len(lines)
    assert total == 3001
    with open(os.path.join(out, "synth.json")) as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(meta))
    assert on_disk["generator"] == "dlrover.synth/1" and on_disk["format"] == "criteo-tsv"
    assert on_disk["rows"] == 3001 and on_disk["files"] == names
    assert len(on_disk["config"]["vocab_sizes"]) == NUM_SPARSE
    assert 0.15 < on_disk["ctr"] < 0.35


def test_synth_fields_look_like_criteo(synth_dir):
    out, _ = synth_dir
    batch = read_all(os.path.join(out, "part-00000.tsv"))
    assert set(np.unique(batch.labels)) == {0.0, 1.0}
    assert (batch.sparse >= 0).all() and (batch.sparse < 2**32).all()
    assert (batch.sparse == 0).any()  # some missing categorical values
    assert (batch.dense >= 0).all()
    with open(os.path.join(out, "part-00000.tsv")) as f:
        i2 = [int(line.split("\t")[2]) for line in f if line.split("\t")[2]]
    assert min(i2) < 0  # I2 has negative values, as in Criteo


def test_synth_is_deterministic(tmp_path):
    cfg = SynthConfig(rows=500, files=2, seed=3)
    generate(str(tmp_path / "a"), cfg, progress=False)
    generate(str(tmp_path / "b"), SynthConfig(rows=500, files=2, seed=3), progress=False)
    generate(str(tmp_path / "c"), SynthConfig(rows=500, files=2, seed=4), progress=False)
    for name in ["part-00000.tsv", "part-00001.tsv", "synth.json"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "part-00000.tsv").read_bytes() != (
        tmp_path / "c" / "part-00000.tsv"
    ).read_bytes()


def test_synth_custom_small_vocab_and_gzip(tmp_path):
    cfg = SynthConfig(rows=200, files=1, seed=2, vocab_sizes=[3] * NUM_SPARSE, gzip=True)
    meta = generate(str(tmp_path), cfg, progress=False)
    batch = read_all(str(tmp_path / "part-00000.tsv.gz"))
    assert len(batch) == 200 and meta["config"]["vocab_sizes"] == [3] * NUM_SPARSE
    assert all(len(set(batch.sparse[:, t]) - {0}) <= 3 for t in range(NUM_SPARSE))
    assert 0 < Oracle.from_dir(str(tmp_path)).probability(batch).min()


def test_synth_rerun_with_fewer_files_removes_stale_parts(tmp_path):
    generate(str(tmp_path), SynthConfig(rows=300, files=3, seed=0), progress=False)
    generate(str(tmp_path), SynthConfig(rows=300, files=2, seed=0), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["part-00000.tsv", "part-00001.tsv", "synth.json"]


def test_oracle_best_auc_is_high_and_beats_random(tmp_path):
    meta = generate(str(tmp_path), SynthConfig(rows=50_000, files=2, seed=0), progress=False)
    oracle = Oracle.from_dir(str(tmp_path))
    assert oracle is not None
    batch = Batch.concat(
        [read_all(os.path.join(tmp_path, n)) for n in meta["files"]]
    )
    auc = best_auc(oracle, batch)
    assert 0.7 < auc < 0.85
    assert auc == pytest.approx(meta["best_auc"], abs=1e-4)
    random_auc = roc_auc_score(batch.labels, np.random.default_rng(0).random(len(batch)))
    assert auc > random_auc + 0.15
    # the oracle's mean probability matches the realised click rate
    assert oracle.probability(batch).mean() == pytest.approx(batch.labels.mean(), abs=0.02)


def test_oracle_absent_without_synth_json(tmp_path):
    assert Oracle.from_dir(str(tmp_path)) is None


# ----------------------------------------------------------------------- parsing


def test_hex_to_int_known_values():
    col = np.array([b"68fd1e64", b"", b"ffffffff", b"1", b"00000000", b"ABCdef01"], dtype="S8")
    np.testing.assert_array_equal(
        hex_to_int(col), [0x68FD1E64, 0, 2**32 - 1, 1, 0, 0xABCDEF01]
    )
    assert hex_to_int(col).dtype == np.int64
    with pytest.raises(ValueError):
        hex_to_int(np.array([b"68fd1e6g"], dtype="S8"))
    with pytest.raises(ValueError):
        hex_to_int(np.array([b"123456789"]))


def test_parse_round_trip_hex_and_log1p():
    dense = ["0", "", "-5", "100", "1", "2", "3", "4", "5", "6", "7", "8", "123456789012"]
    sparse = ["68fd1e64", "", "ABCDEF01", "0", "ff"] + [f"{j:08x}" for j in range(21)]
    text = (make_line("1", dense, sparse) + "\n" + make_line("0") + "\n").encode()
    batch, bad = parse_tsv_lines(text, "x.tsv", 1, "fail")
    assert bad == 0 and len(batch) == 2
    np.testing.assert_array_equal(batch.labels, [1.0, 0.0])
    assert batch.labels.dtype == np.float32 and batch.dense.dtype == np.float32
    assert batch.sparse.dtype == np.int64
    raw = np.array([0, 0, 0, 100, 1, 2, 3, 4, 5, 6, 7, 8, 123456789012], dtype=np.float64)
    np.testing.assert_allclose(batch.dense[0], np.log1p(raw), rtol=1e-6)
    np.testing.assert_array_equal(batch.sparse[0, :5], [0x68FD1E64, 0, 0xABCDEF01, 0, 0xFF])
    np.testing.assert_array_equal(batch.sparse[1], np.arange(1, NUM_SPARSE + 1))
    # a list of lines parses the same as the joined bytes
    lines = [line + b"\n" for line in text.splitlines()]
    assert_batches_equal(parse_tsv_lines(lines, "x.tsv", 1, "fail")[0], batch)


def test_batch_slice_concat():
    text = "\n".join(make_line(str(i % 2)) for i in range(10)).encode()
    batch, _ = parse_tsv_lines(text, "x", 1, "fail")
    parts = [batch.slice(0, 3), batch.slice(3, 3), batch.slice(3, 10)]
    assert [len(p) for p in parts] == [3, 0, 7]
    assert_batches_equal(Batch.concat(parts), batch)
    assert len(Batch.concat([])) == 0


def write_lines(path, lines: list[str], newline: str = "\n") -> str:
    with open(path, "w", newline="") as f:
        f.write(newline.join(lines) + newline)
    return str(path)


BAD_LINES = {
    "fields": ("1\t2\t3", "expected 40 tab-separated fields, got 3"),
    "label": (make_line("2"), "label"),
    "hex": (make_line(sparse=["68fd1e6z"] + ["0"] * 25), "C1"),
    "long_hex": (make_line(sparse=["0"] * 25 + ["123456789"]), "C26"),
    "int": (make_line(dense=["1.5"] + ["0"] * 12), "I1"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_bad_line_fails_with_file_and_line(tmp_path, kind):
    bad, reason = BAD_LINES[kind]
    lines = [make_line() for _ in range(20)]
    lines[12] = bad  # physical line 13
    path = write_lines(tmp_path / "bad.tsv", lines)
    index = index_file(path)
    assert index.rows == 20
    with pytest.raises(DataError) as err:
        FileReader("fail").read(index, 0, 20)
    msg = str(err.value)
    assert f"{path}:13:" in msg and reason in msg and "\n" not in msg
    # a range that does not include the bad line reads fine
    batch, skipped = FileReader("fail").read(index, 0, 12)
    assert len(batch) == 12 and skipped == 0
    batch, skipped = FileReader("skip").read(index, 0, 20)
    assert len(batch) == 19 and skipped == 1


def test_bad_lines_skipped_and_counted_in_all_formats(tmp_path):
    lines = [make_line(str(i % 2), dense=[str(i)] * NUM_DENSE) for i in range(30)]
    lines[0] = "0\tnot enough"
    lines[17] = make_line("x")
    lines[29] = make_line(sparse=["zz"] * NUM_SPARSE)
    plain = write_lines(tmp_path / "bad.tsv", lines)
    gz = str(tmp_path / "bad.tsv.gz")
    with open(plain, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    good_rows = [i for i in range(30) if i not in (0, 17, 29)]
    for path in (plain, gz):
        index = index_file(path, stride=4)
        reader = FileReader("skip")
        batch, skipped = reader.read(index, 0, 30)
        assert skipped == 3
        np.testing.assert_allclose(batch.dense[:, 0], np.log1p(good_rows), rtol=1e-6)
        part, skipped = reader.read(index, 10, 20)
        assert skipped == 1
        in_range = [r for r in good_rows if 10 <= r < 20]
        np.testing.assert_allclose(part.dense[:, 0], np.log1p(in_range), rtol=1e-6)
        with pytest.raises(DataError, match=rf"{path}:18: label"):
            FileReader("fail").read(index, 10, 20)


def test_line_numbers_count_blank_lines_and_crlf(tmp_path):
    lines = [make_line() for _ in range(10)]
    lines[3] = ""  # blank lines are not rows but still count as lines
    lines[4] = ""
    lines[8] = make_line("7")  # physical line 9, row 6
    path = write_lines(tmp_path / "blank.tsv", lines, newline="\r\n")
    index = index_file(path, stride=2)
    assert index.rows == 8
    with pytest.raises(DataError, match=rf"{path}:9: label"):
        FileReader().read(index, 5, 7)
    batch, skipped = FileReader("skip").read(index, 0, 8)
    assert len(batch) == 7 and skipped == 1
    batch, _ = FileReader().read(index, 2, 6)
    assert len(batch) == 4


# ----------------------------------------------------------------------- reading


def test_index_and_range_reads_match_whole_file(synth_dir):
    out, meta = synth_dir
    path = os.path.join(out, "part-00001.tsv")
    index = index_file(path, stride=37)
    assert index.rows == meta["rows_per_file"][1] == 1000
    assert len(index.offsets) == -(-1000 // 37)
    whole = read_all(path)
    reader = FileReader()
    rng = np.random.default_rng(0)
    cases = [(0, 1), (36, 38), (37, 74), (999, 1000), (0, 1000), (500, 500)]
    cases += [tuple(sorted(rng.integers(0, 1001, 2))) for _ in range(20)]
    for start, stop in cases:
        batch, bad = reader.read(index, int(start), int(stop))
        assert bad == 0
        assert_batches_equal(batch, whole.slice(int(start), int(stop)))
    with pytest.raises(ValueError):
        reader.read(index, 10, 1001)


def test_gzip_and_parquet_readers_match_plain_tsv(synth_dir, tmp_path):
    out, _ = synth_dir
    plain = os.path.join(out, "part-00002.tsv")
    expected = read_all(plain)
    gz = str(tmp_path / "part.tsv.gz")
    with open(plain, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    pq_int, pq_hex = str(tmp_path / "int.parquet"), str(tmp_path / "hex.pq")
    assert tsv_to_parquet(plain, pq_int) == len(expected)
    tsv_to_parquet(gz, pq_hex, hex_strings=True)
    reader = FileReader(cache_files=1)
    for path, fmt in [(gz, "tsv"), (pq_int, "parquet"), (pq_hex, "parquet")]:
        index = index_file(path)
        assert index.fmt == fmt and index.rows == len(expected) and index.offsets is None
        assert_batches_equal(reader.read(index, 0, index.rows)[0], expected)
        assert_batches_equal(reader.read(index, 123, 456)[0], expected.slice(123, 456))


def test_synth_gzip_output_matches_plain(tmp_path):
    generate(str(tmp_path / "p"), SynthConfig(rows=400, files=1, seed=9), progress=False)
    meta = generate(str(tmp_path / "g"), SynthConfig(rows=400, files=1, seed=9, gzip=True),
                    progress=False)
    assert meta["files"] == ["part-00000.tsv.gz"]
    assert_batches_equal(
        read_all(str(tmp_path / "g" / "part-00000.tsv.gz")),
        read_all(str(tmp_path / "p" / "part-00000.tsv")),
    )


def test_missing_files_raise_data_error(tmp_path):
    missing = str(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match="nope.tsv"):
        index_file(missing)
    path = write_lines(tmp_path / "gone.tsv", [make_line()] * 5)
    index = index_file(path)
    os.remove(path)
    with pytest.raises(DataError, match="gone.tsv"):
        FileReader().read(index, 0, 5)
    with pytest.raises(DataError, match=r"nothing-\*\.tsv"):
        expand_paths([str(tmp_path / "nothing-*.tsv")])


def test_expand_paths_and_detect_format(tmp_path, synth_dir):
    out, _ = synth_dir
    for name in ["b.tsv", "a.tsv", "c.parquet"]:
        (tmp_path / name).write_text("")
    patterns = [str(tmp_path / "*.tsv"), str(tmp_path / "a.tsv"), str(tmp_path / "c.parquet")]
    got = expand_paths(patterns)
    assert got == [str(tmp_path / n) for n in ["a.tsv", "b.tsv", "c.parquet"]]
    # a directory expands to its data files, not synth.json
    assert [os.path.basename(p) for p in expand_paths([out])] == [
        "part-00000.tsv", "part-00001.tsv", "part-00002.tsv"
    ]
    assert detect_format("x/day_0") == "tsv"
    assert detect_format("x/part.tsv.gz") == "tsv"
    assert detect_format("x/train.txt") == "tsv"
    assert detect_format("x/a.PARQUET") == "parquet"
    assert detect_format("x/a.pq") == "parquet"
    with pytest.raises(DataError):
        detect_format("x/synth.json")


def test_parquet_bad_rows_name_file_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 8
    cols = {"label": pa.array([0, 1, 0, 2, 1, 0, 1, 0])}
    cols.update({f"I{j}": pa.array(np.arange(n)) for j in range(1, NUM_DENSE + 1)})
    cols.update({f"C{j}": pa.array(["ff"] * n) for j in range(1, NUM_SPARSE + 1)})
    cols["C3"] = pa.array(["ff", "ff", "ff", "ff", "ff", "nothex", None, "ff"])
    path = str(tmp_path / "bad.parquet")
    pq.write_table(pa.table(cols), path)
    index = index_file(path)
    with pytest.raises(DataError, match=rf"{path}:4: label"):
        FileReader().read(index, 0, n)
    with pytest.raises(DataError, match=rf"{path}:6: C3"):
        FileReader().read(index, 4, n)
    batch, _ = FileReader().read(index, 6, 8)  # no bad rows in range
    np.testing.assert_array_equal(batch.sparse[:, 2], [0, 0xFF])  # null -> 0
    batch, skipped = FileReader("skip").read(index, 0, n)
    assert skipped == 2 and len(batch) == 6
    np.testing.assert_allclose(batch.dense[:, 0], np.log1p([0, 1, 2, 4, 6, 7]), rtol=1e-6)


def test_big_buffers_parse_in_pieces_with_correct_line_numbers(monkeypatch):
    from dlrover.data import tsv

    lines = [make_line(str(i % 2), dense=[str(i)] * NUM_DENSE) for i in range(60)]
    lines[7] = ""
    lines[33] = make_line("9")
    lines[58] = "short"
    data = ("\n".join(lines) + "\n").encode()
    whole, skipped_whole = parse_tsv_lines(data, "f", 1, "skip")
    monkeypatch.setattr(tsv, "_PIECE", 700)  # a few lines per piece
    pieces, skipped = parse_tsv_lines(data, "f", 1, "skip")
    assert skipped == skipped_whole == 2
    assert_batches_equal(pieces, whole)
    expected_rows = [i for i in range(60) if i not in (7, 33, 58)]
    np.testing.assert_allclose(pieces.dense[:, 0], np.log1p(expected_rows), rtol=1e-6)
    with pytest.raises(DataError, match="f:34: label"):
        parse_tsv_lines(data, "f", 1, "fail")
    with pytest.raises(DataError, match="f:110: label"):
        parse_tsv_lines(data, "f", 77, "fail")
