"""Jobs that follow arriving files (``data.follow``) with real actors: files written into
a directory while the job trains, the master killed mid-stream, a file rewritten after it
was trained. Every row of every file is trained once."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

from conftest import events_of, signal_when_training, sleepy, small_spec
from dlrover.data.synth import SynthConfig, generate

FILES, ROWS = 6, 60_000
TRAIN_ROWS_PER_FILE = ROWS // FILES - ROWS // FILES // 10  # data.eval_fraction 0.1


class Seen:
    """An observer of the driver: the most rows it saw taken and trained."""

    def __init__(self) -> None:
        self.expected = self.done = 0

    def progress(self, p: dict) -> None:
        self.expected, self.done = max(self.expected, p["samples_expected"]), max(self.done, p["samples_done"])

    def event(self, e) -> None: ...

    def finished(self, summary, run_dir) -> None: ...

    def close(self) -> None: ...


def drip(src: Path, dst: Path, seen: Seen, changed: Path) -> threading.Thread:
    """Move ``src``'s files into ``dst`` (each appears whole): two at first, then each
    once the job trained all but the newest, so files arrive while it trains; before the
    last, append a row to ``changed`` (a file rewritten after it was trained)."""

    def move(f: Path) -> None:
        shutil.copy(f, dst / f"{f.name}.part")  # not a data file's name while written
        os.replace(dst / f"{f.name}.part", dst / f.name)

    def wait(rows: int) -> None:
        deadline = time.monotonic() + 120
        while seen.done < rows and time.monotonic() < deadline:
            time.sleep(0.1)

    def go() -> None:
        files = sorted(src.glob("*.tsv"))
        move(files[0])
        move(files[1])
        for k, f in enumerate(files[2:], start=2):
            wait((k - 1) * TRAIN_ROWS_PER_FILE)
            if f == files[-1]:
                with open(changed, "a") as out, open(files[1]) as row:
                    out.write(row.readline())
            move(f)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_files_arriving_while_a_killed_master_restarts_are_each_trained_once(ray_local, tmp_path):
    from dlrover.driver.runner import run_job

    src, dst = tmp_path / "src", tmp_path / "in"
    generate(str(src), SynthConfig(rows=ROWS, files=FILES, seed=5), progress=False)
    dst.mkdir()
    train_rows = FILES * TRAIN_ROWS_PER_FILE
    seen = Seen()
    spec = small_spec(
        dst, name="follow", data__paths=[str(dst)], data__follow={"poll_s": 0.5, "until": ROWS},
        train__log_every_s=0.5, checkpoint__memory_interval_s=2.0, checkpoint__interval_s=3.0, checkpoint__min_interval_s=3.0,
        checkpoint__dir=str(tmp_path / "ckpt"),
        chaos=sleepy(3),
    )  # fmt: skip
    feeder = drip(src, dst, seen, dst / "part-00000.tsv")
    killed: dict = {}  # once two files are trained, four to come
    signal_when_training("follow-kill", "master", signal.SIGKILL, killed, min_samples=2 * TRAIN_ROWS_PER_FILE)
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", observers=[seen], job_id="follow-kill")
    feeder.join(timeout=60)
    events = events_of(path)
    assert s["status"] == "succeeded", s.get("reason")
    assert killed and [f["kind"] for f in s["failures"]] == ["master_death"], s["failures"]
    assert s["samples_expected"] == s["samples_trained"] == train_rows and s["samples_lost"] == 0
    assert s["ps_ids_updated"] == s["ids_expected"] == 26 * train_rows
    events = [e for e in events if e["kind"] in ("file_arrived", "follow_end", "file_changed", "master_resumed")]
    arrived = [e["path"] for e in events if e["kind"] == "file_arrived"]
    assert sorted(set(arrived)) == sorted(str(dst / f.name) for f in src.glob("*.tsv")), arrived
    assert any(e["kind"] == "follow_end" for e in events)
    changed = [e for e in events if e["kind"] == "file_changed"]
    assert changed and all(e["path"] == str(dst / "part-00000.tsv") for e in changed), changed


def test_a_job_publishes_full_versions_and_deltas_each_equal_to_its_cut(ray_local, synth_dir, tmp_path):
    """Versions every second, a full one every 3: each loads with its deltas applied and
    matches the digest of the tables at its cut; a delta holds a few % of the rows."""
    from dlrover.driver.runner import run_job
    from dlrover.serving.predict import predict
    from dlrover.serving.versions import Version, load_version, version_dir, versions

    out = tmp_path / "versions"
    spec = small_spec(
        synth_dir, name="publish", data__epochs=4, chaos=sleepy(5), model__num_embeddings=50_000,
        checkpoint__memory_interval_s=0, publish={"dir": str(out), "every_s": 1.0, "full_every": 3},
    )  # fmt: skip
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded"
    published = [e for e in events_of(path) if e["kind"] == "version_published"]
    have = versions(out)
    assert len(published) >= 3 and have == [e["version"] for e in published][-len(have):], (published, have)
    records = [Version.read(version_dir(out, n)) for n in have]
    deltas = [v for v in records if v.kind == "delta"]
    assert deltas and all(v.parent == v.version - 1 for v in deltas)
    rows = 26 * 50_000
    assert all(v.changed_rows < 0.1 * rows for v in deltas), [v.changed_rows for v in deltas]
    for n in have:
        assert load_version(out, n).version.state_sha256 == records[have.index(n)].state_sha256  # the chain applied and checked
    assert records[-1].rows_trained == s["samples_trained"]  # the last version holds every row trained
    scored = predict(out, str(synth_dir / "part-00000.tsv"), tmp_path / "scores.csv", version=have[-1])
    assert scored == 20_000


def test_a_stream_whose_arrivals_double_scales_out_before_its_lag_passes_the_bound(ray_local, tmp_path):
    """dlrover_rm's stream stage, live: files arrive every 2 s, then every 0.1 s, past what
    the (slowed) workers train; the policy scales out while the lag is still under
    policy.max_lag_s. On 2 cores the decision is what can be shown, not the gain."""
    from dlrover.driver.runner import run_job

    src, dst = tmp_path / "src", tmp_path / "in"
    generate(str(src), SynthConfig(rows=120_000, files=24, seed=6), progress=False)
    dst.mkdir()
    files = sorted(src.glob("*.tsv"))

    def arrive() -> None:
        for i, f in enumerate(files):
            shutil.copy(f, dst / f".{f.name}")
            os.replace(dst / f".{f.name}", dst / f.name)
            time.sleep(2.0 if i < 8 else 0.1)

    feeder = threading.Thread(target=arrive, daemon=True)
    feeder.start()
    knobs = {
        "cooldown_s": 2.0, "profile_window_s": 2.0, "worker_cpu_choices": [1.0], "ps_cpu_choices": [1.0], "max_workers": 4, "max_ps": 2,
        "model_prior": {"t0": 0.004, "t1": 2.0e-5, "t2": 0.004, "t3": 0.003, "t4": 0.0005},  # no host terms: more workers, more samples/s
    }  # fmt: skip
    spec = small_spec(
        dst, name="stream-sizing", data__paths=[str(dst)], data__follow={"poll_s": 0.5, "until": 120_000}, chaos=sleepy(8),
        train__log_every_s=0.5, resources__budget_cpu=8.25,
        policy={"name": "dlrover_rm", "knobs": knobs, "interval_s": 0.5, "warmup_s": 0.5, "max_lag_s": 30.0, "history_dir": str(tmp_path / "h")},
    )  # fmt: skip
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    feeder.join(timeout=60)
    assert s["status"] == "succeeded" and s["samples_trained"] == s["samples_expected"], s.get("reason")
    stream = [e for e in s["scale_events"] if e["stage"] == "stream"]
    assert stream, [(e["stage"], e["reason"]) for e in s["scale_events"]]
    out = [e for e in stream if e["to"]["workers"] > e["from"]["workers"]]
    assert out, [e["reason"] for e in stream]
    lag = float(out[0]["reason"].split(" behind (")[1].split("s,")[0])
    assert lag < 30.0, out[0]["reason"]  # decided before the oldest untrained row was 30 s old
