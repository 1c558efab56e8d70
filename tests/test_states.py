"""The job loop's states stepped one event at a time, without Ray: a fake job context
records what the states ask of it, and a fake run group queues the events."""

from __future__ import annotations

from dlrover.errors import DataError
from dlrover.faults.policy import RecoverPs, ReplaceWorkers, RestartAll
from dlrover.faults.records import LostPs
from dlrover.master.runs import BadInput, PsUnreachable, Tick, WorkerDied, WorkerExited
from dlrover.worker.window import RunResult
from dlrover.master.states import (
    Evaluating,
    Failed,
    JobFailed,
    JobLoop,
    JobStatus,
    Launching,
    Recovering,
    Restarting,
    Rescaling,
    RestartRescaling,
    Running,
    Stopped,
    Stopping,
    Succeeded,
)


class FakeJob:
    """A job with ``workers`` running; flags say what the world looks like."""

    def __init__(self, workers: list[str]) -> None:
        self.pending = list(workers)
        self.done = False
        self.stop = False
        self.busy = False
        self.ps_gone = False
        self.stepped: set[str] = set()
        self.calls: list[tuple] = []
        self.statuses: list[JobStatus] = []
        self.fail_on_death = False  # the next death goes past the failure limit
        self.decision = None  # the failure policy's answer to the next failure (default: replace / recover)
        self.probe_lost = LostPs()  # what the next watch finds
        self.rescale_by_restart = None  # the controller's decision of the next watch to rescale by a restart

    # JobContext
    def entered(self, state):
        self.statuses.append(state.status)

    def launch(self):
        self.calls.append(("launch",))

    def evaluate(self):
        self.calls.append(("evaluate",))

    def tick(self):
        self.calls.append(("tick",))

    def finished(self):
        return self.done

    def stopping(self):
        return self.stop

    def unstarted(self, workers):
        return not any(w in self.stepped for w in workers)

    def drop_unstarted(self):
        self.calls.append(("drop_unstarted", tuple(self.pending)))
        self.pending.clear()

    def watch(self):
        self.calls.append(("watch",))
        lost, self.probe_lost = self.probe_lost, LostPs()
        return lost

    def rescaling(self):
        return self.busy

    def restart_decided(self):
        return self.rescale_by_restart

    def restart_rescale(self, decision):
        self.calls.append(("restart_rescale", decision))
        self.rescale_by_restart = None

    def worker_exited(self, worker, result):
        self.pending.remove(worker)
        self.calls.append(("exited", worker))

    def worker_died(self, worker, error):
        if self.fail_on_death:
            raise JobFailed(f"2 failures (checkpoint.max_failures: 1); last: {worker}")
        self.calls.append(("died", worker))
        if self.decision is not None:
            return self.decision
        self.pending.remove(worker)
        self.pending.append(worker + "-new")
        return ReplaceWorkers((worker,))

    def ps_unreachable(self, worker, error):
        return LostPs((0,)) if self.ps_gone else LostPs()

    def recover(self, lost, how):
        self.calls.append(("recover", how, lost.ps))
        self.ps_gone = False
        return self.decision or RecoverPs(lost, partial=True)

    def restart(self):
        self.calls.append(("restart",))

    def bad_input(self, worker, error):
        self.calls.append(("bad_input", worker, str(error)))

    def running(self):
        return list(self.pending)


class QueuedGroup:
    """Hands out queued event batches, then ticks."""

    def __init__(self, batches):
        self.batches = list(batches)

    def poll(self, timeout_s):
        return self.batches.pop(0) if self.batches else [Tick()]


def loop_for(job, *batches):
    """A loop past Launching (its first two statuses: starting, training)."""
    loop = JobLoop(job, QueuedGroup(batches), tick_s=0.1)
    loop.start()
    del job.statuses[:2], job.calls[:1]
    return loop


def test_a_job_launches_first_then_trains():
    job = FakeJob(["w0"])
    loop = JobLoop(job, QueuedGroup([]), tick_s=0.1)
    assert isinstance(loop.state, Launching) and job.calls == []
    assert isinstance(loop.start(), Running)
    assert job.calls == [("launch",)] and job.statuses == [JobStatus.STARTING, JobStatus.TRAINING]


def test_a_tick_while_training_watches_the_job_and_stays_running():
    job = FakeJob(["w0", "w1"])
    loop = loop_for(job)
    assert isinstance(loop.step([Tick()]), Running)
    assert job.calls == [("tick",), ("watch",)] and job.statuses == []


def test_no_watching_once_every_shard_is_done_or_the_job_is_stopping():
    job = FakeJob(["w0"])
    job.stepped.add("w0")
    job.done = True
    loop = loop_for(job)
    loop.step([Tick()])
    assert isinstance(loop.state, Running)
    job.done, job.stop = False, True
    loop.step([Tick(), Tick()])
    assert ("watch",) not in job.calls and isinstance(loop.state, Stopping)


def test_the_last_worker_exiting_evaluates_and_the_job_succeeds_when_every_shard_is_done():
    job = FakeJob(["w0"])
    job.done = True
    loop = loop_for(job)
    loop.step([WorkerExited("w0", RunResult(0)), Tick()])
    assert isinstance(loop.state, Succeeded) and job.calls[-1] == ("evaluate",)
    assert job.statuses == [JobStatus.EVALUATING, JobStatus.SUCCEEDED]


def test_a_stopped_job_waits_for_its_runs_then_evaluates_and_ends_stopped():
    job = FakeJob(["w0"])
    job.stop, job.stepped = True, {"w0", "w0-new"}
    loop = loop_for(job)
    loop.step([Tick()])
    assert isinstance(loop.state, Stopping) and job.statuses == [JobStatus.STOPPING]
    loop.step([WorkerDied("w0", RuntimeError("killed")), Tick()])  # still handled: a replacement runs
    assert isinstance(loop.state, Stopping) and ("died", "w0") in job.calls
    loop.step([WorkerExited("w0-new", RunResult(0)), Tick()])
    assert isinstance(loop.state, Stopped) and job.statuses[-2:] == [JobStatus.EVALUATING, JobStatus.STOPPED]


def test_a_stopped_job_drops_a_replacement_that_never_started():
    job = FakeJob(["w0"])
    job.stop = True
    loop = loop_for(job)
    loop.step([WorkerDied("w0", RuntimeError("killed")), Tick(), Tick()])  # Stopping, then the drop
    assert ("drop_unstarted", ("w0-new",)) in job.calls and isinstance(loop.state, Stopped)


def test_runs_ending_short_of_the_data_without_a_stop_end_failed_after_the_evaluation():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    loop.step([WorkerExited("w0", RunResult(0)), Tick()])
    assert isinstance(loop.state, Failed) and "before the data" in loop.state.reason and ("evaluate",) in job.calls


def test_a_failure_past_the_limit_ends_failed_with_its_reason_and_no_evaluation():
    job = FakeJob(["w0", "w1"])
    job.fail_on_death = True
    loop = loop_for(job)
    loop.step([WorkerDied("w0", RuntimeError("killed")), WorkerExited("w1", RunResult(0))])
    assert isinstance(loop.state, Failed) and loop.state.reason.startswith("2 failures (checkpoint.max_failures: 1)")
    assert job.statuses == [JobStatus.FAILED] and ("evaluate",) not in job.calls and ("exited", "w1") not in job.calls


def test_workers_that_never_started_are_dropped_when_the_work_is_done():
    job = FakeJob(["w0", "w1"])
    job.done = True
    loop = loop_for(job)
    loop.step([Tick()])
    assert ("drop_unstarted", ("w0", "w1")) in job.calls and isinstance(loop.state, Succeeded)


def test_a_dead_worker_is_replaced_in_place_without_leaving_running():
    job = FakeJob(["w0", "w1"])
    loop = loop_for(job)
    loop.step([WorkerDied("w0", RuntimeError("killed")), Tick()])
    assert ("died", "w0") in job.calls and job.pending == ["w1", "w0-new"]
    assert isinstance(loop.state, Running) and job.statuses == []


def test_a_run_failing_on_a_live_ps_counts_as_the_workers_death():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    loop.step([PsUnreachable("w0", RuntimeError("ps call failed"))])
    assert ("died", "w0") in job.calls and not [c for c in job.calls if c[0] == "recover"]


def test_a_lost_ps_recovers_through_the_recovering_state_and_trains_again():
    job = FakeJob(["w0", "w1"])
    job.ps_gone = True
    loop = loop_for(job)
    loop.step([PsUnreachable("w0", RuntimeError("ps-1 died"))])
    assert ("recover", "w0: ps-1 died", (0,)) in job.calls  # what was found lost, and how, travel with the transition
    assert job.statuses == [JobStatus.RECOVERING, JobStatus.TRAINING]
    assert isinstance(loop.state, Running)


def test_a_rescale_under_way_is_its_own_state_until_the_switch_is_done():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    job.busy = True
    assert isinstance(loop.step([Tick()]), Rescaling)
    loop.step([Tick()])  # still busy: no second entry
    assert job.statuses == [JobStatus.RESCALING]
    job.busy = False
    assert isinstance(loop.step([Tick()]), Running)
    assert job.statuses[-1] == JobStatus.TRAINING


def test_a_worker_dying_during_a_rescale_is_handled_and_the_rescale_goes_on():
    job = FakeJob(["w0", "w1"])
    job.busy = True
    loop = loop_for(job)
    loop.step([Tick()])
    loop.step([WorkerDied("w1", RuntimeError("gone"))])
    assert ("died", "w1") in job.calls and isinstance(loop.state, Rescaling)


def test_bad_input_fails_the_job_and_stops_reading_events():
    job = FakeJob(["w0", "w1"])
    loop = loop_for(job)
    loop.step([BadInput("w0", DataError("a.tsv:3: 12 fields")), WorkerExited("w1", RunResult(0))])
    assert isinstance(loop.state, Failed) and job.statuses[-1] == JobStatus.FAILED and loop.state.reason == "a.tsv:3: 12 fields"
    assert ("bad_input", "w0", "a.tsv:3: 12 fields") in job.calls
    assert ("exited", "w1") not in job.calls  # nothing after the failure


def test_run_launches_and_steps_the_group_until_the_job_ends():
    job = FakeJob(["w0"])
    job.done = True
    loop = JobLoop(job, QueuedGroup([[Tick()], [WorkerExited("w0", RunResult(0)), Tick()]]), tick_s=0.1)
    assert isinstance(loop.run(), Succeeded) and job.calls[0] == ("launch",)


def test_launching_recovering_and_evaluating_are_only_ever_passed_through():
    assert Launching.immediate and Recovering.immediate and Restarting.immediate and RestartRescaling.immediate and Evaluating.immediate
    assert not Running.immediate
    assert {Succeeded.terminal, Stopped.terminal, Failed.terminal} == {True} and not Evaluating.terminal


def test_a_ps_the_probes_find_lost_recovers_through_the_recovering_state():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    job.probe_lost = LostPs((1,))
    loop.step([Tick()])
    assert ("recover", "probe", (1,)) in job.calls
    assert job.statuses == [JobStatus.RECOVERING, JobStatus.TRAINING]


def test_a_death_the_policy_answers_with_a_restart_goes_through_restarting():
    job = FakeJob(["w0", "w1"])
    loop = loop_for(job)
    job.decision = RestartAll()
    loop.step([WorkerDied("w0", RuntimeError("killed"))])
    assert job.calls[-2:] == [("died", "w0"), ("restart",)]
    assert job.statuses == [JobStatus.RESTARTING, JobStatus.TRAINING] and isinstance(loop.state, Running)


def test_a_lost_ps_the_policy_answers_with_a_restart_goes_through_recovering_then_restarting():
    job = FakeJob(["w0"])
    job.ps_gone = True
    loop = loop_for(job)
    job.decision = RestartAll()
    loop.step([PsUnreachable("w0", RuntimeError("ps-0 died"))])
    assert job.calls[-1] == ("restart",)
    assert job.statuses == [JobStatus.RECOVERING, JobStatus.RESTARTING, JobStatus.TRAINING]


def test_a_rescale_by_restart_the_controller_decided_is_carried_out_by_its_own_state():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    decision = object()  # the controller's record: the loop only hands it on
    job.rescale_by_restart = decision
    assert isinstance(loop.step([Tick()]), Running)
    assert job.calls[-2:] == [("watch",), ("restart_rescale", decision)]  # decided in the watch, carried out by the state
    assert job.statuses == [JobStatus.RESCALING, JobStatus.TRAINING]
    loop.step([Tick()])
    assert job.calls[-1] == ("watch",) and len(job.statuses) == 2  # once
