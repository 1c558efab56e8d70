"""Published model versions without a job: what a full version and a delta hold, that a
delta applied to its parent is the next state bit for bit (quantized: as a full version
quantized alike), that a reader never sees a version torn by a killed writer, and
retention."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from published import elsewhere, initial, publish, publish_spec, step
from dlrover.errors import DataError
from dlrover.serving.predict import load_model
from dlrover.serving.versions import ROWS_FILE, Version, load_version, prune, version_dir, versions

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("quantize", ["none", "fp16", "int8"])
def test_a_delta_applied_to_its_parent_is_the_next_full_version(tmp_path, quantize):
    spec = publish_spec(tmp_path, tmp_path / "pub", quantize)
    rng = np.random.default_rng(1)
    s1, dense = initial(spec)
    s2, changed = step(s1, rng)
    publish(spec, s1, dense, 1)
    v2 = publish(spec, s2, dense, 2, parent=1, base=1, rows=changed)
    full2 = publish(elsewhere(spec, tmp_path / "full"), s2, dense, 2)
    assert v2.kind == "delta" and v2.state_sha256 == full2.state_sha256
    by_delta, by_full = load_version(tmp_path / "pub", 2), load_version(tmp_path / "full", 2)
    for a, b in zip(by_delta.model.tables, by_full.model.tables):
        assert torch.equal(a, b)
    if quantize == "none":
        assert all(torch.equal(a, torch.from_numpy(b)) for a, b in zip(by_delta.model.tables, s2))


def test_a_delta_holds_only_the_changed_rows(tmp_path):
    spec = publish_spec(tmp_path, tmp_path / "pub")
    s1, dense = initial(spec)
    s2, changed = step(s1, np.random.default_rng(2), fraction=0.03)
    full = publish(spec, s1, dense, 1)
    delta = publish(spec, s2, dense, 2, parent=1, base=1, rows=changed)
    held = torch.load(version_dir(tmp_path / "pub", 2) / ROWS_FILE, weights_only=True)
    assert [ids.tolist() for ids, _ in held] == [r.tolist() for r in changed]
    assert delta.changed_rows == sum(len(r) for r in changed) < 0.05 * full.changed_rows
    assert sum(f.bytes for f in delta.files) < 0.25 * sum(f.bytes for f in full.files)


def test_a_delta_missing_a_changed_row_fails_its_digest(tmp_path):
    spec = publish_spec(tmp_path, tmp_path / "pub")
    s1, dense = initial(spec)
    s2, changed = step(s1, np.random.default_rng(3))
    publish(spec, s1, dense, 1)
    publish(spec, s2, dense, 2, parent=1, base=1, rows=[r[1:] for r in changed])  # one row short per table
    with pytest.raises(DataError, match="do not match its state_sha256"):
        load_version(tmp_path / "pub", 2)
    assert load_version(tmp_path / "pub", 1).version.version == 1  # the parent still loads


def test_a_corrupt_file_or_an_unknown_version_is_one_clear_error(tmp_path):
    spec = publish_spec(tmp_path, tmp_path / "pub")
    s1, dense = initial(spec)
    publish(spec, s1, dense, 1)
    with pytest.raises(DataError, match=r"no complete version 7 \(complete: 1\)"):
        load_version(tmp_path / "pub", 7)
    with pytest.raises(DataError, match="no complete model version"):
        load_version(tmp_path / "empty")
    with open(version_dir(tmp_path / "pub", 1) / "tables.pt", "r+b") as f:
        f.seek(100)
        f.write(b"\0\1\2\3")
    with pytest.raises(DataError, match=r"tables\.pt: missing or its sha256 does not match"):
        load_version(tmp_path / "pub")
    with pytest.raises(DataError, match="--version: .* holds no published versions"):
        load_model(tmp_path / "empty", version=1)


def test_retention_keeps_the_two_newest_chains(tmp_path):
    spec = publish_spec(tmp_path, tmp_path / "pub")
    state, dense = initial(spec)
    rng = np.random.default_rng(4)
    kinds = ["full", "delta", "full", "delta", "delta", "full", "delta"]
    base = parent = None
    for n, kind in enumerate(kinds, start=1):
        state, changed = step(state, rng)
        if kind == "full":
            publish(spec, state, dense, n)
            base = n
        else:
            publish(spec, state, dense, n, parent=parent, base=base, rows=changed)
        parent = n
    assert versions(tmp_path / "pub") == [3, 4, 5, 6, 7]  # prune ran after each version
    assert prune(tmp_path / "pub", keep_fulls=1) == [3, 4, 5]
    assert load_version(tmp_path / "pub").version.version == 7


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from pathlib import Path
    from published import initial, publish, publish_spec, step
    spec = publish_spec(Path({data!r}), Path({out!r}), rows=60_000)
    state, dense = initial(spec)
    rng = np.random.default_rng(5)
    publish(spec, state, dense, 1)
    print("v1", flush=True)
    n = 1
    while True:
        n += 1
        state, changed = step(state, rng)
        publish(spec, state, dense, n)  # full versions, tens of MB: a kill lands inside one
        print(f"v{{n}}", flush=True)
    """
)


def test_a_writer_killed_while_publishing_leaves_complete_versions_and_the_next_one_whole(tmp_path):
    out = tmp_path / "pub"
    script = WRITER.format(tests=str(ROOT / "tests"), data=str(tmp_path), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "v1", "the writer did not start"
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("pub/.v*.tmp/*")) and time.monotonic() < deadline:  # a version half written
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done = versions(out)
    assert done and list(out.glob(".v*.tmp")), (done, list(out.iterdir()))
    newest = load_version(out)  # every complete version verifies; the torn one is not listed
    assert newest.version.version == done[-1]
    spec = publish_spec(tmp_path, out, rows=60_000)
    state, dense = initial(spec)
    nxt = publish(spec, state, dense, done[-1] + 1)
    assert versions(out)[-1] == nxt.version and not list(out.glob(".v*.tmp"))
    assert json.loads((version_dir(out, nxt.version) / "version.json").read_text())["state_sha256"] == nxt.state_sha256
    assert Version.read(version_dir(out, nxt.version)).kind == "full"
