"""Jobs with dynamic tables (issue 18): rescaled PS and a PS killed and recovered, with
real actors and a real SIGKILL, count every bag update exactly.

What "exact" means for a dynamic table. A PS counts a bag as updated when its push
applies the bag's gradient (``ps_bags_updated``): each (sample, table) bag is pushed to
the one PS owning its vshard, so the sum over PS is ``26 x samples``, dynamic tables
included. A bag whose id is not admitted yet reads the table's default row, a constant
outside the TBE: its gradient lands on no row, yet the bag counts in ``ps_bags_updated``
(as it counts in the master's count of updates lost with a PS, which routes raw ids the
same way). The PS count such reads apart (``dynamic_tables.defaults``, at the pull): in a
job where every pull is pushed once (no failure), the bags that trained a row of their
own are ``ps_bags_updated - defaults`` (one id per bag), ``dynamic_tables.lookups`` is
``tables x samples``, and since an id's first ``admit_after`` sightings all read the
default row, ``defaults`` is at least ``sum over ids of min(occurrences, admit_after)``
(more where an id waited again after an eviction or lost its waiting slot to another).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import batches_expected, check_exactly_once, events_of, fault_spec, signal_when_training, sleepy, small_spec

TABLES = {
    0: {"kind": "dynamic", "capacity_rows": 600, "admit_after": 1, "eviction": "lfu"},  # 877 ids in synth_dir
    3: {"kind": "dynamic", "capacity_rows": 1024, "admit_after": 2, "eviction": "lru"},  # 3945 ids
    6: {"kind": "dynamic", "capacity_rows": 2048, "admit_after": 1, "eviction": "ttl", "ttl_steps": 40},  # 5186 ids
}


def default_reads_at_least(spec) -> int:
    """Bags that must read the default row: each id's first ``admit_after`` sightings in the
    trained rows (every epoch's)."""
    from dlrover.data.criteo import index_file
    from dlrover.data.plan import DataPlan
    from dlrover.data.reader import FileReader

    counts = {t: Counter() for t in TABLES}
    reader = FileReader()
    for path, rows in DataPlan.build(spec).train_rows.items():
        batch, _ = reader.read(index_file(path), 0, rows)
        for t in TABLES:
            counts[t].update(batch.sparse[:, t].tolist())
    return sum(min(n * spec.data.epochs, TABLES[t]["admit_after"]) for t in TABLES for n in counts[t].values())


def test_a_dynamic_table_job_scaled_2_3_2_ps_applies_every_bag_update_once(ray_local, synth_dir, tmp_path):
    """Live rescales (two-round migration while training goes on) move the vshards with
    their id maps; no bag update is lost or applied twice, and the unadmitted ids' bags
    read the default row."""
    from dlrover.driver.runner import run_job

    steps = [{"at_progress": 0.05, "ps": 3}, {"at_progress": 0.1, "ps": 2}]  # back to back: a PS starts slowly
    spec = small_spec(
        synth_dir,
        model__tables=TABLES,
        train__vshards=8,  # few blocks per PS: the maps' per-block work stays small
        data__batch_size=128,  # many small steps, slept 2x after (and 3 epochs): the job outlasts two rescales
        data__epochs=3,
        chaos=sleepy(3),
        train__log_every_s=0.2,
        resources__budget_cpu=8,
        policy={"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.2, "warmup_s": 0.2, "history_dir": str(tmp_path / "h")},
    )
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["failures"] == [], s["failures"]
    assert s["samples_trained"] == s["samples_expected"]
    check_exactly_once(s, spec)
    assert [(e["kind"], e["to"]["ps"]) for e in s["scale_events"]] == [("scale_out", 3), ("scale_in", 2)], s["scale_events"]
    assert all(e["vshards_moved"] > 0 for e in s["scale_events"])
    counts = s["dynamic_tables"]
    assert counts["lookups"] == len(TABLES) * s["samples_expected"], counts
    assert default_reads_at_least(spec) <= counts["defaults"] < counts["lookups"], (default_reads_at_least(spec), counts)
    assert counts["evicted"] > 0 and counts["admitted"] > counts["evicted"], counts
    assert s["auc"] > 0.6


def test_a_dynamic_table_ps_killed_is_recovered_from_a_durable_delta_with_its_lost_updates_counted(ray_local, synth_dir, tmp_path):
    """``recovery.ps: partial``: ps-1 is SIGKILLed once a delta checkpoint (the map states of
    the rows changed since the full one, with the rows) is on disk and out of memory;
    its replacement restores full + delta, the other PS keep theirs. The bags the dead PS
    had applied at the cut, plus what it lost after it (counted by the master from the
    data, routing raw ids by their hash), plus what every PS applied since, are every bag
    once."""
    from dlrover.driver.runner import run_job

    # The kill lands after the second cut's durable write (3 s here, more under load) and
    # before the third cut, mid-training: the job trains for about four of them (6 epochs,
    # the workers sleeping twice each step's time after it, last as long as 18).
    cut = 8.0
    spec = fault_spec(
        synth_dir, tmp_path, sleepy(3), model__tables=TABLES, train__vshards=8, data__epochs=6, checkpoint__keep_in_memory=False, checkpoint__full_every=100,
        checkpoint__memory_interval_s=cut, checkpoint__interval_s=cut, checkpoint__min_interval_s=cut,
    )  # fmt: skip
    assert spec.recovery.ps == "partial"
    manifest = Path(spec.checkpoint.dir) / "dyn-kill" / "ckpt-00000002" / "manifest.json"
    # on disk for a moment: released from memory too, and well before the next cut
    written = lambda: manifest.exists() and time.time() - manifest.stat().st_mtime > 0.5  # noqa: E731
    out: dict = {}
    t = signal_when_training("dyn-kill", "ps-1", signal.SIGKILL, out, min_samples=0, ready=written)
    s, path = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id="dyn-kill")
    t.join(timeout=5)
    assert "pid" in out, "ps-1 was never killed"
    assert s["status"] == "succeeded" and s["samples_lost"] == 0 and s["samples_replayed"] == 0
    events = events_of(path)
    (part,) = [e for e in events if e["kind"] == "partial_recovery"]
    assert not [e for e in events if e["kind"] == "rollback"]
    assert part["checkpoint"]["source"] == "durable", part["checkpoint"]
    links = {e["seq"]: e["link"] for e in events if e["kind"] == "checkpoint_durable"}
    assert links[part["checkpoint"]["seq"]] == "delta", (part["checkpoint"], links)
    (f,) = [f for f in s["failures"] if f["kind"] == "ps_death"]
    assert f["actor"].endswith("/ps-1") and f["updates_lost"] > 0
    at_ckpt = part["bags_at_checkpoint"][f["actor"]]
    assert s["ps_bags_updated"] + at_ckpt + f["updates_lost"] == 26 * s["samples_expected"], (s["ps_bags_updated"], at_ckpt, f["updates_lost"])
    assert s["dense_updates"] == batches_expected(spec)
    assert s["dynamic_tables"]["defaults"] > 0 and s["dynamic_tables"]["admitted"] > 0
