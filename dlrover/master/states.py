"""The job's life as explicit states, driven by typed events.

::

    Launching -> Running <-> Rescaling
                  |  ^  \
         PS lost  v  |   `-(stop asked)-> Stopping
               Recovering                    |
    Running | Stopping -(every run returned)-> Evaluating -> Succeeded | Stopped
    any state -(bad input, or past checkpoint.max_failures)-> Failed

The loop (:class:`JobLoop`) takes the events a :class:`RunGroup` reports (a worker's
``run`` returned, failed on its own, failed on a PS, hit bad input) plus a tick on the
clock, and hands each to the current state, which returns the next one. A state decides;
the master (:class:`JobContext`) carries the decisions out on Ray. Every transition goes
through :meth:`JobLoop.set_state`, which tells the context (it records a ``state``
event). Tests drive the loop with a fake group and a fake context, one event at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from dlrover.master.cluster import ActorDied, Cluster, TaskFailed
from dlrover.errors import DLRoverError
from dlrover.faults.records import LostPs


class JobFailed(RuntimeError):
    """Raised by the context when the job must end FAILED (past ``checkpoint.max_failures``):
    the loop moves to :class:`Failed` with its message as the reason."""


class JobStatus(str, Enum):
    STARTING = "starting"
    TRAINING = "training"
    RESCALING = "rescaling"
    RECOVERING = "recovering"
    STOPPING = "stopping"  # asked to stop: the workers get no more shards
    EVALUATING = "evaluating"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED})


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """The clock moved on (at least every tick period, also between worker events)."""


@dataclass(frozen=True)
class WorkerExited:
    """A worker's ``run`` returned: it ran out of shards or was drained."""

    worker: str
    stats: dict


@dataclass(frozen=True)
class WorkerAborted:
    """A worker's ``run`` returned because a rollback aborted it."""

    worker: str


@dataclass(frozen=True)
class WorkerDied:
    """The worker's process is gone (or its run failed in its own code)."""

    worker: str
    error: Exception


@dataclass(frozen=True)
class PsUnreachable:
    """A worker's ``run`` failed on a call to a PS or the dense PS."""

    worker: str
    error: Exception


@dataclass(frozen=True)
class BadInput:
    """A worker hit input the user must fix (a malformed data line): no replacement helps."""

    worker: str
    error: DLRoverError


Event = Tick | WorkerExited | WorkerAborted | WorkerDied | PsUnreachable | BadInput


class RunGroup:
    """The ``run`` calls of the training workers: started here, reported as events.

    ``pending`` maps each run's ObjectRef to its worker; the recovery and control code
    that start or stop runs go through :meth:`start` / :meth:`add` / :meth:`clear`.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pending: dict[Any, str] = {}
        self._soon_s: float | None = None

    def soon(self, timeout_s: float) -> None:
        """Make the next poll wait at most ``timeout_s`` (something else is being watched
        closely: a pre-copy that may end any moment)."""
        self._soon_s = timeout_s if self._soon_s is None else min(self._soon_s, timeout_s)

    def add(self, runs: dict[Any, str]) -> None:
        self.pending.update(runs)

    def workers(self) -> list[str]:
        return list(self.pending.values())

    def poll(self, timeout_s: float) -> list[Event]:
        """Wait up to ``timeout_s`` for one run to end; its event (if any), then a tick."""
        if self._soon_s is not None:
            timeout_s, self._soon_s = min(timeout_s, self._soon_s), None
        ready, _ = self.cluster.wait(list(self.pending), num_returns=1, timeout=timeout_s)
        events: list[Event] = []
        for ref in ready:
            name = self.pending.pop(ref, None)
            if name is not None:
                events.append(self._outcome(ref, name))
        events.append(Tick())
        return events

    def _outcome(self, ref: Any, name: str) -> Event:
        try:
            stats = self.cluster.get(ref)
        except TaskFailed as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, DLRoverError):
                return BadInput(name, cause)
            if isinstance(cause, ActorDied):
                return PsUnreachable(name, e)
            return WorkerDied(name, e)
        except ActorDied as e:
            return WorkerDied(name, e)
        return WorkerAborted(name) if stats.get("aborted") else WorkerExited(name, stats)


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

    def watch(self) -> None:
        """One round of liveness, memory limits, policy and checkpoint work."""

    def rescaling(self) -> bool:
        """A rescale is under way."""

    def worker_exited(self, worker: str, stats: dict) -> None: ...

    def worker_died(self, worker: str, error: Exception) -> None: ...

    def ps_unreachable(self, worker: str, error: Exception) -> LostPs:
        """A run failed on a PS: the PS really gone (none: the job need not recover)."""

    def recover(self, worker: str, error: Exception, lost: LostPs) -> None:
        """Roll back to a checkpoint with the ``lost`` PS replaced; runs restart."""

    def bad_input(self, worker: str, error: DLRoverError) -> None: ...

    def running(self) -> list[str]:
        """Workers whose ``run`` is pending."""


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
            job.worker_exited(event.worker, event.stats)
        elif isinstance(event, WorkerDied):
            job.worker_died(event.worker, event.error)
        elif isinstance(event, PsUnreachable):
            lost = job.ps_unreachable(event.worker, event.error)
            if lost:
                return Recovering(event.worker, event.error, lost)
            job.worker_died(event.worker, event.error)
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
        job.watch()
        return Rescaling() if job.rescaling() else self


class Rescaling(Running):
    """A rescale is under way: the same handling as Running, back to it once done."""

    status = JobStatus.RESCALING

    def on(self, event: Event, job: JobContext) -> State:
        nxt = super().on(event, job)
        if isinstance(nxt, Rescaling):
            return self if job.rescaling() else Running()
        return nxt


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
    """A PS is gone: the whole job goes back to a checkpoint, then trains again. The loop
    steps it at once (``immediate``): the rollback is one synchronous operation."""

    status = JobStatus.RECOVERING
    immediate = True

    def __init__(self, worker: str, error: Exception, lost: LostPs) -> None:
        self.worker, self.error, self.lost = worker, error, lost

    def on(self, event: Event, job: JobContext) -> State:
        job.recover(self.worker, self.error, self.lost)
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
