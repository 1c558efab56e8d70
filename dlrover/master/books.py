"""The job's books: which shard each worker holds, what each reported, and who may still
lease work.

Workers call the master concurrently (``next_shard``, ``shard_done``, ``report``) while its
own thread drives the job; every read and write of the books goes through this class,
under one lock, with a condition variable that wakes workers waiting for a shard. The
master's parts (recovery, rollback, checkpoints, the controller) use its narrow methods
and never touch its sets directly.

``generation`` counts rollbacks: a worker's run carries the generation it was started in,
and a run from before the newest rollback gets "stop" and counts for nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from dlrover.data.blocks import Block, BlockShardQueue
from dlrover.data.follow_queue import FollowQueue
from dlrover.data.shards import Shard, ShardQueue
from dlrover.worker.window import WorkerReport

NEXT_SHARD_WAIT_S = 1.0


@dataclass(frozen=True)
class Cut:
    """The books at a checkpoint, every worker parked."""

    queue: dict
    bad_lines: int
    steps: int


class ShardBooks:
    def __init__(self, queue: ShardQueue | FollowQueue | BlockShardQueue, clock: Callable[[], float], deterministic: bool = False) -> None:
        """``deterministic``: one shard at a time across the job (a reproducible order)."""
        self.queue = queue
        self.clock = clock
        self.deterministic = deterministic
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self.generation = 0
        self.bad_lines = 0
        self.samples_seen = 0  # reported by the workers (replays included)
        self.steps_done = 0
        self.train_start: float | None = None  # clock time of the first shard asked for
        self.train_end: float | None = None  # clock time the last shard was done
        self.stop_requested = False  # stop(): workers get no more shards, the job ends "stopped"
        self._reports: dict[str, dict] = {}
        # Workers that died or were removed: a call of theirs still running in the master
        # (Ray does not cancel it) must not lease a shard to a name nobody trains under.
        self._retired: set[str] = set()
        self._draining: set[str] = set()  # finish their leased shards, then get "stop"
        self._stepped: set[str] = set()  # trained a step: up and running
        self._newly_done: list[int] = []  # shards done since ``take_done``
        # Shards requeued from a worker that died unparked: some PS may hold batches past
        # its last progress report, known only to their applied logs. Until such a shard is
        # done, no PS state may move (a switch, a cut, a restart): see ``settled``.
        self._uncertain: set[int] = set()

    # -- workers' calls -----------------------------------------------------------------
    def next_shard(self, worker: str, generation: int) -> Shard | None | str:
        """A shard to train, ``None`` (nothing right now: ask again) or ``"stop"``."""
        with self._work:
            if self.train_start is None:
                self.train_start = self.clock()
            deadline = self.clock() + NEXT_SHARD_WAIT_S
            while True:
                if self._must_stop(worker, generation):
                    return "stop"
                busy = self.deterministic and self.queue.doing_count > 0
                shard = None if busy else self.queue.next(worker)
                self.queue.renew(worker)
                if shard is not None:
                    return shard
                left = deadline - self.clock()
                if left <= 0:
                    return None
                self._work.wait(left)

    def _must_stop(self, worker: str, generation: int) -> bool:
        stale = generation != self.generation
        return stale or self.queue.finished or self.stop_requested or worker in self._retired or worker in self._draining

    def shard_done(self, worker: str, shard_id: int, rows: int, bad_lines: int, generation: int) -> None:
        with self._work:
            if worker in self._retired or generation != self.generation:
                return  # requeued when it was retired, or rolled back since
            self.queue.done(shard_id, worker, rows)
            self.queue.renew(worker)
            self._newly_done.append(shard_id)
            self._uncertain.discard(shard_id)
            self.bad_lines += bad_lines
            if self.queue.finished:
                self.train_end = self.clock()
            self._work.notify_all()

    def progress(self, worker: str, applied: dict[int, tuple[int, int]], generation: int) -> None:
        """How far each of its leased shards ``worker`` has applied (lines, rows of the
        lease): a replacement resumes from there."""
        with self._lock:
            if worker in self._retired or generation != self.generation:
                return
            for shard_id, (lines, rows) in applied.items():
                self.queue.progress(int(shard_id), worker, lines, rows)
            self.queue.renew(worker)

    def settled(self) -> bool:
        """No shard of a worker that died unparked is open: every PS's state may move
        (a live switch, a checkpoint cut, a restart) without a batch being applied twice
        when that shard is trained again."""
        with self._lock:
            return not self._uncertain

    def take_done(self) -> list[int]:
        """Shards done since the last call (the PS forget their applied batches)."""
        with self._lock:
            done, self._newly_done = self._newly_done, []
            return done

    def stepped(self, worker: str) -> None:
        """``worker`` trained its first step."""
        with self._lock:
            self._stepped.add(worker)

    def report(self, worker: str, report: WorkerReport) -> int:
        """A worker's window of metrics; its progress renews its leases. Returns the
        samples reported by all workers so far."""
        with self._lock:
            self.queue.renew(worker)
            self.samples_seen += report.samples
            self.steps_done += report.steps
            self._reports[worker] = report
            return self.samples_seen

    # -- the master's parts ------------------------------------------------------------
    def worker_reports(self) -> dict[str, WorkerReport]:
        """Each worker's latest report (the records are frozen: the dict is the copy)."""
        with self._lock:
            return dict(self._reports)

    def forget_report(self, worker: str) -> None:
        with self._lock:
            self._reports.pop(worker, None)

    def running(self) -> frozenset[str]:
        """Workers that trained a step."""
        with self._lock:
            return frozenset(self._stepped)

    def draining(self) -> frozenset[str]:
        """Workers finishing their leased shards before they leave (a scale-in)."""
        with self._lock:
            return frozenset(self._draining)

    def drain(self, workers: list[str]) -> None:
        """Give these workers no more shards; they finish what they hold and exit."""
        with self._work:
            self._draining.update(workers)
            self._work.notify_all()

    def retire(self, worker: str, parked: bool = False) -> list[Shard]:
        """``worker`` is gone: its late calls count for nothing, its leased shards go back
        (from where its progress left them; one it had wholly applied is done).
        ``parked``: it reported its progress at a pause, with nothing in flight after."""
        with self._work:
            self._retired.add(worker)
            self._draining.discard(worker)
            self._reports.pop(worker, None)
            requeued = self._requeue(worker, parked)
            if self.queue.finished and self.train_end is None:
                self.train_end = self.clock()
            self._work.notify_all()
        return requeued

    def requeue_all(self) -> list[Shard]:
        """Every worker's run was aborted (a PS was replaced under them): each leased shard
        goes back from where its holder's progress left it, and runs from before count
        for nothing (a new generation). The workers stay: they lease afresh. Survivors may
        hold batches past that progress, so the shards are unsettled until done."""
        with self._work:
            back = [s for owner in sorted(set(self.queue.doing_owners().values())) for s in self._requeue(owner, parked=False)]
            self.generation += 1
            if self.queue.finished and self.train_end is None:
                self.train_end = self.clock()
            self._work.notify_all()
        return back

    def _requeue(self, owner: str, parked: bool) -> list[Shard]:
        """``owner``'s leased shards back to todo from its progress (lock held)."""
        held = [i for i, o in self.queue.doing_owners().items() if o == owner]
        requeued = self.queue.requeue_owner(owner)
        back = {s.shard_id for s in requeued}
        self._newly_done += [i for i in held if i not in back]
        if not parked:
            self._uncertain |= back
        return requeued

    def add_block(self, epoch: int, block: Block) -> bool:
        """A stream's next block (``data.source: ray_data``), added once fewer than
        ``data.blocks_in_flight`` are pinned; False, nothing added, when the job stopped first."""
        with self._work:
            while not self.queue.room() and not self.stop_requested:
                self._work.wait(NEXT_SHARD_WAIT_S)
            if self.stop_requested:
                return False
            self.queue.add(epoch, block)
            self._work.notify_all()
            return True

    def add_file(self, path: str, rows: int, cuts: list[int]) -> bool:
        """A followed file's training rows (``data.follow``), unless queued already;
        False, nothing added, when the job stopped."""
        with self._work:
            if self.stop_requested:
                return False
            if not self.queue.has(path):
                self.queue.add_file(path, rows, cuts)
                self._work.notify_all()
            return True

    def queued_rows(self, path: str) -> int | None:
        """A followed file's training rows in the queue (None: not queued)."""
        with self._lock:
            return next((rows for p, rows in self.queue.files if p == path), None) if self.queue.has(path) else None

    def oldest_open_file(self) -> str | None:
        """A followed stream's first-queued file with rows not trained yet."""
        with self._lock:
            return self.queue.oldest_open()

    def end_stream(self) -> None:
        """The stream has no more blocks (files): the job ends once their shards are done."""
        with self._work:
            self.queue.end()
            if self.queue.finished and self.train_end is None:
                self.train_end = self.clock()
            self._work.notify_all()

    def stop(self) -> None:
        with self._work:
            self.stop_requested = True
            self._work.notify_all()

    def expired_leases(self, timeout_s: float, t0: float) -> dict[str, float]:
        """Workers holding a lease their progress has not renewed for ``timeout_s``, with
        the job time (clock - ``t0``) of their last renewal."""
        with self._lock:
            expired = self.queue.expired(timeout_s)
            ages, owners = self.queue.lease_ages(), self.queue.doing_owners()
        now = self.clock() - t0
        return {w: now - max(a for i, a in ages.items() if owners[i] == w) for w in expired}

    def renew_leases(self, workers: list[str]) -> None:
        """These workers' leases start afresh (the master could not watch them)."""
        with self._lock:
            for w in workers:
                self.queue.renew(w)

    def cut(self, trained: dict[int, tuple[int, int]]) -> Cut:
        """For a checkpoint, every worker parked: the queue's cut, bad lines and steps."""
        with self._lock:
            return Cut(self.queue.cut(trained), self.bad_lines, self.steps_done)

    def restore(self, cut: Cut, new_generation: bool) -> int:
        """Back to a checkpoint's books; returns the samples trained since, now to train
        again. ``new_generation``: runs from before are stale (their calls get "stop")."""
        with self._work:
            replayed = max(0, self.queue.samples_done - held_samples(cut.queue))
            self.queue = type(self.queue).from_state_dict(cut.queue, clock=self.clock)
            self.bad_lines, self.steps_done = cut.bad_lines, cut.steps
            self.train_end = None
            self._draining.clear()
            self._uncertain.clear()  # the cut predates them: every PS goes back to it
            self._newly_done.clear()  # shards done after the cut are open again
            if new_generation:
                self.generation += 1
            self._work.notify_all()
        return replayed


def held_samples(queue_state: dict) -> int:
    """Rows a cut queue state holds: done shards plus offsets of half-trained ones."""
    return int(sum(r for _, _, r in queue_state["done"]) + sum(v[1] for _, v in queue_state.get("offsets", [])))
