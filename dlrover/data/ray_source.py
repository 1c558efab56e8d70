"""A ``ray.data.Dataset`` as a job's rows (``data.source: ray_data``).

The driver gets the Dataset (given to ``dlrover.run``, or ``data.dataset: module:function``
imported and called once), checks its columns against the feature schema on a first batch,
and hands it to the master in a :class:`StreamPlan`. The master iterates it, one epoch
after another, with ``iter_internal_ref_bundles``: the blocks stream through Ray Data's
executor, which runs in the master's process, so the master owns every block; it pins at
most ``data.blocks_in_flight`` of them (:class:`~dlrover.data.blocks.BlockShardQueue`) and
workers read their shards' rows from the block refs. Nothing is materialized or written
to disk: a block leaves the object store once its rows are trained.

Ray Data's tasks get ``data.ray_data_cpu`` CPUs: the Dataset's execution resource limit
(unless its own context set one), counted beside the job's actors in the CPUs an embedded
Ray is started with (``dlrover.driver.runner.required_cpus``).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dlrover.data.blocks import Block, BlockShardQueue
from dlrover.data.columns import table_to_rows
from dlrover.data.layout import DataLayout
from dlrover.data.parquet import table_rows
from dlrover.data.reader import Rows
from dlrover.errors import DataError, SpecError
from dlrover.spec import JobSpec

SAMPLE_ROWS = 8192  # the driver's first batch: columns checked, ids per row measured


def dataset_function(name: str) -> Callable[[], Any]:
    """The function ``data.dataset`` names (``module:function``), imported as ``python -m``
    would from the current directory. Its module travels with the Dataset by value
    (cloudpickle), so Ray's workers need not be able to import it."""
    import ray.cloudpickle

    module_name, _, func = name.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's module's
        raise SpecError(f"data.dataset: {name}: cannot import module {module_name}: {type(e).__name__}: {e}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise SpecError(f"data.dataset: {name}: module {module_name} has no function {func}")
    ray.cloudpickle.register_pickle_by_value(module)
    return fn


def call_dataset_function(name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, which must return a Dataset; anything else, or an exception, is one line."""
    import ray.data

    try:
        ds = fn()
    except Exception as e:  # noqa: BLE001 - the user's code
        raise DataError(f"data.dataset: {name} raised {one_line(e)}") from None
    if not isinstance(ds, ray.data.Dataset):
        raise DataError(f"data.dataset: {name} returned {type(ds).__name__}, not a ray.data.Dataset")
    return ds


def check_columns(names: list[str], layout: DataLayout) -> None:
    """The dataset holds every column the feature schema names; else one line naming them."""
    missing = [c for c in layout.required_columns if c not in set(names)]
    if missing:
        raise DataError(f"dataset: no column {', '.join(missing)} (the features name them); its columns: {', '.join(names) or 'none'}")


def as_table(block: Any) -> Any:
    """A Ray Data block (an Arrow table or a pandas DataFrame) as an Arrow table."""
    import pyarrow as pa

    return block if isinstance(block, pa.Table) else pa.Table.from_pandas(block, preserve_index=False)


def block_rows(block: Any, layout: DataLayout, name: str, start: int, stop: int) -> Rows:
    """Rows [start, stop) of a block as the schema says: (good rows, bad ordinals, reasons),
    a bad row reported as ``block <n>:<row>``."""
    table = as_table(block)
    check_columns(table.column_names, layout)
    table = table.slice(start, stop - start)
    if layout.criteo:
        raw, bad, reasons = table_rows(table, name, start)
        return raw.batch(), bad, reasons
    return table_to_rows(table, layout, name, lambda o: [f"{name}:{start + int(i) + 1}" for i in o])


RAISED = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception)): (.+)")  # a traceback's exception line
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(e: BaseException) -> str:
    """``Type: first line of its message``."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def pipeline_error(e: BaseException) -> str:
    """One line for an error the user's pipeline raised: Ray carries a task's exception as
    the text of its (chained) traceback, whose first ``Type: message`` line is the root
    cause's (Ray Data's ``UserCodeException`` comes after it)."""
    for line in ANSI.sub("", str(e)).splitlines():
        if m := RAISED.fullmatch(line.rstrip()):
            return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
    return one_line(e)


@dataclass
class StreamPlan:
    """What the master needs of a ray_data job's data, in the place of a ``DataPlan``: the
    Dataset, the layout its blocks are read with, and the queue of their shards (made by
    the master, which counts the ids of every block into it)."""

    dataset: Any
    layout: DataLayout
    epochs: int
    shard_rows: int
    blocks_in_flight: int
    ids_per_row: float
    queue: BlockShardQueue | None = None

    @property
    def files(self) -> dict:
        """No files: workers read blocks (the launcher hands each worker this index)."""
        return {}

    @classmethod
    def of(cls, spec: JobSpec, dataset: Any) -> "StreamPlan":
        """Check the Dataset's first batch against the schema (one line naming the columns
        missing) and measure its ids per row, on the driver, before anything is written."""
        d, layout = spec.data, spec.layout()
        limit_cpus(dataset.context, d.ray_data_cpu)  # (the context travels with the Dataset to the master)
        quiet(dataset.context)
        try:
            first = as_table(dataset.take_batch(SAMPLE_ROWS, batch_format="pyarrow"))
        except ValueError as e:  # take_batch of an empty Dataset
            raise DataError(f"dataset: no rows to train on ({str(e).splitlines()[0]})") from None
        except Exception as e:  # noqa: BLE001 - the user's pipeline failed on its first rows
            raise DataError(f"dataset: {pipeline_error(e)}") from None
        batch = block_rows(first, layout, "dataset", 0, first.num_rows)[0]
        per_row = float(len(layout.schema.sparse)) if layout.criteo else batch.num_ids / max(len(batch), 1)
        return cls(dataset, layout, d.epochs, d.shard_rows, d.blocks_in_flight, per_row)

    def shard_queue(self, spec: JobSpec, clock: Callable[[], float] = time.monotonic) -> BlockShardQueue:
        """The master's queue (kept here: ``expected_ids`` reads what it counted)."""
        self.queue = BlockShardQueue(self.shard_rows, self.epochs, self.blocks_in_flight, clock)
        return self.queue

    def blocks(self) -> Iterator[tuple[int, Block]]:
        """Every epoch's blocks, in the master: the Dataset iterated once per epoch, each
        block's ids counted (the PS must apply each once); its columns checked."""
        quiet(self.dataset.context)
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # the master's log is the driver's output
        for epoch in range(self.epochs):
            for bundle in self.dataset.iter_internal_ref_bundles():
                if bundle.schema is not None:
                    check_columns(list(bundle.schema.names), self.layout)
                for entry, piece in zip(bundle.blocks, bundle.slices):
                    yield epoch, self._counted(entry, piece)

    def _counted(self, entry: Any, piece: Any) -> Block:
        """A bundle's block (or slice of one) with its ids; Criteo's layout has one per
        feature and row, counted from the rows without reading them."""
        import ray

        rows = entry.metadata.num_rows
        if self.layout.criteo and rows is not None:
            start, stop = (0, rows) if piece is None else (piece.start_offset, piece.end_offset)
            return Block(entry.ref, start, stop)
        table = as_table(ray.get(entry.ref))
        start, stop = (0, table.num_rows) if piece is None else (piece.start_offset, piece.end_offset)
        if self.layout.criteo:
            return Block(entry.ref, start, stop)
        batch = block_rows(table, self.layout, "dataset", start, stop)[0]
        return Block(entry.ref, start, stop, batch.num_ids, batch.long_bags)

    def eval_ranges(self, shard_rows: int) -> list[tuple[str, int, int]]:
        """No held-out rows: a stream is trained whole (hold rows out in the Dataset)."""
        return []

    def ids_per_sample(self, layout: DataLayout) -> float:
        return self.ids_per_row

    def expected_ids(self, layout: DataLayout, epochs: int) -> tuple[int, int]:
        """(ids, bags cut to max_len) of every row streamed, all epochs: what the PS must
        have applied; -1 ids for Criteo's layout (one per feature and row)."""
        if layout.criteo:
            return -1, 0
        return (self.queue.ids, self.queue.long_bags) if self.queue is not None else (0, 0)


def limit_cpus(ctx: Any, cpu: float) -> None:
    """Ray Data's tasks hold at most ``cpu`` CPUs (``data.ray_data_cpu``), unless the
    Dataset's own context set its resource limits."""
    from ray.data import ExecutionResources

    if ctx.execution_options.is_resource_limits_default():
        ctx.execution_options.resource_limits = ExecutionResources(cpu=cpu)


def quiet(ctx: Any) -> None:
    """No progress bars or execution banners of Ray Data in the job's output."""
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
