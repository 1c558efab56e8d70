"""The master's follower of a ``data.follow`` job: one thread listing ``data.paths``
every ``poll_s``, taking each complete file into the plan and its training rows into
the shard queue, in arrival order, until ``until`` (a time, or rows arrived).

The queue is the record of what is trained: a rollback or a restarted master restores
the queue of a checkpoint, and the files taken after it are queued again at the next
poll, from the plan (their rows were undone with the model). A bad file (a missing
column) is the user's input: the job stops with it in one line.
"""

from __future__ import annotations

import sys
import threading
from datetime import datetime

from dlrover.data.data_spec import FollowSpec
from dlrover.data.follow import FileWatch, FollowPlan, list_files
from dlrover.errors import DLRoverError
from dlrover.master.job import Job
from dlrover.master.states import TERMINAL
from dlrover.resource.plan import StreamView

ARRIVAL_WINDOW_POLLS = 10  # the arrival rate is measured over this many polls


class Follower:
    def __init__(self, m: Job, plan: FollowPlan, follow: FollowSpec, paths: list[str]) -> None:
        self.m, self.plan, self.follow = m, plan, follow
        self.watch = FileWatch(follow.ready, lambda: list_files(paths, markers=follow.ready == "_SUCCESS"))
        self._thread = threading.Thread(target=self._run, daemon=True, name="data-follower")
        self._wake = threading.Event()
        self.ended = False  # following ended (``until``): no new file is taken
        self.started: float | None = None  # clock time of the first poll that took files

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self.m.books.stop_requested and self.m.status not in TERMINAL:
                self.poll()
                self._wake.wait(self.follow.poll_s)
        except DLRoverError as err:
            self.m.bad_input("data.paths", err)

    def poll(self) -> None:
        """One listing: report changed files, queue again what a restore undid, take the
        new complete files (none once following ended)."""
        books, events = self.m.books, self.m.events
        complete, changed = self.watch.poll()
        for was, now in changed:
            self._changed(now.path, now.size, was.size)
        for path in self.plan.files:  # taken before a restore that undid them
            if not books.add_file(path, self.plan.train_rows[path], self.plan.file_cuts(path)):
                return
        for f in [] if self.ended else complete:
            if self._end_if_due():
                return
            queued = books.queued_rows(f.path)  # a restored queue's file, taken again
            idx = self.plan.take(f.path, self.m.clock(), queued)
            if queued is None:
                if not books.add_file(f.path, self.plan.train_rows[f.path], self.plan.file_cuts(f.path)):
                    return
                events.add("file_arrived", path=f.path, rows=idx.rows, train_rows=self.plan.train_rows[f.path], bytes=f.size)
            elif idx.rows - int(idx.rows * self.plan.eval_fraction) != queued:
                self._changed(f.path, f.size, None)
        if self.started is None and self.plan.files:
            self.started = self.m.clock()  # the files taken so far were a backlog, not arrivals
        self._end_if_due()

    def _changed(self, path: str, size: int, was_size: int | None) -> None:
        self.m.events.add("file_changed", path=path, size=size, was_size=was_size)
        print(f"[dlrover] warning: {path} changed after it was taken for training: not trained again", file=sys.stderr, flush=True)

    def lag(self, now: float) -> tuple[int, float]:
        """(rows taken and not trained yet, seconds since the oldest such row's file was taken)."""
        q = self.m.books.queue
        oldest = self.m.books.oldest_open_file()
        at = self.plan.arrived.get(oldest, now) if oldest is not None else now
        return max(q.samples_expected - q.samples_done, 0), max(now - at, 0.0)

    def stream_view(self, max_lag_s: float) -> StreamView:
        """What the policy's stream stage sees: the training rows taken per second over the
        last ``ARRIVAL_WINDOW_POLLS`` polls (at least 10 s; the files of the first poll that
        took any are a backlog, not arrivals), the lag, and its bound."""
        now = self.m.clock()
        span = max(ARRIVAL_WINDOW_POLLS * self.follow.poll_s, 10.0)
        since = now - span
        start = self.started if self.started is not None else now
        rows = sum(self.plan.train_rows[p] for p, at in self.plan.arrived.items() if at > max(since, start))
        lag_rows, lag_s = self.lag(now)
        return StreamView(rows / max(min(span, now - start), self.follow.poll_s), lag_rows, lag_s, max_lag_s)

    def _end_if_due(self) -> bool:
        """Following ends at ``until``; the queue is told (again after a restore)."""
        until, rows = self.follow.until, sum(i.rows for i in self.plan.files.values())
        if not self.ended and until is not None:
            due = datetime.now(until.tzinfo) >= until if isinstance(until, datetime) else rows >= until
            if due:
                self.ended = True
                why = f"until {until.isoformat()}" if isinstance(until, datetime) else f"until {until:,} rows"
                self.m.events.add("follow_end", why=why, files=len(self.plan.files), rows=rows)
        if self.ended:
            self.m.books.end_stream()
        return self.ended
