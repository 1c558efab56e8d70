"""A run's recovery story, read from its event log, and the same job replayed on the fake
cluster: what the real-kill tests (``test_faults.py``, ``test_partial_recovery.py``)
compare, real run against fake replay.

``recovery_story(rows)`` keeps, in the order written, the events that tell what failed and
how the job got over it: the job's states, the chaos fired, each failure (its kind and the
role of the actor: worker, ps, dense-ps, master), a recovery's kind (rollback, partial
recovery, ...), each ``recovered`` but a worker's, and the job's end. What depends on
timing is left out: metrics, checkpoints (a cut in flight when a PS dies is skipped or
not), first steps and worker exits, measurements, names and generations of actors, times
and counts; a row repeated back to back is one step of the story.

``fake_replay(spec, run_dir)`` runs ``spec`` on the fake cluster (``fake_job``), seconds
where the real job takes a minute: worker-0 leases two shards and stalls, so the job is
still training when its chaos fires; a killed PS fails the stalled run as a worker's
call to a dead PS fails its run, and the stall ends (the run after a recovery trains).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fake_cluster import OPEN

Step = tuple[str, ...]

# Rows of a failure and of what the master did about it (beside the states, the chaos and
# the job's end). Left out as timing: a lease expiring (a slow run's, or a dead one's
# before its death is seen), a checkpoint skipped, lost or failed (a cut in flight or not).
RECOVERY_KINDS = ("failure", "recovered", "oom_kill", "hung", "rollback", "partial_recovery", "master_resumed", "job_error")
STALLED = "fake-job/worker-0"  # the replay's worker that leases two shards and stalls
ROLE = re.compile(r"(dense-ps|ps|worker|master|node)(?:[-:]|$)")


def role_of(actor: str | None) -> str:
    """``job/worker-3`` -> ``worker``, ``job/ps-1`` -> ``ps``, ``job/dense-ps-0-g1`` ->
    ``dense-ps``, ``job/master`` -> ``master``; a chaos target (``ps:1``) -> ``ps``."""
    m = ROLE.match(str(actor or "").rsplit("/", 1)[-1])
    return m.group(1) if m else "?"


def _row(e: Any) -> Mapping[str, Any]:
    """An events.jsonl row, or a row of ``master.events.rows()`` (a dict, or an ``Event``)."""
    return e.to_json() if hasattr(e, "to_json") else e


def step_of(row: Mapping[str, Any]) -> Step | None:
    kind = row.get("kind")
    if kind == "state":
        return ("state", str(row.get("state")))
    if kind == "chaos":
        return ("chaos", str(row.get("action")), role_of(row.get("target")))
    if kind == "job_end":
        return ("job_end", str(row.get("status")))
    if kind == "failure":
        return (kind, str(row.get("failure_kind")), role_of(row.get("actor")))
    if kind == "recovered":
        # Written at the first step of a worker that resumed after the failure. A lost
        # worker's replacement races the survivors for the data left, which they may
        # finish while it starts (so it never steps): only the recoveries that restart
        # the workers in place (a PS's, the master's) say it for sure.
        role = role_of(row.get("actor"))
        return None if role == "worker" else (kind, str(row.get("failure_kind")), role)
    if kind == "rollback":
        return ("rollback", "dense" if row.get("dense") else "embedding")
    if kind in RECOVERY_KINDS:
        return (str(kind), role_of(row.get("actor"))) if row.get("actor") else (str(kind),)
    return None


def recovery_story(rows: Iterable[Any]) -> list[Step]:
    """The recovery-relevant steps of an event log, in the order written, repeats folded."""
    story: list[Step] = []
    for e in rows:
        step = step_of(_row(e))
        if step is not None and (not story or story[-1] != step):
            story.append(step)
    return story


def story_of_run(summary_path: Path) -> list[Step]:
    """The story of a real run, from the events.jsonl beside its summary.json."""
    from conftest import events_of

    return recovery_story(events_of(Path(summary_path)))


def side_by_side(real: list[Step], fake: list[Step]) -> str:
    """The two stories as a diff, real (``-``) against fake (``+``)."""
    import difflib

    return "\n".join(difflib.ndiff([" ".join(x) for x in real], [" ".join(x) for x in fake]))


def check_same_story(summary_path: Path, spec: Any, tmp_path: Path) -> list[Step]:
    """The real run (its summary.json at ``summary_path``) and ``spec`` replayed on the
    fake cluster tell the same recovery story; that story."""
    real = story_of_run(summary_path)
    _, fake = fake_replay(spec, Path(tmp_path) / "fake-replay")
    assert real == fake, "the real run (-) and its fake replay (+) tell different recovery stories:\n" + side_by_side(real, fake)
    return real


def fake_replay(spec: Any, run_dir: Path) -> tuple[dict, list[Step]]:
    """``spec`` (its chaos included) run by the real JobMaster on the fake cluster, with its
    checkpoints under ``run_dir`` (not beside the real run's): its summary and its story."""
    from fake_job import fake_master

    run_dir = Path(run_dir)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"dir": str(run_dir / "ckpt")})})
    cluster = replay_cluster()
    cluster.stall[STALLED] = 2
    master, _ = fake_master(spec, run_dir / "run", cluster)
    summary = master.run()
    return (summary.to_json() if hasattr(summary, "to_json") else summary), recovery_story(master.events.rows())


def replay_cluster() -> Any:
    """A fake cluster (``fake_job``) as the real kills meet it: a worker's run trains from
    the cluster's next wait on, not within the call that started it, and says its first
    step when it trained a shard (a real worker's first step comes well after the master
    recorded the failure that restarted it, and only if there was something left to
    train); killing a PS fails the stalled run as a call to the dead PS fails it, and
    ends the stall."""
    from fake_job import FakeDensePS, FakeJobCluster, FakeWorker, InProcessEmbeddingPS
    from dlrover.master.cluster import ActorDied, TaskFailed
    from dlrover.ps.dense_ps import DenseParamServer
    from dlrover.ps.embedding_ps import EmbeddingPS
    from dlrover.worker.worker import Worker

    class StartingWorker(FakeWorker):
        def run(self, generation: int = 0) -> Any:
            """Trains from the next wait on (``poke``)."""
            self.generation, self.aborted, self.samples, self.stalled, self.stepped = generation, False, 0, False, False
            return OPEN

        def took(self, shard: Any) -> None:
            if not self.stepped:  # as a worker's first step of a run: after it trained a batch
                self.stepped = True
                self.master.sync("first_step", self.name)

    class ReplayCluster(FakeJobCluster):
        def __init__(self) -> None:
            super().__init__()
            self.make = {Worker: lambda *a: StartingWorker(self, *a), DenseParamServer: FakeDensePS, EmbeddingPS: InProcessEmbeddingPS}

        def kill(self, handle: Any) -> None:
            super().kill(handle)
            if isinstance(handle.obj, (EmbeddingPS, DenseParamServer)):
                self.stall.clear()  # the runs after the recovery train
                for h in self.alive(Worker):
                    ref = h.obj.open_run()
                    if ref is not None and h.obj.stalled:
                        died = ActorDied(error_msg=f"{handle.name} is dead")
                        ref.resolve(error=TaskFailed("run", f"ActorDied: {handle.name} is dead", died).as_instanceof_cause())

    return ReplayCluster()
