"""The job loop's states stepped one event at a time, without Ray: a fake job context
records what the states ask of it, and a fake run group queues the events."""

from __future__ import annotations

from dlrover.errors import DataError
from dlrover.faults.records import LostPs
from dlrover.master.states import (
    BadInput,
    Evaluating,
    Failed,
    JobLoop,
    JobStatus,
    PsUnreachable,
    Recovering,
    Rescaling,
    Running,
    Tick,
    WorkerDied,
    WorkerExited,
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

    # JobContext
    def entered(self, status):
        self.statuses.append(status)

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

    def rescaling(self):
        return self.busy

    def worker_exited(self, worker, stats):
        self.pending.remove(worker)
        self.calls.append(("exited", worker))

    def worker_died(self, worker, error):
        self.pending.remove(worker)
        self.pending.append(worker + "-new")
        self.calls.append(("died", worker))

    def ps_unreachable(self, worker, error):
        return LostPs((0,)) if self.ps_gone else LostPs()

    def recover(self, worker, error, lost):
        self.calls.append(("recover", worker, lost.ps))
        self.ps_gone = False

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
    return JobLoop(job, QueuedGroup(batches), tick_s=0.1)


def test_a_tick_while_training_watches_the_job_and_stays_running():
    job = FakeJob(["w0", "w1"])
    loop = loop_for(job)
    assert isinstance(loop.step([Tick()]), Running)
    assert job.calls == [("tick",), ("watch",)] and job.statuses == [JobStatus.TRAINING]


def test_no_watching_once_every_shard_is_done_or_the_job_is_stopping():
    job = FakeJob(["w0"])
    job.stepped.add("w0")
    job.done = True
    loop = loop_for(job)
    loop.step([Tick()])
    job.done, job.stop = False, True
    loop.step([Tick()])
    assert ("watch",) not in job.calls and isinstance(loop.state, Running)


def test_the_last_worker_exiting_moves_the_job_to_evaluating():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    loop.step([WorkerExited("w0", {}), Tick()])
    assert isinstance(loop.state, Evaluating) and job.statuses[-1] == JobStatus.EVALUATING


def test_workers_that_never_started_are_dropped_when_the_work_is_done():
    job = FakeJob(["w0", "w1"])
    job.done = True
    loop = loop_for(job)
    loop.step([Tick()])
    assert ("drop_unstarted", ("w0", "w1")) in job.calls and isinstance(loop.state, Evaluating)


def test_a_dead_worker_is_replaced_in_place_without_leaving_running():
    job = FakeJob(["w0", "w1"])
    loop = loop_for(job)
    loop.step([WorkerDied("w0", RuntimeError("killed")), Tick()])
    assert ("died", "w0") in job.calls and job.pending == ["w1", "w0-new"]
    assert isinstance(loop.state, Running) and job.statuses == [JobStatus.TRAINING]


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
    assert ("recover", "w0", (0,)) in job.calls  # what was found lost travels with the transition
    assert job.statuses == [JobStatus.TRAINING, JobStatus.RECOVERING, JobStatus.TRAINING]
    assert isinstance(loop.state, Running)


def test_a_rescale_under_way_is_its_own_state_until_the_switch_is_done():
    job = FakeJob(["w0"])
    loop = loop_for(job)
    job.busy = True
    assert isinstance(loop.step([Tick()]), Rescaling)
    loop.step([Tick()])  # still busy: no second entry
    assert job.statuses == [JobStatus.TRAINING, JobStatus.RESCALING]
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
    loop.step([BadInput("w0", DataError("a.tsv:3: 12 fields")), WorkerExited("w1", {})])
    assert isinstance(loop.state, Failed) and job.statuses[-1] == JobStatus.FAILED
    assert ("bad_input", "w0", "a.tsv:3: 12 fields") in job.calls
    assert ("exited", "w1") not in job.calls  # nothing after the failure


def test_run_steps_the_group_until_training_ends():
    job = FakeJob(["w0"])
    loop = loop_for(job, [Tick()], [WorkerExited("w0", {}), Tick()])
    assert isinstance(loop.run(), Evaluating)


def test_recovering_is_only_ever_passed_through():
    assert Recovering.immediate and not Running.immediate
