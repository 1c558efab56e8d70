"""Evaluation on the held-out rows: every ``data.eval_every_steps`` steps on a bounded
slice (while training goes on, on one worker's evaluation replica), and once at the end
on all of them, split over the workers."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dlrover.data.plan import DataPlan
from dlrover.data.ray_source import StreamPlan
from dlrover.master.cluster import ActorDied, CallTimeout, Cluster, RayError
from dlrover.master.events import EventLog
from dlrover.master.launcher import Launcher
from dlrover.metrics.auc import evaluate_scores

PERIODIC_EVAL_MAX_RANGES = 4  # periodic evaluation scores a bounded slice of the held-out rows


def score(results: list[dict]) -> dict:
    """AUC, log loss (and the generator's best AUC on synthetic data) of workers' results."""
    labels = np.concatenate([r["labels"] for r in results])
    logits = np.concatenate([r["logits"] for r in results])
    oracle = None
    if all(r["oracle"] is not None for r in results):
        oracle = np.concatenate([r["oracle"] for r in results])
    return evaluate_scores(labels, torch.sigmoid(torch.from_numpy(logits)).numpy(), oracle)


class Evaluator:
    def __init__(self, cluster: Cluster, data: DataPlan | StreamPlan, shard_rows: int, every_steps: int | None, events: EventLog) -> None:
        self.cluster = cluster
        self.data, self.shard_rows, self.every, self.events = data, shard_rows, every_steps, events
        self._next_step = every_steps or None
        self._running: tuple[Any, int] | None = None  # (ObjectRef of the scores, step it began at)
        self.last_auc: float | None = None

    def busy(self) -> bool:
        """A periodic evaluation is running (no rescale switch or checkpoint under it)."""
        return self._running is not None

    def tick(self, steps_done: int, launcher: Launcher) -> None:
        """Collect a finished periodic evaluation; start the next one when it is due."""
        if self._running is not None and self.cluster.wait([self._running[0]], timeout=0)[0]:
            self._collect()
        if self._next_step is None or steps_done < self._next_step or self._running is not None:
            return
        worker = next(iter(launcher.workers.values()), None)
        ranges = self.data.eval_ranges(self.shard_rows)[:PERIODIC_EVAL_MAX_RANGES]
        if worker is not None and ranges:
            self._running = (worker.evaluate.remote(ranges), steps_done)
        while self._next_step <= steps_done:
            self._next_step += self.every

    def settle(self) -> None:
        """Training is over: wait for a periodic evaluation still running and keep its result."""
        if self._running is not None:
            self.cluster.wait([self._running[0]])
            self._collect()
        self._next_step = None

    def _collect(self) -> None:
        ref, step = self._running
        self._running = None
        try:
            scores = score([self.cluster.get(ref)])
        except RayError:
            return  # the evaluating worker died; the next period tries again
        self.last_auc = scores.get("auc")
        self.events.add("eval", step=step, periodic=True, **scores)

    def final(self, launcher: Launcher) -> dict:
        """Score every held-out row with the final parameters (a dead worker's part is
        scored again on the others)."""
        ranges = self.data.eval_ranges(self.shard_rows)
        if not ranges:
            return {}
        for attempt in range(2):
            if not launcher.workers:  # every worker died after the last shard
                launcher.add_worker()
            workers = list(launcher.workers.items())
            parts = [ranges[i :: len(workers)] for i in range(len(workers))]
            try:
                results = self.cluster.get([w.evaluate.remote(p) for (_, w), p in zip(workers, parts) if p])
                break
            except ActorDied:
                if attempt:
                    raise
                for name, w in workers:  # drop the dead ones and score again on the rest
                    try:
                        self.cluster.get(w.ping.remote(), timeout=30)
                    except (RayError, CallTimeout):
                        launcher.forget_worker(name)
        out = score(results)
        self.last_auc = out.get("auc")
        self.events.add("eval", final=True, **out)
        return out
