"""A worker's input thread: it asks the master for shards and parses and routes their
rows into batches, so file reading and routing overlap training."""

from __future__ import annotations

import queue
import threading
from typing import Any

import ray

from dlrover.data.criteo import FileIndex
from dlrover.data.reader import FileReader
from dlrover.data.shards import Shard
from dlrover.model.dlrm import PSClient
from dlrover.ps.applied import BatchId
from dlrover.worker.batches import Step, batches_of, block_batches, with_tensors

PAUSE_POLL_S = 0.05  # how often a worker idle on input checks for a pause request
QUEUE_BATCHES = 4  # parsed batches kept ready ahead of training
_END = object()


class FileIndexes(dict):
    """The job's file indexes by path; one the worker was not started with (a file that
    arrived later: ``data.follow``) is asked of the master, once."""

    def __init__(self, files: dict[str, FileIndex], master: Any) -> None:
        super().__init__(files)
        self.master = master

    def __missing__(self, path: str) -> FileIndex:
        idx = self[path] = ray.get(self.master.file_index.remote(path))
        return idx


class ShardInput:
    """One run's input: a background thread putting ``Step``s on a bounded queue that
    the training loop polls. ``stop`` ends it for good; the next run makes another."""

    def __init__(
        self,
        master: Any,
        name: str,
        generation: int,
        files: dict[str, FileIndex],
        reader: FileReader,
        batch_size: int,
        client: PSClient,
    ) -> None:
        self._master = master
        self._name = name
        self._generation = generation
        self._files = files
        self._reader = reader
        self._batch_size = batch_size
        self._client = client
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_BATCHES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, daemon=True, name="shard-reader")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The run is over: the thread must not ask for shards any more."""
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout=timeout_s)

    def depth(self) -> int:
        """Batches ready and waiting (a metric: near zero means input-bound)."""
        return self._queue.qsize()

    def poll(self, timeout_s: float = 0.0) -> tuple[Step | None, bool]:
        """The next batch if one comes within ``timeout_s`` (0: never block), and whether
        input has ended. An error of the input thread is raised here."""
        try:
            item = self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None, False
        if isinstance(item, BaseException):
            raise item
        return (None, True) if item is _END else (item, False)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=PAUSE_POLL_S)
                return True
            except queue.Full:
                pass
        return False  # run ended (aborted): nobody reads this queue any more

    def _produce(self) -> None:
        """Thread body: shards from the master -> parsed batches on the queue."""
        try:
            while not self._stop.is_set():
                shard = ray.get(self._master.next_shard.remote(self._name, self._generation))
                if shard == "stop":
                    break
                if shard is None:
                    continue
                if not self._read(shard):
                    return
        except BaseException as e:  # surfaced by the training loop
            self._put(e)
        self._put(_END)

    def _read(self, shard: Shard) -> bool:
        """Queue the shard's batches; False if the run ended meanwhile. The last batch is
        queued even when empty: it closes the shard's books."""
        carried_bad = 0
        first = shard.skipped // self._batch_size  # a resumed shard skipped whole batches
        if shard.block is not None:  # a ray_data job's: rows of a block the master pins
            r = self._reader
            batches = block_batches(ray.get(shard.block), shard, r.layout, r.on_bad_line, self._batch_size)
        else:
            batches = batches_of(self._reader, self._files[shard.path], shard.start, shard.stop, self._batch_size)
        for i, (batch, bad, last) in enumerate(batches, start=first):
            if len(batch) == 0 and not last:  # every line skipped: nothing to train
                carried_bad += bad
                continue
            step = Step(shard, batch, last, bad + carried_bad, BatchId(shard.shard_id, i))
            carried_bad = 0
            if len(batch):
                with_tensors(step, self._reader.layout.schema.feature_names)
                # Routing and the object-store put of the ids are CPU work that
                # can run here, off the training thread.
                step.routed = self._client.route(step.kjt, put=ray.put)
            if not self._put(step):
                return False
        return True
