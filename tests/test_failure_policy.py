"""The failure policy's decisions, as data: what each loss costs under each setting."""

from __future__ import annotations

from dlrover.faults.policy import Fail, FailurePolicy, RecoverPs, ReplaceWorkers, RestartAll
from dlrover.faults.records import LostPs


def test_a_lost_worker_is_replaced_under_live_recovery_and_restarts_everything_otherwise():
    assert FailurePolicy().worker_lost(("w0",)) == ReplaceWorkers(("w0",))
    assert FailurePolicy(on_failure="restart").worker_lost(("w0",)) == RestartAll()


def test_a_lost_embedding_ps_is_recovered_partially_by_default_and_by_rollback_when_asked():
    lost = LostPs((1,))
    assert FailurePolicy().ps_lost(lost) == RecoverPs(lost, partial=True)
    assert FailurePolicy(ps="rollback").ps_lost(lost) == RecoverPs(lost, partial=False)


def test_a_lost_dense_ps_always_rolls_the_job_back():
    lost = LostPs((), dense=True)
    assert FailurePolicy().ps_lost(lost) == RecoverPs(lost, partial=False)


def test_a_restart_policy_restarts_on_a_ps_loss_too():
    assert FailurePolicy(on_failure="restart").ps_lost(LostPs((0,))) == RestartAll()


def test_the_job_fails_only_past_the_limit_naming_it_and_the_last_failure():
    policy = FailurePolicy(max_failures=2)
    assert policy.after(2, "worker_death of w0") is None
    fail = policy.after(3, "worker_death of w1")
    assert fail == Fail("3 failures (checkpoint.max_failures: 2); last: worker_death of w1")
