"""The master's feed of a ray_data job (``data.source: ray_data``): one thread moving the
Dataset's blocks from the stream into the books, each as soon as fewer than
``data.blocks_in_flight`` are pinned there, epoch after epoch.

The thread iterates the Dataset in the master's process, so the master owns every block:
a worker that dies takes only its borrowed refs with it, and its shards are leased again
from the same pinned blocks. Whatever goes wrong in the stream (a column missing, the
user's ``map_batches`` raising) is the user's input: the job stops with it in one line.
"""

from __future__ import annotations

import threading

from dlrover.data.ray_source import StreamPlan, pipeline_error
from dlrover.errors import DataError, DLRoverError
from dlrover.master.job import Job


class StreamFeed:
    def __init__(self, m: Job, plan: StreamPlan) -> None:
        self.m, self.plan = m, plan
        self._thread = threading.Thread(target=self._run, daemon=True, name="ray-data-feed")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        books, events = self.m.books, self.m.events
        rows = blocks = 0
        epoch = 0
        try:
            for e, block in self.plan.blocks():
                if e != epoch:
                    events.add("stream_epoch", epoch=epoch, blocks=blocks, rows=rows)
                    epoch, rows, blocks = e, 0, 0
                if not books.add_block(e, block):
                    return  # the job stopped: the stream is dropped with its executor
                rows, blocks = rows + block.rows, blocks + 1
            events.add("stream_epoch", epoch=epoch, blocks=blocks, rows=rows)
            if books.queue.samples_expected == 0:
                raise DataError("dataset: no rows to train on")
            books.end_stream()
        except DLRoverError as err:
            self.m.bad_input("dataset", err)
        except Exception as err:  # noqa: BLE001 - the user's pipeline failed in Ray Data
            self.m.bad_input("dataset", DataError(f"dataset: {pipeline_error(err)}"))
