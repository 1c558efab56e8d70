import json
from collections import Counter

import pytest

from dlrover.data.shards import Shard, ShardQueue

FILES = [("a.tsv", 1000), ("b.tsv", 250), ("c.tsv", 0), ("d.tsv", 301)]


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def drain(q: ShardQueue, owner: str = "w0") -> list[Shard]:
    """Lease and complete everything, returning the shards in hand-out order."""
    out = []
    while (s := q.next(owner)) is not None:
        q.done(s.shard_id, owner, s.rows)
        out.append(s)
    return out


def rows_by_file(shards: list[Shard]) -> Counter:
    seen: Counter = Counter()
    for s in shards:
        for r in range(s.start, s.stop):
            seen[(s.path, r)] += 1
    return seen


def test_every_row_handed_out_exactly_once_per_epoch():
    q = ShardQueue(FILES, shard_rows=128, epochs=3, shuffle_seed=7)
    shards = drain(q)
    assert all(0 < s.rows <= 128 for s in shards)
    for epoch in range(3):
        seen = rows_by_file([s for s in shards if s.epoch == epoch])
        expected = {(p, r) for p, n in FILES for r in range(n)}
        assert set(seen) == expected
        assert set(seen.values()) == {1}
    assert len({s.shard_id for s in shards}) == len(shards) == q.total_shards
    assert q.finished and q.todo_count == 0 and q.doing_count == 0


def test_epochs_are_handed_out_in_order_and_shuffled_per_epoch():
    q = ShardQueue(FILES, shard_rows=100, epochs=3, shuffle_seed=1)
    shards = drain(q)
    epochs = [s.epoch for s in shards]
    assert epochs == sorted(epochs)
    orders = [[(s.path, s.start) for s in shards if s.epoch == e] for e in range(3)]
    assert orders[0] != orders[1] or orders[1] != orders[2]

    ordered = drain(ShardQueue(FILES, shard_rows=100, epochs=1, shuffle_seed=None))
    assert [(s.path, s.start) for s in ordered] == sorted(
        (s.path, s.start) for s in ordered
    )


def test_next_epoch_waits_until_all_shards_handed_out_not_done():
    q = ShardQueue([("a", 300)], shard_rows=100, epochs=2, shuffle_seed=None)
    first = [q.next("w0") for _ in range(3)]
    assert [s.epoch for s in first] == [0, 0, 0]
    # nothing done yet, but all of epoch 0 is out: epoch 1 may start
    nxt = q.next("w1")
    assert nxt is not None and nxt.epoch == 1


def test_requeue_owner_returns_shards_to_front_and_they_are_redone():
    clock = FakeClock()
    q = ShardQueue(FILES, shard_rows=200, epochs=1, shuffle_seed=3, clock=clock)
    a1, b1, a2 = q.next("a"), q.next("b"), q.next("a")
    assert q.doing_owners() == {a1.shard_id: "a", b1.shard_id: "b", a2.shard_id: "a"}
    back = q.requeue_owner("a")
    assert [s.shard_id for s in back] == [a1.shard_id, a2.shard_id]
    assert q.doing_count == 1
    # requeued shards come out first, in their original order
    assert q.next("c").shard_id == a1.shard_id
    assert q.next("c").shard_id == a2.shard_id
    with pytest.raises(ValueError):
        q.done(a1.shard_id, "a", a1.rows)  # the dead owner no longer holds it
    q.done(a1.shard_id, "c", a1.rows)
    q.done(a2.shard_id, "c", a2.rows)
    q.done(b1.shard_id, "b", b1.rows)
    rest = drain(q, "c")
    everything = [a1, a2, b1] + rest
    assert set(rows_by_file(everything).values()) == {1}
    assert q.finished
    assert q.requeue_owner("nobody") == []


def test_a_lease_renewed_by_progress_does_not_expire():
    clock = FakeClock()
    q = ShardQueue(FILES, shard_rows=500, epochs=1, clock=clock)
    q.next("busy")
    q.next("frozen")
    clock.t = 108.0
    q.renew("busy")
    clock.t = 111.0
    assert q.expired(timeout_s=10.0) == ["frozen"]
    assert q.expired(timeout_s=20.0) == []


def test_expired_owners_come_oldest_lease_first_and_requeue_gives_their_shards_back():
    clock = FakeClock()
    q = ShardQueue(FILES, shard_rows=500, epochs=1, clock=clock)
    clock.t = 101.0
    later = q.next("later")
    clock.t = 100.5
    first = q.next("first")
    clock.t = 200.0
    assert q.expired(timeout_s=10.0) == ["first", "later"]
    assert [s.shard_id for s in q.requeue_owner("later")] == [later.shard_id]
    assert q.expired(timeout_s=10.0) == ["first"]
    assert q.next("x").shard_id == later.shard_id
    assert first.shard_id in q.doing_owners()


def test_done_is_idempotent_and_rejects_wrong_owner():
    q = ShardQueue(FILES, shard_rows=100, epochs=1)
    s = q.next("w0")
    with pytest.raises(ValueError):
        q.done(s.shard_id, "w1", s.rows)
    with pytest.raises(ValueError):
        q.done(s.shard_id, "w0", s.rows + 1)
    q.done(s.shard_id, "w0", s.rows)
    q.done(s.shard_id, "w0", s.rows)  # duplicate report (retry)
    assert q.done_count == 1 and q.samples_done == s.rows
    with pytest.raises(ValueError):
        q.done(s.shard_id, "w1", s.rows)
    other = q.next("w0")
    assert other.shard_id != s.shard_id
    never_leased = next(i for i in range(q.total_shards) if i not in (s.shard_id, other.shard_id))
    with pytest.raises(ValueError):
        q.done(never_leased, "w0", 1)


def test_samples_accounting():
    q = ShardQueue(FILES, shard_rows=64, epochs=2)
    total = sum(n for _, n in FILES)
    assert q.samples_expected == 2 * total
    trained = 0
    while (s := q.next("w")) is not None:
        got = s.rows - (1 if s.shard_id % 5 == 0 else 0)  # a few skipped bad lines
        q.done(s.shard_id, "w", got)
        trained += got
    assert q.samples_done == trained < q.samples_expected
    assert q.todo_count + q.doing_count + q.done_count == q.total_shards


def test_counts_include_unopened_epochs():
    q = ShardQueue([("a", 1000)], shard_rows=100, epochs=3)
    assert (q.todo_count, q.doing_count, q.done_count) == (30, 0, 0)
    q.next("w")
    assert (q.todo_count, q.doing_count, q.done_count) == (29, 1, 0)
    assert not q.finished


def test_state_dict_round_trip_continues_identically():
    clock = FakeClock()
    q = ShardQueue(FILES, shard_rows=90, epochs=2, shuffle_seed=5, clock=clock)
    leased = [q.next(f"w{i % 2}") for i in range(6)]
    for s in leased[:3]:
        q.done(s.shard_id, f"w{leased.index(s) % 2}", s.rows)
    clock.t = 130.0
    state = json.loads(json.dumps(q.state_dict()))  # must be JSON-serialisable

    clock2 = FakeClock()
    clock2.t = 5.0
    r = ShardQueue.from_state_dict(state, clock=clock2)
    counts = lambda x: (x.todo_count, x.doing_count, x.done_count)  # noqa: E731
    assert counts(r) == counts(q)
    assert r.samples_done == q.samples_done
    assert r.doing_owners() == q.doing_owners()
    # lease ages survive the move to a different clock
    assert r.lease_ages() == q.lease_ages() and q.lease_ages()
    rest_q = [(s.shard_id, s.path, s.start) for s in drain(q, "z")]
    rest_r = [(s.shard_id, s.path, s.start) for s in drain(r, "z")]
    assert rest_q == rest_r and rest_q


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        ShardQueue(FILES, shard_rows=0, epochs=1)
    with pytest.raises(ValueError):
        ShardQueue(FILES, shard_rows=10, epochs=0)
    empty = ShardQueue([("a", 0)], shard_rows=10, epochs=2)
    assert empty.next("w") is None and empty.finished


def test_cut_turns_leases_into_done_or_offsets():
    """A checkpoint's cut: nothing stays leased; a half-trained shard resumes after the
    rows the model holds, and finishing it counts every row once."""
    q = ShardQueue([("a", 100)], shard_rows=40, epochs=1, shuffle_seed=None)
    s0, s1, s2 = q.next("w0"), q.next("w1"), q.next("w0")  # rows 0-40, 40-80, 80-100
    state = q.cut({s0.shard_id: (40, 40), s1.shard_id: (25, 24)})  # s1: one bad line among 25
    back = ShardQueue.from_state_dict(state)
    assert back.doing_count == 0 and back.done_count == 1 and back.samples_done == 40
    first = back.next("w2")
    assert (first.shard_id, first.start, first.stop) == (s1.shard_id, 65, 80)
    back.done(first.shard_id, "w2", 15)
    assert back.samples_done == 40 + 24 + 15
    nxt = back.next("w2")
    assert (nxt.shard_id, nxt.start) == (s2.shard_id, 80)  # untouched lease: whole shard again
    back.done(nxt.shard_id, "w2", 20)
    assert back.finished and back.samples_done == 99


def test_a_dead_workers_shard_resumes_after_the_progress_it_reported():
    q = ShardQueue([("a.tsv", 1000)], shard_rows=1000, epochs=1, shuffle_seed=None)
    s = q.next("w0")
    q.progress(s.shard_id, "w0", lines=512, rows=510)  # 2 bad lines in the applied prefix
    (back,) = q.requeue_owner("w0")
    assert (back.start, back.stop, back.skipped) == (512, 1000, 512)
    again = q.next("w1")
    assert again == back
    q.done(again.shard_id, "w1", again.rows)
    assert q.finished and q.samples_done == 510 + 488


def test_progress_of_a_worker_not_holding_the_lease_is_ignored():
    q = ShardQueue([("a.tsv", 1000)], shard_rows=1000, epochs=1, shuffle_seed=None)
    s = q.next("w0")
    q.progress(s.shard_id, "w-gone", lines=512, rows=512)
    (back,) = q.requeue_owner("w0")
    assert back.start == 0 and back.skipped == 0


def test_a_shard_wholly_applied_before_its_worker_died_is_done_not_redone():
    q = ShardQueue([("a.tsv", 600)], shard_rows=300, epochs=1, shuffle_seed=None)
    a, b = q.next("w0"), q.next("w0")
    q.progress(a.shard_id, "w0", lines=300, rows=300)  # every push acknowledged, not reported done
    back = q.requeue_owner("w0")
    assert [s.shard_id for s in back] == [b.shard_id]
    assert q.done_count == 1 and q.samples_done == 300


def test_progress_past_the_shard_is_rejected():
    q = ShardQueue([("a.tsv", 100)], shard_rows=100, epochs=1, shuffle_seed=None)
    s = q.next("w0")
    with pytest.raises(ValueError, match="outside shard"):
        q.progress(s.shard_id, "w0", lines=101, rows=101)
    with pytest.raises(ValueError, match="outside shard"):
        q.progress(s.shard_id, "w0", lines=10, rows=11)


def test_bad_lines_in_a_resumed_prefix_are_counted_once_the_shard_is_done():
    q = ShardQueue([("a.tsv", 1000)], shard_rows=1000, epochs=1, shuffle_seed=None)
    s = q.next("w0")
    q.progress(s.shard_id, "w0", lines=512, rows=510)
    q.requeue_owner("w0")
    rest = q.next("w1")
    q.done(rest.shard_id, "w1", rest.rows)
    assert q.prefix_bad_lines == 2 and q.samples_done == 510 + 488


def test_progress_never_moves_back_when_reports_arrive_out_of_order():
    q = ShardQueue([("a.tsv", 1000)], shard_rows=1000, epochs=1, shuffle_seed=None)
    s = q.next("w0")
    q.progress(s.shard_id, "w0", lines=200, rows=200)
    q.progress(s.shard_id, "w0", lines=100, rows=100)  # an older, non-blocking report
    (back,) = q.requeue_owner("w0")
    assert back.skipped == 200


def test_lines_since_a_cut_are_the_lines_trained_after_it_and_nothing_before():
    q = ShardQueue([("a", 100), ("b", 50)], shard_rows=40, epochs=1, shuffle_seed=None)
    s0, s1 = q.next("w0"), q.next("w1")  # a 0-40, a 40-80
    cut = ShardQueue.from_state_dict(q.cut({s0.shard_id: (40, 40), s1.shard_id: (10, 10)}))
    q.done(s0.shard_id, "w0", 40)
    q.progress(s1.shard_id, "w1", lines=30, rows=29)  # one bad line
    q.requeue_owner("w1")
    s2 = q.next("w0")  # s1 again, after line 30
    assert s2.shard_id == s1.shard_id
    q.done(s2.shard_id, "w0", s2.rows)
    s3 = q.next("w0")  # a 80-100, then requeued with 5 lines applied
    q.progress(s3.shard_id, "w0", lines=5, rows=5)
    q.requeue_owner("w0")
    assert q.lines_since(cut) == [("a", 50, 80), ("a", 80, 85)]


def test_applied_lines_of_a_leased_shard_are_not_known():
    q = ShardQueue([("a", 100)], shard_rows=40, epochs=1, shuffle_seed=None)
    s = q.next("w0")
    with pytest.raises(ValueError, match="leased"):
        q.applied_lines(s.shard_id)
