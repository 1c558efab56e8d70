"""The job's life as explicit states, driven by typed events.

::

    Launching -> Running <-> Rescaling
                  |  ^  \
         PS lost  v  |   `-(stop asked)-> Stopping
               Recovering                    |
                  | restart all              |
                  v                          |
              Restarting -> Running          |
    Running -(a rescale by restart decided)-> RestartRescaling -> Running
    Running | Stopping -(every run returned)-> Evaluating -> Succeeded | Stopped
    any state -(bad input, or past checkpoint.max_failures)-> Failed

Which failure leads where is the failure policy's decision (``dlrover.faults.policy``);
a rescale by restart is the controller's (``dlrover.master.restart.RestartRescale``).

The loop (:class:`JobLoop`) takes the events a ``RunGroup`` (``dlrover.master.runs``) reports (a worker's
``run`` returned, failed on its own, failed on a PS, hit bad input) plus a tick on the
clock, and hands each to the current state, which returns the next one. A state decides;
the master (:class:`JobContext`) carries the decisions out on Ray. Every transition goes
through :meth:`JobLoop.set_state`, which tells the context (it records a ``state``
event). Tests drive the loop with a fake group and a fake context, one event at a time.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Protocol

from dlrover.errors import DLRoverError
from dlrover.faults.policy import Decision, RestartAll
from dlrover.faults.records import LostPs
from dlrover.master.runs import BadInput, Event, PsUnreachable, RunGroup, Tick, WorkerDied, WorkerExited
from dlrover.worker.window import RunResult

if TYPE_CHECKING:
    from dlrover.master.restart import RestartRescale


class JobFailed(RuntimeError):
    """Raised by the context when the job must end FAILED (past ``checkpoint.max_failures``):
    the loop moves to :class:`Failed` with its message as the reason."""


class JobStatus(str, Enum):
    STARTING = "starting"
    TRAINING = "training"
    RESCALING = "rescaling"
    RECOVERING = "recovering"
    RESTARTING = "restarting"  # every actor restarts from the last durable checkpoint
    STOPPING = "stopping"  # asked to stop: the workers get no more shards
    EVALUATING = "evaluating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


class JobContext(Protocol):
    """What the states ask of the job (the master implements it on Ray)."""

    def entered(self, state: "State") -> None:
        """The loop moved to ``state`` (its ``status``, and a Failed state's ``reason``)."""

    def launch(self) -> None:
        """Start the job's actors and their runs (or take over those of a restarted master)."""

    def evaluate(self) -> None:
        """Training is over: wind down, then the final evaluation."""

    def tick(self) -> None:
        """Work due on every tick, whatever the state (periodic evaluation, metrics)."""

    def finished(self) -> bool:
        """Every shard is trained."""

    def stopping(self) -> bool:
        """The user asked the job to stop."""

    def unstarted(self, workers: list[str]) -> bool:
        """None of ``workers`` has trained a step yet."""

    def drop_unstarted(self) -> None:
        """Stop the pending workers that never trained (nothing is left for them)."""

    def watch(self) -> LostPs:
        """One round of liveness, memory limits, policy and checkpoint work: the PS the
        probes found lost (then nothing else is done this round)."""

    def rescaling(self) -> bool:
        """A rescale is under way."""

    def restart_decided(self) -> RestartRescale | None:
        """The controller's decision, this round, to rescale by a restart (``policy.rescale: restart``)."""

    def restart_rescale(self, decision: RestartRescale) -> None:
        """Carry that rescale out (stop, checkpoint, relaunch, restore); the new runs start."""

    def worker_exited(self, worker: str, result: RunResult) -> None: ...

    def worker_died(self, worker: str, error: Exception) -> Decision:
        """Record the death and carry out the failure policy's decision, unless it is to
        restart everything (the Restarting state does that)."""

    def ps_unreachable(self, worker: str, error: Exception) -> LostPs:
        """A run failed on a PS: the PS really gone (none: the job need not recover)."""

    def recover(self, lost: LostPs, how: str) -> Decision:
        """Replace the ``lost`` PS (``how``: found how) from a checkpoint, as the failure
        policy decides (unless it is to restart everything); runs restart."""

    def restart(self) -> None:
        """Restart every actor from the last durable checkpoint (the failures decided it)."""

    def bad_input(self, worker: str, error: DLRoverError) -> None: ...

    def running(self) -> list[str]:
        """Workers whose ``run`` is pending."""


def first_line(error: Exception) -> str:
    """The first line of what went wrong (a remote error's cause, where it has one)."""
    lines = str(getattr(error, "cause", error)).strip().splitlines()
    return lines[0][:120] if lines else type(error).__name__


# -- states ------------------------------------------------------------------------------
class State:
    status: JobStatus
    immediate = False  # stepped with a tick as soon as it is entered
    terminal = False

    def on(self, event: Event, job: JobContext) -> "State":
        return self

    @property
    def name(self) -> str:
        return type(self).__name__


class Launching(State):
    """The job's actors start; the loop steps it at once (the launch is one synchronous
    operation, which fails at once when the cluster can never hold the job)."""

    status = JobStatus.STARTING
    immediate = True

    def on(self, event: Event, job: JobContext) -> State:
        job.launch()
        return Running()


class Running(State):
    """Workers train; failures are handled in place, a lost PS moves to Recovering."""

    status = JobStatus.TRAINING

    def on(self, event: Event, job: JobContext) -> State:
        if isinstance(event, Tick):
            return self.tick(job)
        if isinstance(event, WorkerExited):
            job.worker_exited(event.worker, event.result)
        elif isinstance(event, WorkerDied):
            return Restarting() if isinstance(job.worker_died(event.worker, event.error), RestartAll) else self
        elif isinstance(event, PsUnreachable):
            lost = job.ps_unreachable(event.worker, event.error)
            if lost:
                return Recovering(lost, f"{event.worker}: {first_line(event.error)}")
            return Restarting() if isinstance(job.worker_died(event.worker, event.error), RestartAll) else self
        elif isinstance(event, BadInput):
            job.bad_input(event.worker, event.error)
            return Failed(str(event.error))
        return self

    def tick(self, job: JobContext) -> State:
        job.tick()
        if job.finished() and job.running() and job.unstarted(job.running()):
            job.drop_unstarted()
        if not job.running():
            return Evaluating()
        if job.stopping():
            return Stopping()
        if job.finished():
            return self
        lost = job.watch()
        if lost:
            return Recovering(lost, "probe")
        decided = job.restart_decided()
        if decided is not None:
            return RestartRescaling(decided)
        return Rescaling() if job.rescaling() else self


class Rescaling(Running):
    """A rescale is under way: the same handling as Running, back to it once done."""

    status = JobStatus.RESCALING

    def on(self, event: Event, job: JobContext) -> State:
        nxt = super().on(event, job)
        if isinstance(nxt, Rescaling):
            return self if job.rescaling() else Running()
        return nxt


class RestartRescaling(State):
    """The controller decided to rescale by a restart (``policy.rescale: restart``, the
    baseline of live rescaling): the state carries the decision out, stepped at once (one
    synchronous operation), then the job trains again. It is a rescale to the user
    (status ``rescaling``), not the failure policy's restart from a durable checkpoint."""

    status = JobStatus.RESCALING
    immediate = True

    def __init__(self, decision: RestartRescale) -> None:
        self.decision = decision

    def on(self, event: Event, job: JobContext) -> State:
        job.restart_rescale(self.decision)
        return Running()


class Stopping(Running):
    """The user asked the job to stop: workers get no more shards, no policy or checkpoint
    work starts; failures are still handled. Evaluating once every run has returned."""

    status = JobStatus.STOPPING

    def tick(self, job: JobContext) -> State:
        job.tick()
        if job.running() and job.unstarted(job.running()):
            job.drop_unstarted()  # waiting for a CPU, with nothing left to do
        return self if job.running() else Evaluating()


class Recovering(State):
    """A PS is gone (a run failed on it, or the probes found it): it is replaced from a
    checkpoint, then the job trains again. The loop steps it at once (``immediate``):
    the recovery is one synchronous operation."""

    status = JobStatus.RECOVERING
    immediate = True

    def __init__(self, lost: LostPs, how: str) -> None:
        self.lost, self.how = lost, how

    def on(self, event: Event, job: JobContext) -> State:
        return Restarting() if isinstance(job.recover(self.lost, self.how), RestartAll) else Running()


class Restarting(State):
    """The failure policy restarts every actor from the last durable checkpoint
    (``checkpoint.on_failure: restart``); stepped at once, then the job trains again."""

    status = JobStatus.RESTARTING
    immediate = True

    def on(self, event: Event, job: JobContext) -> State:
        job.restart()
        return Running()


class Evaluating(State):
    """Every run has returned: the final evaluation, then Succeeded (every shard trained)
    or Stopped (the user asked); a job whose runs ended short of both failed."""

    status = JobStatus.EVALUATING
    immediate = True

    def on(self, event: Event, job: JobContext) -> State:
        job.evaluate()
        if job.finished():
            return Succeeded()
        return Stopped() if job.stopping() else Failed("the workers ended before the data did")


class Succeeded(State):
    status = JobStatus.SUCCEEDED
    terminal = True


class Stopped(State):
    status = JobStatus.STOPPED
    terminal = True


class Failed(State):
    """The job ended FAILED: ``reason`` in one line (bad input, the failure limit)."""

    status = JobStatus.FAILED
    terminal = True

    def __init__(self, reason: str) -> None:
        self.reason = reason


class JobLoop:
    """Steps the current state with each event until the job ends in a terminal state.
    A :class:`JobFailed` raised while a state acts ends the job in :class:`Failed`."""

    def __init__(self, job: JobContext, group: RunGroup, tick_s: float) -> None:
        self.job, self.group, self.tick_s = job, group, tick_s
        self.state: State = Launching()
        job.entered(self.state)

    def start(self) -> State:
        """Step the states that need no event (Launching) until one waits for events."""
        self._settle()
        return self.state

    def step(self, events: list[Event]) -> State:
        for event in events:
            if self.state.terminal:
                break
            self._act(event)
            self._settle()
        return self.state

    def set_state(self, nxt: State) -> None:
        if nxt is not self.state:
            self.state = nxt
            self.job.entered(nxt)

    def _act(self, event: Event) -> None:
        try:
            self.set_state(self.state.on(event, self.job))
        except JobFailed as e:
            self.set_state(Failed(str(e)))

    def _settle(self) -> None:
        while self.state.immediate and not self.state.terminal:
            self._act(Tick())

    def run(self) -> State:
        self.start()
        while not self.state.terminal:
            self.step(self.group.poll(self.tick_s))
        return self.state
