"""Failure detection and recovery of a worker (``dlrover.master.recovery``, ``liveness``,
``rollback``), driven through a whole JobMaster on a fake cluster (``tests/fake_job.py``):
no Ray, the real books, states, recovery, checkpoints and summary.

The fake clock starts at 1000.0 and each wait of the job loop moves it on; job times
(``at_s`` and friends) count from the master's start, just after 1000.0."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from conftest import small_spec
from fake_cluster import OPEN, FakeHandle
from fake_job import FakeJobCluster, FakeWorker, event_rows, fake_cluster, fake_master, report
from dlrover.ids import ProcessInfo
from dlrover.master.cluster import ActorDied, TaskFailed
from dlrover.master.states import TERMINAL
from dlrover.worker.worker import Worker

MB = 2**20
W0, W1, W2, W3 = (f"fake-job/worker-{i}" for i in range(4))


# -- helpers ---------------------------------------------------------------------------
def states_of(master) -> list[str]:
    return [e["state"] for e in event_rows(master) if e["kind"] == "state"]


def events_of(master, kind: str) -> list[dict]:
    return [e for e in event_rows(master) if e["kind"] == kind]


def handle_named(cluster: FakeJobCluster, name: str) -> FakeHandle:
    """The handle an actor of that name had, alive or dead."""
    (handle,) = [h for h in cluster.actors if h.name == name]
    return handle


def record_kills(cluster: FakeJobCluster) -> list[str]:
    """The names of the actors the cluster kills from now on while the job is not over
    (at its end the launcher kills every actor left)."""
    killed: list[str] = []
    kill = cluster.kill

    def recorded(handle: FakeHandle) -> None:
        if not handle.dead and cluster.master.obj.status not in TERMINAL:
            killed.append(handle.name)
        kill(handle)

    cluster.kill = recorded  # type: ignore[method-assign]
    return killed


def use_workers(cluster: FakeJobCluster, classes: dict[str, type]) -> None:
    """Workers named in ``classes`` are made of that class; the others are FakeWorkers."""
    cluster.make[Worker] = lambda name, *rest: classes.get(name, FakeWorker)(cluster, name, *rest)


def two_nodes(cluster: FakeJobCluster) -> None:
    cluster.nodes = {"node-0": {"CPU": 16.0, "memory": 64.0 * 2**30}, "node-1": {"CPU": 16.0, "memory": 64.0 * 2**30}}


def fail_run(cluster: FakeJobCluster, name: str, cause: BaseException) -> None:
    """Worker ``name``'s open run fails with ``cause`` raised in its code (the actor lives)."""
    worker = cluster.by_name(name).obj
    worker.open_run().resolve(error=TaskFailed("run", f"{type(cause).__name__}: {cause}", cause).as_instanceof_cause())


def check_every_sample_trained(summary: dict) -> None:
    assert summary["status"] == "succeeded", summary.get("reason")
    assert summary["samples_trained"] == summary["samples_expected"] > 0


# -- workers that misbehave in one way each ----------------------------------------------
class _MasterSeen:
    """The master as a worker sees it, with ``next_shard`` giving one shard per round
    (``one_shard``) and reports claiming ``rss_mb``."""

    def __init__(self, master: FakeHandle, one_shard: bool, rss_mb: float | None) -> None:
        self.obj, self._master, self._one_shard, self._rss_mb, self._given = master.obj, master, one_shard, rss_mb, False

    def sync(self, name: str, *args: Any) -> Any:
        if name == "next_shard" and self._one_shard:
            if self._given:
                return None  # nothing more this round: the run stays open until the next wait
            self._given = True
        if name == "report" and self._rss_mb is not None:
            args = (args[0], replace(args[1], rss_mb=self._rss_mb))
        return self._master.sync(name, *args)


class Plodding(FakeWorker):
    """Trains one shard per cluster wait: a job of these lasts a few ticks of the loop."""

    rss_mb: float | None = None

    def train(self) -> dict | None:
        real, self.master = self.master, _MasterSeen(self.master, one_shard=True, rss_mb=self.rss_mb)
        try:
            return super().train()
        finally:
            self.master = real


class Bloated(Plodding):
    """A plodding worker whose every report says 4 GB of RSS."""

    rss_mb = 4096.0


class FailingProbe(Plodding):
    """Trains (plodding); once started, its liveness probe raises in its own code."""

    pings = 0

    def ping(self) -> ProcessInfo:
        self.pings += 1
        if self.pings > 1:  # the launch's start-up check passed
            raise RuntimeError("probe handler broken")
        return super().ping()


class Chatty(FakeWorker):
    """Stalls (the cluster's ``stall``) yet keeps reporting at every wait: its leases
    never expire, only its probe can tell it is stuck."""

    def poke(self) -> None:
        super().poke()
        if self.stalled and not self.handle.dead and self.open_run() is not None:
            self.master.sync("report", self.name, report(self.samples))


class SlowStarter(FakeWorker):
    """A run that trains its first step at the cluster's next wait, not at once (a
    replacement still starting up when its predecessor's failure is recorded)."""

    def run(self, generation: int = 0) -> Any:
        self.generation, self.aborted, self.samples, self.stalled, self.started = generation, False, 0, False, False
        return OPEN

    def poke(self) -> None:
        if not self.started and not self.handle.dead and self.open_run() is not None:
            self.started = True
            self.master.sync("first_step", self.name)
        super().poke()


class DiesOnAbort(FakeWorker):
    """Its process dies when it is told to stop."""

    def abort(self) -> None:
        self.cluster.kill(self.handle)


class RunFailsOnAbort(FakeWorker):
    """Told to stop, its run ends failed on a call to a PS (the worker itself is fine),
    raised as Ray's ``get`` raises it: a RayTaskError that is also the cause's class."""

    def abort(self) -> None:
        self.aborted = True
        self.open_run().resolve(error=TaskFailed("run", "ActorDied: ps-0", ActorDied(error_msg="ps-0 is dead")).as_instanceof_cause())


NODE_OF: dict[str, str] = {W0: "node-1"}


class OnNode(FakeWorker):
    """Answers its probe from the node it was placed on (``NODE_OF`` for worker-0)."""

    def ping(self) -> ProcessInfo:
        return ProcessInfo(self.pid, NODE_OF.get(self.name, self.handle.options["node"]))


# -- the failure limit -------------------------------------------------------------------
def test_a_worker_death_past_max_failures_ends_the_job_failed_with_the_limit_as_its_reason(synth_dir, tmp_path):
    cluster = fake_cluster()
    cluster.stall[W0] = 2  # takes two shards, then trains no more: its run stays open
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name(W0)))
    master, _ = fake_master(small_spec(synth_dir, checkpoint__max_failures=0), tmp_path, cluster)
    summary = master.run().to_json()
    assert summary["status"] == "failed"
    assert "checkpoint.max_failures: 0" in summary["reason"] and f"worker_death of {W0}" in summary["reason"]
    assert states_of(master)[-1] == "Failed" and "Evaluating" not in states_of(master)
    assert events_of(master, "state")[-1]["reason"] == summary["reason"]
    (end,) = events_of(master, "job_end")
    assert end["status"] == "failed" and end["reason"] == summary["reason"]
    (fatal,) = summary["failures"]
    assert fatal["kind"] == "worker_death" and fatal["recovered_s"] is None  # the job never trained again after it
    assert master.books.stop_requested


def test_failures_up_to_max_failures_are_recovered_and_the_next_one_fails_the_job(synth_dir, tmp_path):
    cluster = fake_cluster()
    cluster.stall[W0] = 2
    cluster.stall[W2] = 1  # worker-0's replacement stalls too
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name(W0)))
    cluster.at(1010.0, lambda: cluster.kill(cluster.by_name(W2)))
    master, _ = fake_master(small_spec(synth_dir, checkpoint__max_failures=1), tmp_path, cluster)
    summary = master.run().to_json()
    assert summary["status"] == "failed"
    assert summary["reason"].startswith("2 failures (checkpoint.max_failures: 1)") and W2 in summary["reason"]
    first, second = master.failures
    assert (first.actor, first.replacement, second.actor) == (W0, W2, W2)
    assert first.recovered_s is not None and second.recovered_s is None
    assert states_of(master)[-1] == "Failed"


# -- hangs -------------------------------------------------------------------------------
def test_a_stalled_worker_whose_leases_expire_is_declared_hung_killed_and_its_shards_trained_by_a_replacement(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    cluster.stall[W0] = 2
    master, _ = fake_master(small_spec(synth_dir, train__liveness_timeout_s=5), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    hung = handle_named(cluster, W0)
    assert killed == [W0] and len(hung.obj.leased) == 2
    (expired,) = events_of(master, "lease_expired")
    (declared,) = events_of(master, "hung")
    assert expired["actor"] == declared["actor"] == W0 and declared["timeout_s"] == 5.0 and declared["silent_s"] >= 5.0
    (failure,) = master.failures
    assert failure.kind.value == "worker_hang" and failure.actor == W0
    assert failure.detected_s - failure.at_s >= 5.0  # hung since its lease was last renewed, not since it was caught
    assert failure.shards_requeued == 2
    assert ("node-0", hung.obj.pid) in cluster.processes_killed  # its probe had answered: the process is killed for real
    replacement = handle_named(cluster, failure.replacement).obj
    assert set(hung.obj.leased) <= set(replacement.shards_done)


def test_a_worker_whose_probe_goes_unanswered_is_declared_hung_though_its_reports_keep_its_leases_fresh(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    use_workers(cluster, {W0: Chatty})
    cluster.stall[W0] = 2
    cluster.at(1003.0, lambda: cluster.hold(W0, "ping"))  # answered before; from now on its probes stay open
    master, _ = fake_master(small_spec(synth_dir, train__liveness_timeout_s=5), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert events_of(master, "lease_expired") == []
    (declared,) = events_of(master, "hung")
    assert declared["actor"] == W0 and declared["silent_s"] > 5.0
    (failure,) = master.failures
    assert failure.kind.value == "worker_hang" and failure.at_s >= 3.0  # silent since its first unanswered probe
    frozen = handle_named(cluster, W0)
    assert killed == [W0] and cluster.processes_killed == [("node-0", frozen.obj.pid)]


def test_a_probe_that_fails_in_the_worker_s_code_is_asked_again_and_is_no_failure(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    use_workers(cluster, {W0: FailingProbe, W1: Plodding})
    master, _ = fake_master(small_spec(synth_dir, train__liveness_timeout_s=5), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert master.failures == [] and events_of(master, "hung") == [] and killed == []
    assert handle_named(cluster, W0).obj.pings >= 3  # probed again after each failed probe
    assert len(handle_named(cluster, W0).obj.shards_done) >= 2  # and it trained on meanwhile


def test_a_gap_in_the_master_s_own_ticks_renews_every_lease_instead_of_expiring_them(synth_dir, tmp_path):
    cluster = fake_cluster()
    cluster.stall[W0] = 2

    def master_blocked_for_a_minute() -> None:
        cluster.clock.now += 60.0

    cluster.at(1002.0, master_blocked_for_a_minute)
    master, _ = fake_master(small_spec(synth_dir, train__liveness_timeout_s=5), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (failure,) = master.failures  # the stalled worker is still caught, but only 5 s after the gap
    assert failure.kind.value == "worker_hang" and failure.actor == W0
    assert failure.at_s > 60.0 and failure.detected_s - failure.at_s >= 5.0


# -- memory ------------------------------------------------------------------------------
def test_a_worker_over_its_memory_limit_is_oom_killed_and_its_replacement_gets_more_memory(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    use_workers(cluster, {W0: Bloated, W1: Plodding})
    master, _ = fake_master(small_spec(synth_dir, resources__enforce_memory=True), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (kill,) = events_of(master, "oom_kill")
    assert (kill["actor"], kill["rss_mb"], kill["limit_mb"]) == (W0, 4096.0, 2048)
    assert killed == [W0]
    (failure,) = master.failures
    assert failure.kind.value == "oom_kill" and failure.actor == W0 and summary["oom_kills"] == 1
    assert failure.at_s == round(master.recovery.oom_killed[W0], 3) <= failure.detected_s  # failed when the master killed it
    raised = master.control.memory_after_oom(2048)
    assert raised > 2048
    assert handle_named(cluster, failure.replacement).options["memory"] == raised * MB
    assert handle_named(cluster, W1).options["memory"] == 2048 * MB  # only the replacement grows


def test_without_memory_enforcement_a_worker_over_its_limit_trains_on(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    use_workers(cluster, {W0: Bloated, W1: Plodding})
    master, _ = fake_master(small_spec(synth_dir, resources__enforce_memory=False), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert events_of(master, "oom_kill") == [] and master.failures == [] and killed == []
    assert master.books.worker_reports().get(W0) is None or master.books.worker_reports()[W0].rss_mb == 4096.0
    assert len(handle_named(cluster, W0).obj.shards_done) >= 2  # it kept training past the ticks that saw its RSS


# -- how a failure is told and recorded ---------------------------------------------------
def test_a_chaos_kill_of_worker_0_is_recorded_as_failed_when_injected_not_when_detected(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    cluster.stall[W0] = 2
    chaos = [{"at_s": 3, "action": "kill", "target": "worker:0"}, {"at_s": 2, "action": "slow", "target": "worker:1", "factor": 2.0}]
    master, _ = fake_master(small_spec(synth_dir, chaos=chaos), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    slow, kill = events_of(master, "chaos")
    assert (kill["action"], kill["actor"], slow["action"], slow["actor"]) == ("kill", W0, "slow", W1)
    assert killed == [W0]
    (failure,) = master.failures  # a slow worker is no failure
    assert failure.kind.value == "worker_death" and failure.actor == W0
    assert failure.at_s <= kill["job_s"] and failure.at_s < failure.detected_s
    assert ("set_chaos", (), {"slowdown": 2.0}) in handle_named(cluster, W1).calls


def test_a_worker_whose_node_is_gone_is_recorded_as_a_node_loss(synth_dir, tmp_path):
    cluster = fake_cluster()
    two_nodes(cluster)
    use_workers(cluster, {W0: OnNode})
    cluster.stall[W0] = 2

    def lose_node_1() -> None:
        del cluster.nodes["node-1"]
        cluster.kill(cluster.by_name(W0))

    cluster.at(1005.0, lose_node_1)
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (failure,) = master.failures
    assert (failure.kind.value, failure.actor, failure.node) == ("node_loss", W0, "node-1")


def test_a_chaos_node_kill_records_its_victims_as_node_losses_while_the_node_lives(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    two_nodes(cluster)
    use_workers(cluster, {W0: OnNode})
    cluster.stall[W0] = 2
    master, _ = fake_master(small_spec(synth_dir, chaos=[{"at_s": 3, "action": "kill", "target": "node:1"}]), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (chaos,) = events_of(master, "chaos")
    assert chaos["actors"] == killed == [W0]  # the actors on node-0 are spared
    (failure,) = master.failures
    assert (failure.kind.value, failure.actor, failure.node) == ("node_loss", W0, "node-1")
    assert "node-1" in cluster.nodes and failure.at_s < failure.detected_s


def test_a_run_failing_in_the_worker_s_own_code_is_a_worker_death_with_that_exception_as_cause(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    cluster.stall[W0] = 2
    cluster.at(1005.0, lambda: fail_run(cluster, W0, RuntimeError("disk on fire\nmore lines")))
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (failure,) = master.failures
    assert failure.kind.value == "worker_death" and failure.cause == "RuntimeError: disk on fire"
    assert killed == [W0]  # the master does not keep a worker whose run failed
    assert failure.shards_requeued == 2 and failure.replacement == W2


def test_a_run_failing_on_a_remote_call_while_every_ps_answers_is_a_worker_death_not_a_ps_recovery(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    cluster.stall[W0] = 2
    cluster.at(1005.0, lambda: fail_run(cluster, W0, ActorDied(error_msg="a peer went away")))
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert "Recovering" not in states_of(master)
    assert events_of(master, "rollback") == [] and events_of(master, "partial_recovery") == []
    (failure,) = master.failures
    assert failure.kind.value == "worker_death" and failure.actor == W0 and failure.replacement == W2
    assert killed == [W0]  # no PS replaced


def test_a_failure_counts_as_recovered_when_the_replacement_trains_its_first_step(synth_dir, tmp_path):
    cluster = fake_cluster()
    use_workers(cluster, {W2: SlowStarter})
    cluster.stall[W0] = 2
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name(W0)))
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (failure,) = master.failures
    assert failure.replacement == W2 and failure.recovered_s > failure.handled_s
    (recovered,) = events_of(master, "recovered")
    assert (recovered["actor"], recovered["failure_kind"]) == (W0, "worker_death")
    assert recovered["after_s"] == round(failure.recovered_s - failure.at_s, 3)


def test_a_node_whose_actors_fail_twice_is_avoided_by_the_actors_started_after(synth_dir, tmp_path):
    cluster = fake_cluster()
    two_nodes(cluster)  # the fake puts an actor without a placement on node-0
    for name in (W0, W2, W3):
        cluster.stall[name] = 1
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name(W0)))
    cluster.at(1010.0, lambda: cluster.kill(cluster.by_name(W2)))
    cluster.at(1015.0, lambda: cluster.kill(cluster.by_name(W3)))
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert [f.node for f in master.failures] == ["node-0", "node-0", "node-0"]
    (bad,) = events_of(master, "bad_node")
    assert (bad["node"], bad["strikes"]) == ("node-0", 2)
    assert master.launcher.avoid == {"node-0"}
    last = master.failures[-1].replacement
    assert handle_named(cluster, last).options["node"] == "node-1"


def test_the_replacement_for_the_failure_that_makes_a_node_bad_avoids_that_node(synth_dir, tmp_path):
    cluster = fake_cluster()
    two_nodes(cluster)  # the fake puts an actor without a placement on node-0
    for name in (W0, W2):
        cluster.stall[name] = 1
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name(W0)))
    cluster.at(1010.0, lambda: cluster.kill(cluster.by_name(W2)))
    master, _ = fake_master(small_spec(synth_dir), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (bad,) = events_of(master, "bad_node")
    assert bad["node"] == "node-0"
    second = master.failures[-1]
    assert second.actor == W2 and handle_named(cluster, second.replacement).options["node"] == "node-1"


# -- rollbacks and restarts: the workers' side --------------------------------------------
def test_a_rollback_replaces_the_workers_that_do_not_stop_or_do_not_answer(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    cluster.stall[W0] = 2
    cluster.hold(W0, "abort")  # its run never ends when the rollback aborts it
    cluster.at(1002.5, lambda: cluster.hold(W1, "ping"))  # its run ends, but it answers no ping
    master, _ = fake_master(small_spec(synth_dir, recovery__ps="rollback", chaos=[{"at_s": 3, "action": "kill", "target": "ps:0"}]), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    (back,) = events_of(master, "rollback")
    assert back["dead_ps"] == [0] and back["samples_replayed"] == summary["samples_replayed"] > 0
    assert set(killed) == {"fake-job/ps-0", W0, W1}
    assert {W2, W3} <= set(h.name for h in cluster.actors)  # one replacement each, started by the rollback
    (failure,) = master.failures  # replaced in the rollback, neither is declared hung
    assert failure.kind.value == "ps_death" and failure.samples_replayed == back["samples_replayed"]
    assert events_of(master, "hung") == []


def test_a_rollback_replaces_a_worker_that_dies_as_it_is_stopped(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    use_workers(cluster, {W0: DiesOnAbort})
    cluster.stall[W0] = 2
    master, _ = fake_master(small_spec(synth_dir, recovery__ps="rollback", chaos=[{"at_s": 3, "action": "kill", "target": "ps:0"}]), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert len(events_of(master, "rollback")) == 1
    assert killed == ["fake-job/ps-0", W0]
    assert [h.name for h in cluster.actors if h.options["cls"] is Worker] == [W0, W1, W2]  # one replacement
    assert handle_named(cluster, W1).names_called().count("run") == 2  # the other trains on after the rollback
    assert [f.kind.value for f in master.failures] == ["ps_death"]


def test_a_rollback_keeps_a_worker_whose_run_failed_on_the_lost_ps(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    use_workers(cluster, {W1: RunFailsOnAbort})
    cluster.stall[W0] = 2
    master, _ = fake_master(small_spec(synth_dir, recovery__ps="rollback", chaos=[{"at_s": 3, "action": "kill", "target": "ps:0"}]), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert len(events_of(master, "rollback")) == 1
    assert W1 not in killed
    assert handle_named(cluster, W1).names_called().count("run") == 2


def test_with_on_failure_restart_a_worker_death_restarts_every_actor_from_the_durable_checkpoint(synth_dir, tmp_path):
    cluster = fake_cluster()
    killed = record_kills(cluster)
    cluster.stall[W0] = 2
    cluster.at(1005.0, lambda: cluster.kill(cluster.by_name(W0)))
    master, _ = fake_master(small_spec(synth_dir, checkpoint__on_failure="restart"), tmp_path, cluster)
    summary = master.run().to_json()
    check_every_sample_trained(summary)
    assert "Restarting" in states_of(master) and "Recovering" not in states_of(master)
    (back,) = events_of(master, "rollback")
    assert back["checkpoint"]["source"] == "durable" and back["dead_ps"] == [0, 1] and back["dense"]
    (failure,) = master.failures
    assert failure.kind.value == "worker_death" and failure.checkpoint.source == "durable"
    assert failure.samples_replayed == summary["samples_replayed"] > 0
    assert {W0, W1, "fake-job/ps-0", "fake-job/ps-1"} <= set(killed)  # the survivors restart too
    assert {W2, W3, "fake-job/ps-2", "fake-job/ps-3"} <= {h.name for h in cluster.actors}
