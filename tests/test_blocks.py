"""The shard queue of a Ray Data stream (``data.source: ray_data``), on a fake clock and
with strings for object refs: blocks pinned until their rows are trained, at most K at
once, a dead worker's shards leased again from the same block; and the pure pieces of
reading blocks (no Ray started)."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from dlrover.data.blocks import Block, BlockShardQueue
from dlrover.errors import DataError, SpecError
from dlrover.master.books import ShardBooks, held_samples


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def queue(max_blocks: int = 2, shard_rows: int = 100, epochs: int = 1, clock: FakeClock | None = None) -> BlockShardQueue:
    return BlockShardQueue(shard_rows, epochs, max_blocks, clock or FakeClock())


def drain(q: BlockShardQueue, owner: str = "w0") -> list:
    out = []
    while (s := q.next(owner)) is not None:
        q.done(s.shard_id, owner, s.rows)
        out.append(s)
    return out


def test_every_row_of_a_block_is_handed_out_once_from_its_ref_and_the_block_released_after_its_last_shard():
    q = queue(max_blocks=1)
    shards = q.add(0, Block("ref-a", 0, 250))
    assert [(s.start, s.stop) for s in shards] == [(0, 100), (100, 200), (200, 250)]
    assert {s.block for s in shards} == {"ref-a"} and {s.path for s in shards} == {"block 0"}
    assert not q.room()
    first = q.next("w0")
    q.done(first.shard_id, "w0", first.rows)
    assert not q.room()  # two shards of it still to train
    assert len(drain(q)) == 2 and q.room()  # its last shard done: the ref is let go
    seen = Counter(r for s in shards for r in range(s.start, s.stop))
    assert set(seen) == set(range(250)) and set(seen.values()) == {1}


def test_no_more_than_max_blocks_are_pinned_until_every_shard_of_one_is_done():
    q = queue(max_blocks=2)
    q.add(0, Block("a", 0, 100))
    assert q.room()
    q.add(0, Block("b", 0, 200))
    assert not q.room()
    s = q.next("w0")  # block a's only shard
    assert not q.room()  # leased is not done
    q.done(s.shard_id, "w0", s.rows)
    assert q.room()


def test_a_dead_workers_shard_goes_back_first_from_its_progress_and_reads_the_same_block():
    q = queue(max_blocks=1)
    q.add(0, Block("ref-a", 0, 300))
    held = q.next("w0")
    q.progress(held.shard_id, "w0", lines=40, rows=38)  # 40 lines applied, 2 of them bad
    (back,) = q.requeue_owner("w0")
    assert (back.shard_id, back.start, back.stop, back.skipped, back.block) == (held.shard_id, 40, 100, 40, "ref-a")
    assert not q.room()  # the block stays pinned for the replacement
    again = q.next("w1")
    assert again == back
    q.done(again.shard_id, "w1", again.rows)
    assert q.samples_done == 38 + 60 and q.prefix_bad_lines == 2


def test_a_shard_a_dead_worker_had_wholly_applied_is_done_and_can_release_its_block():
    q = queue(max_blocks=1)
    q.add(0, Block("a", 0, 100))
    s = q.next("w0")
    q.progress(s.shard_id, "w0", lines=100, rows=100)
    assert q.requeue_owner("w0") == []
    assert q.room() and q.samples_done == 100


def test_the_queue_finishes_only_once_the_stream_ended_and_every_shard_is_done():
    q = queue(max_blocks=4, epochs=2)
    for epoch in range(2):
        q.add(epoch, Block(f"e{epoch}", 0, 150))
    drain(q)
    assert not q.finished  # the stream may still have blocks
    q.end()
    assert q.finished
    with pytest.raises(ValueError, match="ended"):
        q.add(1, Block("late", 0, 10))


def test_epochs_come_in_stream_order_and_a_requeued_shard_goes_before_them():
    q = queue(max_blocks=4, epochs=2)
    q.add(0, Block("a", 0, 200))
    q.add(1, Block("a-again", 0, 200))
    s = q.next("w0")
    q.requeue_owner("w0")
    assert [x.epoch for x in drain(q, "w1")] == [0, 0, 1, 1] and q.next("w1") is None
    assert s.epoch == 0


def test_a_slice_of_a_block_is_cut_inside_the_slice():
    q = queue(max_blocks=1, shard_rows=64)
    shards = q.add(0, Block("a", 1000, 1100))
    assert [(s.start, s.stop) for s in shards] == [(1000, 1064), (1064, 1100)]


def test_a_block_without_rows_pins_nothing():
    q = queue(max_blocks=1)
    assert q.add(0, Block("empty", 0, 0)) == [] and q.room()


def test_samples_expected_is_the_rows_streamed_estimated_from_the_first_epoch_and_exact_at_the_end():
    q = queue(max_blocks=8, epochs=3)
    q.add(0, Block("a", 0, 100))
    q.add(0, Block("b", 0, 50))
    assert q.samples_expected == 150
    q.add(1, Block("a", 0, 100))  # epoch 0 is complete: 150 rows an epoch
    assert q.samples_expected == 450
    q.add(1, Block("b", 0, 40))
    q.add(2, Block("c", 0, 140))
    q.end()
    assert q.samples_expected == 430  # what came, once it all came


def test_the_ids_counted_in_each_block_add_up():
    q = queue(max_blocks=4)
    q.add(0, Block("a", 0, 10, ids=31, long_bags=2))
    q.add(0, Block("b", 0, 10, ids=9))
    assert (q.ids, q.long_bags) == (40, 2)


def test_a_lease_not_renewed_expires_on_the_clock_and_one_renewed_does_not():
    clock = FakeClock()
    q = queue(max_blocks=2, clock=clock)
    q.add(0, Block("a", 0, 200))
    q.next("w0")
    q.next("w1")
    clock.t += 20
    q.renew("w1")
    clock.t += 15
    assert q.expired(30.0) == ["w0"]


def test_a_report_for_a_shard_of_a_released_block_from_its_owner_again_is_ignored():
    q = queue(max_blocks=1)
    q.add(0, Block("a", 0, 100))
    s = q.next("w0")
    q.done(s.shard_id, "w0", 100)
    q.done(s.shard_id, "w0", 100)  # an RPC retry
    assert q.samples_done == 100
    with pytest.raises(ValueError, match="completed by 'w0'"):
        q.done(s.shard_id, "w1", 100)


def test_a_checkpoints_record_holds_the_done_shards_and_the_trained_part_of_the_leased_ones():
    q = queue(max_blocks=2)
    q.add(0, Block("a", 0, 200))
    done = q.next("w0")
    q.done(done.shard_id, "w0", 100)
    leased = q.next("w0")
    state = q.cut({leased.shard_id: (30, 29)})
    assert held_samples(state) == 129 and q.doing_count == 1  # the queue itself is untouched


def test_the_books_add_a_block_once_a_shard_done_makes_room_and_none_after_a_stop():
    books = ShardBooks(queue(max_blocks=1), FakeClock())
    assert books.add_block(0, Block("a", 0, 100))
    s = books.next_shard("w0", 0)
    added = []
    t = threading.Thread(target=lambda: added.append(books.add_block(0, Block("b", 0, 100))))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # waits: block a is pinned
    books.shard_done("w0", s.shard_id, 100, 0, 0)
    t.join(5)
    assert added == [True]
    books.stop()
    assert not books.add_block(0, Block("c", 0, 100))
    books.end_stream()
    assert not books.queue.finished  # block b is not trained yet


def test_pandas_and_arrow_blocks_read_as_the_same_rows_named_by_block_and_row():
    import pandas as pd
    import pyarrow as pa

    from dlrover.data.ray_source import block_rows
    from dlrover.spec import spec_from_dict

    layout = spec_from_dict({"features": {"label": "y", "dense": ["x"], "sparse": ["c", {"column": "tags", "max_len": 2}]},
                             "data": {"source": "ray_data"}}).layout()  # fmt: skip
    df = pd.DataFrame({"y": [1, 0, 7, 1], "x": [0.5, 1.0, 2.0, 3.0], "c": [3, 4, 5, 6], "tags": [[1], [2, 3, 4], [], [5]]})
    a, bad, why = block_rows(pa.Table.from_pandas(df), layout, "block 3", 1, 4)
    b, _, _ = block_rows(df, layout, "block 3", 1, 4)
    assert list(bad) == [1] and why[0].startswith("block 3:3: y: label must be 0 or 1")  # the block's row 3 (from 1)
    assert len(a) == 2 and np.array_equal(a.labels, b.labels) and a.num_ids == b.num_ids == 2 + 3 and a.long_bags == 1


def test_a_block_missing_a_feature_column_is_one_line_naming_it():
    import pyarrow as pa

    from dlrover.data.ray_source import block_rows
    from dlrover.spec import spec_from_dict

    layout = spec_from_dict({"features": {"label": "y", "sparse": ["c", "d"]}, "data": {"source": "ray_data"}}).layout()
    with pytest.raises(DataError) as e:
        block_rows(pa.table({"y": [1], "c": [2], "e": [3]}), layout, "block 0", 0, 1)
    assert str(e.value) == "dataset: no column d (the features name them); its columns: y, c, e"


def test_a_dataset_function_that_does_not_exist_is_one_line_naming_it():
    from dlrover.data.ray_source import dataset_function

    with pytest.raises(SpecError, match=r"^data.dataset: json:no_such: module json has no function no_such$"):
        dataset_function("json:no_such")
    with pytest.raises(SpecError, match=r"^data.dataset: no_such_module_x:f: cannot import module no_such_module_x: ModuleNotFoundError"):
        dataset_function("no_such_module_x:f")


def test_an_error_of_the_users_pipeline_is_the_root_cause_line_of_rays_remote_traceback():
    from dlrover.data.ray_source import pipeline_error

    class RayTaskError(Exception):
        pass

    text = ("\x1b[36mray::ReadFiles->MapBatches(f)()\x1b[39m (pid=1, ip=1.2.3.4)\n  File \"pipe.py\", line 4, in f\n"
            "    raise ValueError(\"price must be positive\")\nValueError: price must be positive\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "ray.exceptions.UserCodeException: UDF failed to process a data block.\nFailed to apply UDF transform")  # fmt: skip
    assert pipeline_error(RayTaskError(text)) == "ValueError: price must be positive"
    assert pipeline_error(KeyError("tags")) == "KeyError: 'tags'"


# -- what a ray_data job cannot do: replay rows from a checkpoint --------------------------------
def test_a_failure_policy_without_replays_fails_a_lost_ps_and_keeps_worker_replacement():
    from dlrover.faults.policy import Fail, FailurePolicy, ReplaceWorkers
    from dlrover.faults.records import LostPs

    policy = FailurePolicy(replays=False)
    assert isinstance(policy.ps_lost(LostPs((1,), False)), Fail)
    assert policy.worker_lost(("w",)) == ReplaceWorkers(("w",))


def test_a_lost_ps_fails_a_job_that_cannot_replay_with_the_failure_recorded(synth_dir, tmp_path, monkeypatch):
    from dataclasses import replace

    import ray
    from test_ps_recovery_fake import job, kill

    for name in ("get", "put", "wait", "init"):  # the fake cluster, never Ray
        monkeypatch.setattr(ray, name, lambda *a, **k: (_ for _ in ()).throw(AssertionError("a fake-cluster test called Ray")))
    master, cluster = job(synth_dir, tmp_path, checkpoint__memory_interval_s=3.0)
    master.recovery.policy = replace(master.recovery.policy, replays=False)  # as a ray_data job's master has it
    cluster.at(1005.5, lambda: kill(cluster, "fake-job/ps-0"))
    summary = master.run().to_json()
    assert summary["status"] == "failed" and "a ray_data job cannot go back to a checkpoint" in summary["reason"]
    (failure,) = master.failures
    assert failure.kind.value == "ps_death" and failure.recovered_s is None
    assert not [e for e in master.events.rows() if e.kind in ("partial_recovery", "rollback")]


@pytest.mark.parametrize(
    "over, problem",
    [
        ({"checkpoint": {"on_failure": "restart"}}, "checkpoint.on_failure: restart: replays rows from a checkpoint"),
        ({"policy": {"rescale": "restart"}}, "policy.rescale: restart: replays rows"),
        ({"chaos": [{"at_s": 1, "action": "kill", "target": "master"}]}, "chaos: master: a ray_data job's master owns its blocks"),
        ({"data": {"source": "ray_data", "eval_fraction": 0.1}}, "data: eval_fraction: a ray_data job trains every row it streams"),
        ({"data": {"source": "ray_data", "paths": ["x.parquet"]}}, "data: paths: not used with source: ray_data"),
        ({"data": {"source": "ray_data", "format": "csv"}}, "data: format: csv: a Dataset's blocks are tables"),
        ({"data": {"source": "ray_data", "dataset": "no-colon"}}, "data.dataset: expected module:function"),
        ({"data": {}}, "data: paths: required (or source: ray_data)"),
    ],
)
def test_a_ray_data_spec_that_would_replay_or_names_files_is_one_line(over, problem):
    from dlrover.spec import spec_from_dict

    doc = {"data": {"source": "ray_data"}, **over}
    with pytest.raises(SpecError) as e:
        spec_from_dict(doc, "job.yaml")
    assert str(e.value).startswith(f"job.yaml: {problem}"), str(e.value)


def test_a_ray_data_spec_holds_nothing_out_and_counts_ray_datas_cpus_beside_the_actors():
    from dlrover.driver.runner import required_cpus
    from dlrover.spec import spec_from_dict

    spec = spec_from_dict({"data": {"source": "ray_data", "ray_data_cpu": 1.5}, "resources": {"workers": 2, "ps": 2}})
    assert spec.data.eval_fraction == 0.0
    assert required_cpus(spec) == 2 + 2 + 0.25 + 1.5


# -- the master's feed, on fake streams ----------------------------------------------------------
class FeedMaster:
    """What the feed uses of the master: its books, its event log, and where bad input goes."""

    def __init__(self, max_blocks: int = 4) -> None:
        from dlrover.master.events import EventLog

        self.books = ShardBooks(queue(max_blocks=max_blocks, epochs=2), FakeClock())
        self.events = EventLog(FakeClock())
        self.errors: list = []

    def bad_input(self, worker: str, error) -> None:
        self.errors.append((worker, str(error)))


class FakeStream:
    def __init__(self, blocks: list, error: BaseException | None = None) -> None:
        self._blocks, self._error = blocks, error

    def blocks(self):
        yield from self._blocks
        if self._error is not None:
            raise self._error


def test_the_feed_moves_each_epochs_blocks_into_the_books_and_ends_the_stream():
    from dlrover.master.feed import StreamFeed

    m = FeedMaster()
    StreamFeed(m, FakeStream([(0, Block("a", 0, 100)), (0, Block("b", 0, 50)), (1, Block("a2", 0, 100)), (1, Block("b2", 0, 50))]))._run()
    assert m.errors == [] and m.books.queue.ended and m.books.queue.samples_expected == 300
    assert [(e.fields["epoch"], e.fields["blocks"], e.fields["rows"]) for e in m.events.rows() if e.kind == "stream_epoch"] == [(0, 2, 150), (1, 2, 150)]


def test_an_error_in_the_stream_stops_the_job_as_bad_input_in_one_line_and_never_ends_it():
    from dlrover.master.feed import StreamFeed

    m = FeedMaster()
    raised = RuntimeError("ray::MapBatches(f)() (pid=1)\n  File \"p.py\", line 2\nValueError: price must be positive\n\nThe above exception ...")
    StreamFeed(m, FakeStream([(0, Block("a", 0, 100))], raised))._run()
    assert m.errors == [("dataset", "dataset: ValueError: price must be positive")]
    assert not m.books.queue.ended  # the job stops; its queue never finishes


def test_a_stream_without_rows_is_bad_input():
    from dlrover.master.feed import StreamFeed

    m = FeedMaster()
    StreamFeed(m, FakeStream([]))._run()
    assert m.errors == [("dataset", "dataset: no rows to train on")]


def test_the_feed_stops_taking_blocks_once_the_job_stopped():
    from dlrover.master.feed import StreamFeed

    m = FeedMaster(max_blocks=1)
    m.books.stop()
    StreamFeed(m, FakeStream([(0, Block("a", 0, 100)), (0, Block("b", 0, 100))]))._run()
    assert m.errors == [] and m.books.queue.samples_expected == 0 and not m.books.queue.ended
