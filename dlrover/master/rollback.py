"""Rolling the whole job back to a checkpoint: what a lost PS (or, with
``checkpoint.on_failure: restart``, any failure) costs.

Every worker stops, the lost PS (and anything else found dead meanwhile) are replaced,
every PS and the dense PS load the checkpoint, the shard queue goes back to the
checkpoint's cut, and the shards completed since are trained again (``samples_replayed``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from dlrover.master.cluster import ActorDied, CallTimeout, RayError, TaskFailed
from dlrover.faults.records import CheckpointRef, Failure, FailureKind, LostPs
from dlrover.resource.configs import Config

from dlrover.master.job import Job
from dlrover.master.replace import replace_ps, replace_workers

if TYPE_CHECKING:
    from dlrover.master.persist import MasterState

ABORT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Rollback:
    """Where a rollback went back to and what it cost."""

    checkpoint: CheckpointRef
    samples_replayed: int
    rollback_s: float

    def apply_to(self, failure: Failure) -> None:
        failure.checkpoint, failure.samples_replayed, failure.rollback_s = self.checkpoint, self.samples_replayed, self.rollback_s



def stop_workers(m: Job) -> list[str]:
    """Abort every worker's run and wait for it; returns workers that are gone or hung."""
    lz, runs = m.launcher, m.runs
    for h in lz.workers.values():
        h.abort.remote()
    refs = runs.refs()
    done, hung = m.cluster.wait(refs, num_returns=len(refs), timeout=ABORT_TIMEOUT_S)
    lost = [runs.worker_of(r) for r in hung]
    for r in done:
        try:
            m.cluster.get(r)
        except TaskFailed:
            pass  # its run raised (a call to the dead PS failed: Ray's error is an ActorDied too): the worker is fine
        except ActorDied:
            lost.append(runs.worker_of(r))  # the worker itself died
        except RayError:
            pass
    runs.drop()
    return lost


def halt(m: Job, lost_ps: LostPs) -> tuple[list[str], LostPs]:
    """Stop what moves (a rescale under way, every worker's run) and take stock: the
    workers found gone or hung, then or by a ping after, and every PS found dead
    (``lost_ps`` and any other that died meanwhile)."""
    lz = m.launcher
    if m.control is not None:
        m.control.abort_pending()
    lost = stop_workers(m)
    survivors = [n for n in lz.workers if n not in lost]
    answers = {n: lz.workers[n].ping.remote() for n in survivors}
    ready, _ = m.cluster.wait(list(answers.values()), num_returns=len(answers), timeout=10.0)
    for n, ref in answers.items():
        try:
            if ref not in ready:
                raise CallTimeout()
            m.cluster.get(ref)
        except (RayError, CallTimeout):
            lost.append(n)
    return lost, lost_ps | m.recovery.dead_ps_now()


def roll_back(m: Job, lost_ps: LostPs, replace_all: bool = False) -> Rollback:
    """Roll the whole job back to the newest usable checkpoint (see module doc)."""
    lz = m.launcher
    t0 = m.clock() - m.t0
    lost, lost_ps = halt(m, lost_ps)  # anything else gone is replaced in the same rollback
    if replace_all:
        lost = list(lz.workers)
        lost_ps = LostPs(tuple(lz.ps), True)
    draining = m.books.draining()
    replace_workers(m, set(lost) | draining, drop=draining)
    owner, _ = replace_ps(m, lost_ps.ps)
    if lost_ps.dense:
        lz.new_dense()
    lz.wait_started()
    ckpt, payloads, source = m.checkpointer.payloads()
    refs = None if payloads is None else [p if m.cluster.is_ref(p) else m.cluster.put(p) for p in payloads]
    vmap = lz.vmap.with_owner(owner)
    m.cluster.get([h.restore.remote(vmap, refs) for h in lz.ps.values()])
    lz.dense.set_state(ckpt.dense, m.cluster.get)
    replayed = m.books.restore(ckpt.cut(), new_generation=True)
    lz.switch_map(vmap, dense=True)
    m.runs.add({lz.start(name): name for name in lz.workers})
    if m.control is not None:
        m.control.after_rollback()
    back = Rollback(CheckpointRef(ckpt.seq, round(ckpt.at_s, 3), source), int(replayed), round((m.clock() - m.t0) - t0, 3))
    m.events.add("rollback", checkpoint=asdict(back.checkpoint), samples_replayed=back.samples_replayed, rollback_s=back.rollback_s,
                 generation=m.books.generation, dead_ps=[int(k) for k in lost_ps.ps], dense=lost_ps.dense)
    return back


def resume_after_restart(m: Job, state: "MasterState") -> Config:
    """After a master restart: relaunch the checkpoint's configuration and load it."""
    detected = m.clock() - m.t0
    ckpt, payloads, source = m.checkpointer.load_durable()
    config = Config(**ckpt.extra["config"])
    m.launcher.launch(config)
    lz = m.launcher
    refs = [m.cluster.put(p) for p in payloads]
    m.cluster.get([h.restore.remote(lz.vmap, refs) for h in lz.ps.values()])
    lz.dense.set_state(ckpt.dense, m.cluster.get)
    m.books.restore(ckpt.cut(), new_generation=False)
    replayed = max(0, state.samples_done - ckpt.samples)
    m.recovery.samples_replayed += replayed
    failure = m.recovery.new_failure(FailureKind.MASTER_DEATH, f"{m.job_id}/master", "master process exited", detected)
    failure.at_s = round(state.crash_at_s, 3)
    failure.checkpoint, failure.samples_replayed, failure.restarts = CheckpointRef(ckpt.seq, round(ckpt.at_s, 3), source), replayed, m.restarts
    m.recovery.record(failure, list(lz.workers))
    m.events.add("master_resumed", restarts=m.restarts, checkpoint_seq=ckpt.seq, samples_replayed=replayed)
    return config
