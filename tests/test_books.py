"""The job's books without Ray: what a worker's death, a parked eviction and a rollback
leave behind, on a fake clock."""

from __future__ import annotations

from dlrover.data.shards import ShardQueue
from dlrover.master.books import ShardBooks


def books(rows: int = 2000, shard_rows: int = 1000) -> ShardBooks:
    return ShardBooks(ShardQueue([("a.tsv", rows)], shard_rows=shard_rows, epochs=1, shuffle_seed=None, clock=lambda: 0.0), clock=lambda: 0.0)


def test_a_worker_dead_unparked_leaves_its_shard_uncertain_until_it_is_done():
    b = books()
    s = b.next_shard("w0", 0)
    b.progress("w0", {s.shard_id: (512, 512)}, 0)
    b.retire("w0")  # died: batches past 512 may be applied on some PS
    assert not b.settled()
    again = b.next_shard("w1", 0)
    assert again.shard_id == s.shard_id and again.skipped == 512
    b.shard_done("w1", again.shard_id, again.rows, 0, 0)
    assert b.settled()


def test_a_parked_worker_stopped_leaves_nothing_uncertain():
    b = books()
    s = b.next_shard("w0", 0)
    b.progress("w0", {s.shard_id: (512, 512)}, 0)
    b.retire("w0", parked=True)
    assert b.settled()


def test_a_rollback_forgets_what_was_uncertain_and_what_was_done_after_the_cut():
    b = books()
    cut = b.cut({})
    a = b.next_shard("w0", 0)
    b.shard_done("w0", a.shard_id, a.rows, 0, 0)
    c = b.next_shard("w1", 0)
    b.retire("w1")
    assert not b.settled()
    b.restore(cut, new_generation=True)
    assert b.settled() and b.take_done() == []  # shard a is open again: its applied logs must stay
    assert b.next_shard("w2", 0) == "stop"  # a run of the old generation
    assert b.next_shard("w2", 1).shard_id in (a.shard_id, c.shard_id)


def test_progress_of_a_stale_generation_or_a_retired_worker_is_ignored():
    b = books()
    s = b.next_shard("w0", 0)
    b.progress("w0", {s.shard_id: (512, 512)}, 7)  # another generation
    b.retire("w0", parked=True)
    assert b.next_shard("w1", 0).skipped == 0


def test_requeue_all_sends_every_lease_back_from_its_progress_under_a_new_generation():
    b = books(rows=3000)
    s0, s1 = b.next_shard("w0", 0), b.next_shard("w1", 0)
    b.progress("w0", {s0.shard_id: (300, 300)}, 0)
    back = b.requeue_all()
    assert sorted(s.shard_id for s in back) == sorted([s0.shard_id, s1.shard_id])
    assert not b.settled()  # a PS may hold batches past the progress
    assert b.next_shard("w0", 0) == "stop"  # the aborted runs count for nothing
    again = {s.shard_id: s for s in (b.next_shard("w0", 1), b.next_shard("w1", 1))}
    assert again[s0.shard_id].skipped == 300 and again[s1.shard_id].skipped == 0
    assert not b.queue.finished
