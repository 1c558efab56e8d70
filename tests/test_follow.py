"""Following arriving files (``data.follow``) without Ray: the growing shard queue, which
files are complete, the follower's polls over a real directory, and the spec's rules."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import small_spec
from dlrover.data.follow import FileWatch, FollowPlan, Listed, list_files
from dlrover.data.follow_queue import FollowQueue
from dlrover.data.shards import ShardQueue
from dlrover.errors import SpecError
from dlrover.master.books import ShardBooks
from dlrover.master.events import EventLog
from dlrover.master.follower import Follower
from dlrover.master.states import JobStatus


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drain(q: FollowQueue, owner: str = "w0") -> list[tuple[str, int, int]]:
    """Lease and finish every queued shard: (path, start, stop) in the order handed out."""
    out = []
    while (s := q.next(owner)) is not None:
        q.done(s.shard_id, owner, s.rows)
        out.append((s.path, s.start, s.stop))
    return out


# -- the queue ---------------------------------------------------------------------------


def test_files_are_trained_in_arrival_order_each_row_once():
    q = FollowQueue([], shard_rows=100, shuffle_seed=0, clock=Clock())
    q.add_file("b", 250)
    q.add_file("a", 120)
    done = drain(q)
    assert [p for p, _, _ in done] == ["b"] * 3 + ["a"] * 2
    assert sorted((a, b) for p, a, b in done if p == "b") == [(0, 100), (100, 200), (200, 250)]
    assert q.samples_done == q.samples_expected == 370


def test_the_queue_is_finished_only_once_the_stream_ended():
    q = FollowQueue([], shard_rows=100, clock=Clock())
    q.add_file("a", 100)
    drain(q)
    assert not q.finished and q.next("w0") is None  # workers wait for the next file
    q.end()
    assert q.finished
    with pytest.raises(ValueError, match="ended"):
        q.add_file("b", 10)


def test_a_file_is_queued_once_and_a_followed_stream_has_one_epoch():
    q = FollowQueue([], shard_rows=100, clock=Clock())
    q.add_file("a", 100)
    with pytest.raises(ValueError, match="already in the queue"):
        q.add_file("a", 100)
    with pytest.raises(ValueError, match="once"):
        FollowQueue([], shard_rows=100, epochs=2)


def test_a_cut_restores_its_files_leases_and_end():
    clock = Clock()
    q = FollowQueue([], shard_rows=100, clock=clock)
    q.add_file("a", 300, cuts=[150])
    first = q.next("w0")
    q.done(first.shard_id, "w0", first.rows)
    held = q.next("w1")
    state = q.cut({held.shard_id: (40, 40)})
    back = FollowQueue.from_state_dict(state, clock)
    assert isinstance(back, FollowQueue) and back.has("a") and not back.has("b") and not back.ended
    assert back.samples_done == first.rows and back.shard(held.shard_id).start == held.start + 40
    assert back.cuts == {"a": [150]}
    q.end()
    assert FollowQueue.from_state_dict(q.state_dict(), clock).ended


def test_lines_since_an_earlier_cut_include_the_files_that_came_after_it():
    """What partial recovery replays: a file the cut did not know is all new."""
    clock = Clock()
    q = FollowQueue([], shard_rows=100, shuffle_seed=None, clock=clock)
    q.add_file("a", 200)
    drain(q)
    before = FollowQueue.from_state_dict(q.cut({}), clock)
    q.add_file("b", 150)
    drain(q)
    assert q.lines_since(before) == [("b", 0, 100), ("b", 100, 150)]
    assert ShardQueue.from_state_dict(q.cut({}), clock).applied_lines(3) == 50  # the files' queue reads it too


def test_the_oldest_open_file_is_the_first_queued_with_untrained_rows():
    q = FollowQueue([], shard_rows=100, shuffle_seed=None, clock=Clock())
    assert q.oldest_open() is None
    q.add_file("a", 100)
    q.add_file("b", 100)
    s = q.next("w0")
    assert q.oldest_open() == "a"
    q.done(s.shard_id, "w0", s.rows)
    assert q.oldest_open() == "b"


# -- which files are complete -------------------------------------------------------------


@dataclass
class Listing:
    files: dict[str, Listed] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)

    def put(self, path: str, size: int, stamp: str = "1") -> None:
        self.files[path] = Listed(path, size, stamp)

    def __call__(self) -> tuple[dict[str, Listed], set[str]]:
        return dict(self.files), set(self.marked)


def test_with_stable_size_a_file_is_complete_once_two_polls_saw_it_unchanged():
    ls = Listing()
    watch = FileWatch("stable_size", ls)
    ls.put("d/a.tsv", 10)
    assert watch.poll() == ([], [])
    ls.put("d/a.tsv", 20)  # still being written
    assert watch.poll() == ([], [])
    ls.put("d/b.tsv", 5)
    complete, _ = watch.poll()
    assert [f.path for f in complete] == ["d/a.tsv"]
    complete, _ = watch.poll()
    assert [f.path for f in complete] == ["d/b.tsv"]
    assert watch.poll() == ([], [])  # each once


def test_with_success_markers_the_files_of_a_marked_directory_are_complete():
    ls = Listing()
    watch = FileWatch("_SUCCESS", ls)
    ls.put("s3://b/h=1/p0.parquet", 10)
    ls.put("s3://b/h=2/p0.parquet", 10)
    assert watch.poll() == ([], [])
    ls.marked.add("s3://b/h=2")
    assert [f.path for f in watch.poll()[0]] == ["s3://b/h=2/p0.parquet"]


def test_a_taken_file_that_changes_is_reported_once_per_change_and_not_taken_again():
    ls = Listing()
    watch = FileWatch("stable_size", ls)
    ls.put("a.tsv", 10)
    watch.poll()
    assert [f.path for f in watch.poll()[0]] == ["a.tsv"]
    ls.put("a.tsv", 10, stamp="2")  # rewritten at the same size
    complete, changed = watch.poll()
    assert complete == [] and changed == [(Listed("a.tsv", 10, "1"), Listed("a.tsv", 10, "2"))]
    assert watch.poll() == ([], [])


def test_a_listing_names_data_files_only_and_an_empty_or_missing_directory_is_not_an_error(tmp_path):
    (tmp_path / "a.tsv").write_text("x\n")
    (tmp_path / "b.tsv.part").write_text("x")
    (tmp_path / ".c.tsv").write_text("x")
    (tmp_path / "_SUCCESS").write_text("")
    files, marked = list_files([str(tmp_path)], markers=True)
    assert list(files) == [str(tmp_path / "a.tsv")] and files[str(tmp_path / "a.tsv")].size == 2
    assert marked == {str(tmp_path)}
    assert list_files([str(tmp_path / "nothing-yet")], markers=False) == ({}, set())
    assert list_files([str(tmp_path / "*.parquet")], markers=False) == ({}, set())


# -- the follower over a directory ------------------------------------------------------


def write_rows(path: Path, rows: int, start: int = 0) -> None:
    """Criteo TSV rows (label, 13 ints, 26 hex ids)."""
    with open(path, "a") as f:
        for i in range(start, start + rows):
            f.write("\t".join([str(i % 2)] + [str(i)] * 13 + [format(i * 7 + k, "x") for k in range(26)]) + "\n")


class Master:
    """What the follower uses of the JobMaster: books, events, clock, status, bad_input."""

    def __init__(self, spec, clock: Clock) -> None:
        self.spec, self.clock = spec, clock
        self.data = FollowPlan.build(spec)
        self.books = ShardBooks(self.data.shard_queue(spec, clock), clock)
        self.events = EventLog(clock)
        self.status = JobStatus.TRAINING
        self.errors: list = []

    def bad_input(self, who: str, err: Exception) -> None:
        self.errors.append((who, str(err)))

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events.rows()]


def follower(tmp_path: Path, **follow) -> tuple[Master, Follower, Clock]:
    spec = small_spec(tmp_path, data__paths=[str(tmp_path)], data__follow={"poll_s": 1, **follow}, data__eval_fraction=0.2)
    clock = Clock()
    m = Master(spec, clock)
    return m, Follower(m, m.data, spec.data.follow, spec.data.paths), clock


def test_the_follower_queues_each_complete_file_once_and_ends_at_until_rows(tmp_path):
    m, f, clock = follower(tmp_path, until=150)
    write_rows(tmp_path / "p0.tsv", 100)
    f.poll()
    assert m.books.queue.samples_expected == 0  # seen once: not complete yet
    clock.t = 5.0
    f.poll()
    assert m.books.queue.samples_expected == 80 and m.data.arrived == {str(tmp_path / "p0.tsv"): 5.0}
    assert m.data.eval_ranges(1000) == [(str(tmp_path / "p0.tsv"), 80, 100)]  # its held-out tail
    write_rows(tmp_path / "p1.tsv", 100)
    f.poll()
    f.poll()
    write_rows(tmp_path / "p2.tsv", 100)
    f.poll()
    f.poll()  # until 150 rows: p2 came after the end
    assert m.books.queue.samples_expected == 160 and m.books.queue.ended
    assert m.kinds().count("file_arrived") == 2 and m.kinds()[-1] == "follow_end"
    assert f.lag(clock.t) == (160, 0.0)


def test_the_lag_is_the_rows_not_trained_and_the_age_of_the_oldest(tmp_path):
    m, f, clock = follower(tmp_path)
    write_rows(tmp_path / "p0.tsv", 100)
    f.poll()
    f.poll()
    clock.t = 30.0
    assert f.lag(clock.t) == (80, 30.0)


def test_a_restore_to_an_earlier_cut_queues_the_later_files_again(tmp_path):
    m, f, clock = follower(tmp_path)
    write_rows(tmp_path / "p0.tsv", 100)
    f.poll()
    f.poll()
    cut = m.books.cut({})
    write_rows(tmp_path / "p1.tsv", 100)
    f.poll()
    f.poll()
    m.books.restore(cut, new_generation=True)
    assert not m.books.queue.has(str(tmp_path / "p1.tsv"))
    f.poll()
    assert m.books.queue.has(str(tmp_path / "p1.tsv")) and m.books.queue.samples_expected == 160


def test_a_file_rewritten_after_it_was_taken_is_reported_not_trained_again(tmp_path, capsys):
    m, f, _ = follower(tmp_path)
    write_rows(tmp_path / "p0.tsv", 100)
    f.poll()
    f.poll()
    write_rows(tmp_path / "p0.tsv", 50, start=100)
    f.poll()
    f.poll()
    assert m.books.queue.samples_expected == 80
    (changed,) = [e for e in m.events.rows() if e.kind == "file_changed"]
    assert changed.fields["path"] == str(tmp_path / "p0.tsv") and changed.fields["size"] > changed.fields["was_size"]
    assert "changed after it was taken for training: not trained again" in capsys.readouterr().err


def test_a_restarted_master_takes_the_queued_files_as_they_were_queued(tmp_path):
    """Its plan starts empty; a file its restored queue holds is taken at the queued rows
    (and a size change since is reported)."""
    m, f, clock = follower(tmp_path)
    write_rows(tmp_path / "p0.tsv", 100)
    f.poll()
    f.poll()
    cut = m.books.cut({})
    write_rows(tmp_path / "p0.tsv", 50, start=100)
    m2, f2, _ = follower(tmp_path)
    m2.books.restore(cut, new_generation=True)
    f2.poll()
    f2.poll()
    assert m2.data.train_rows == {str(tmp_path / "p0.tsv"): 80} and m2.books.queue.samples_expected == 80
    assert m2.kinds() == ["file_changed"]


def test_a_bad_file_stops_the_job_naming_it(tmp_path):
    m, f, _ = follower(tmp_path, poll_s=0.05)
    (tmp_path / "p0.parquet").write_bytes(b"not parquet")
    f.start()
    for _ in range(200):
        if m.errors:
            break
        time.sleep(0.05)
    ((who, error),) = m.errors
    assert who == "data.paths" and error.startswith(f"{tmp_path / 'p0.parquet'}: not a readable Parquet file"), error


# -- the spec ---------------------------------------------------------------------------


def test_follow_spec_rules(tmp_path):
    spec = small_spec(tmp_path, data__follow={"until": "2026-12-08T10:00:00+00:00"})
    assert spec.data.follow.until.year == 2026 and spec.data.follow.ready == "stable_size" and spec.data.follow.poll_s == 30
    assert small_spec(tmp_path, data__follow={"until": 5000}).data.follow.until == 5000
    with pytest.raises(SpecError, match=r"data: epochs: a followed stream trains each file once"):
        small_spec(tmp_path, data__epochs=2, data__follow={})
    with pytest.raises(SpecError, match=r"data\.follow\.until"):
        small_spec(tmp_path, data__follow={"until": 0})
    with pytest.raises(SpecError, match=r"data\.follow\.ready"):
        small_spec(tmp_path, data__follow={"ready": "whenever"})
    assert os.path.basename(str(tmp_path))  # the spec names no file: nothing is read
