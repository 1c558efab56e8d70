"""Synchronous dense rounds: who a round waits for, when it closes, what it applies."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dlrover.ps.dense_ps import DenseParamServer
from dlrover.ps.dense_rounds import Caller, RoundRule, Rounds

SYNC = RoundRule(wait_for_all=True)
IGNORE_ONE = RoundRule(wait_for_all=False, stragglers=1)


def test_a_sync_round_closes_only_when_every_member_gave_a_gradient():
    r = Rounds(SYNC)
    assert r.push("a", "ga0") == 0 and r.push("b", "gb0") == 0
    assert r.close_ready() == [["ga0", "gb0"]]
    assert r.push("a", "ga1") == 1
    assert r.close_ready() == []  # b owes round 1
    assert r.push("b", "gb1") == 1
    assert r.close_ready() == [["ga1", "gb1"]] and r.is_closed(1)


def test_a_worker_that_leaves_is_not_waited_for_and_joins_again_with_its_next_push():
    r = Rounds(SYNC)
    r.push("a", "ga0"), r.push("b", "gb0"), r.close_ready()
    r.push("a", "ga1")
    r.leave("b")  # b parks: round 1 goes on without it
    assert r.close_ready() == [["ga1"]]
    assert r.push("b", "gb2") == 2 and r.close_ready() == []  # back in: a owes round 2 now
    assert r.push("a", "ga2") == 2 and r.close_ready() == [["gb2", "ga2"]]


def test_a_worker_that_left_after_giving_to_an_open_round_rejoins_at_the_next_one():
    r = Rounds(SYNC)
    r.push("a", "ga0"), r.push("b", "gb0"), r.close_ready()
    r.push("b", "gb1")
    r.leave("b")
    assert r.push("b", "gb2") == 2  # not a second gradient in round 1
    assert r.close_ready() == []
    r.push("a", "ga1")
    assert r.close_ready() == [["gb1", "ga1"]]


def test_a_dropped_worker_is_never_waited_for_again_and_its_late_push_is_ignored():
    r = Rounds(SYNC)
    r.push("a", "ga0"), r.push("b", "gb0"), r.close_ready()
    r.push("a", "ga1")
    r.drop("b")
    assert r.close_ready() == [["ga1"]]
    assert r.push("b", "gb1") is None and r.ignored == 0  # not counted: its replacement redoes the batch


def test_coded_ignore_closes_without_the_slowest_and_drops_its_late_gradient():
    r = Rounds(IGNORE_ONE)
    for w in "abc":
        r.push(w, f"g{w}0")
    r.close_ready()
    r.push("a", "ga1")
    assert r.close_ready() == []  # two members still owe round 1
    r.push("b", "gb1")
    assert r.close_ready() == [["ga1", "gb1"]]  # c is the one straggler the round may go without
    assert r.push("c", "gc1") is None and r.ignored == 1  # late: dropped
    assert r.push("c", "gc2") == 2  # and c goes on with the open round


def test_a_round_with_no_gradient_never_closes_even_with_no_member_owing():
    r = Rounds(SYNC)
    r.leave("a")
    assert r.close_ready() == [] and r.next_round == 0


def _in_thread(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def test_server_steps_once_per_round_with_the_mean_and_serves_each_workers_calls_in_order():
    ps = DenseParamServer(np.zeros(4, dtype=np.float32), {"name": "sgd", "lr": 1.0}, rule=SYNC)
    replies: dict[str, tuple] = {}

    def push(name: str, seq: int, g: float) -> None:
        replies[name] = ps.push_pull(np.full(4, g, dtype=np.float32), (0, 10 * seq + ord(name)), Caller(name, "run-1", seq))

    push("a", 0, 1.0)  # a alone is the set: its round closes at once
    assert ps.version == 1 and np.allclose(replies["a"][1], -1.0)
    b = _in_thread(push, "b", 0, 3.0)  # b joins at round 1, which a owes
    b.join(timeout=0.3)
    assert b.is_alive()
    push("a", 1, 5.0)
    b.join(timeout=5)
    assert not b.is_alive() and ps.version == 2 and ps.updates == 3
    np.testing.assert_allclose(replies["a"][1], -1.0 - 4.0)  # one step with the mean of 3 and 5
    np.testing.assert_array_equal(replies["a"][1], replies["b"][1])

    leave = _in_thread(ps.leave, Caller("a", "run-1", 3))  # sent after a's push number 2: waits for it
    b = _in_thread(push, "b", 1, 1.0)
    b.join(timeout=0.3)
    assert b.is_alive() and leave.is_alive()  # a is still in the set: round 2 waits for it
    push("a", 2, 1.0)
    for t in (b, leave):
        t.join(timeout=5)
        assert not t.is_alive()
    assert ps.version == 3 and ps.stats().rounds == 3


def test_server_skips_a_batch_applied_before_within_a_round():
    ps = DenseParamServer(np.zeros(2, dtype=np.float32), {"name": "sgd", "lr": 1.0}, rule=SYNC)
    ps.push_pull(np.ones(2, dtype=np.float32), (5, 0), Caller("a", "run-1", 0))
    ps.push_pull(np.ones(2, dtype=np.float32), (5, 0), Caller("a", "run-1", 1))  # a replayed batch
    assert ps.version == 1 and ps.duplicates == 1 and ps.stats().rounds == 1  # a round of replays takes no step


def test_dropping_a_worker_frees_a_round_waiting_for_it():
    ps = DenseParamServer(np.zeros(2, dtype=np.float32), {"name": "sgd", "lr": 1.0}, rule=SYNC)
    ps.push_pull(np.ones(2, dtype=np.float32), None, Caller("a", "run-1", 0))  # a alone: round 0 closes
    b = _in_thread(ps.push_pull, np.ones(2, dtype=np.float32), None, Caller("b", "run-1", 0))  # round 1 waits for a
    b.join(timeout=0.3)
    assert b.is_alive()
    ps.drop("a")  # a died: the master forgets it
    b.join(timeout=5)
    assert not b.is_alive() and ps.version == 2


def test_a_rollback_voids_open_rounds_and_releases_the_pushes_waiting_on_them():
    ps = DenseParamServer(np.zeros(2, dtype=np.float32), {"name": "sgd", "lr": 1.0}, rule=SYNC)
    ps.push_pull(np.ones(2, dtype=np.float32), (0, 0), Caller("a", "run-1", 0))
    checkpoint = ps.state()
    b = _in_thread(ps.push_pull, np.ones(2, dtype=np.float32), (0, 1), Caller("b", "run-1", 0))  # waits for a, who died unforgotten
    b.join(timeout=0.3)
    assert b.is_alive()
    ps.set_state(checkpoint)
    b.join(timeout=5)
    assert not b.is_alive() and ps.version == 1  # b's gradient from after the cut was not applied
    ps.push_pull(np.ones(2, dtype=np.float32), (0, 1), Caller("b", "run-2", 0))  # the runs after the rollback start afresh
    assert ps.version == 2 and ps.updates == 2


def test_a_call_of_a_workers_earlier_run_is_void_once_its_next_run_began():
    ps = DenseParamServer(np.zeros(2, dtype=np.float32), {"name": "sgd", "lr": 1.0}, rule=SYNC)
    ps.push_pull(np.ones(2, dtype=np.float32), None, Caller("a", "run-1", 0))
    ps.push_pull(np.ones(2, dtype=np.float32), None, Caller("a", "run-2", 0))  # a's next run (after an abort)
    ps.leave(Caller("a", "run-1", 1))  # the old run's leave, arriving late: void
    b = _in_thread(ps.push_pull, np.ones(2, dtype=np.float32), None, Caller("b", "run-1", 0))
    b.join(timeout=0.3)
    assert b.is_alive()  # a is still in the rounds: round 2 waits for it
    ps.push_pull(np.ones(2, dtype=np.float32), None, Caller("a", "run-2", 1))
    b.join(timeout=5)
    assert not b.is_alive() and ps.version == 3


@pytest.mark.parametrize("mode,rule", [("async", None), ("sync", SYNC), ("coded", RoundRule(False, 2))])
def test_each_dense_sync_mode_has_its_rule(mode, rule):
    assert RoundRule.of(mode, 2) == rule
