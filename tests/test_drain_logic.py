"""The drain logic stepped without Ray: a fake job whose controller records the
replacements asked of it, a fake list of Ray's draining nodes, a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

from dlrover.master.drain import NodeDrains


class FakeControl:
    def __init__(self) -> None:
        self.asked: list[tuple[list[str], str]] = []
        self.op = False

    def busy(self) -> bool:
        return self.op

    def replace_now(self, actors, reason):
        self.asked.append((sorted(actors), reason))
        self.op = True  # a rescale is now under way
        return {}


def fake_job(nodes: dict[str, str]):
    """Actors (name -> node) of a job with a worker, two PS and the dense PS."""
    events: list[dict] = []
    lz = SimpleNamespace(nodes=dict(nodes), dense_names=("j/dense-ps-0-g0",), handle=lambda n: object() if n in lz.nodes else None)
    job = SimpleNamespace(
        launcher=lz, control=FakeControl(), t0=0.0, now=10.0, draining=set(),
        events=SimpleNamespace(add=lambda kind, **f: events.append(dict(f, kind=kind))),
    )  # fmt: skip
    job.clock = lambda: job.now
    job.books = SimpleNamespace(draining=lambda: frozenset(job.draining))
    return job, events


NODES = {"j/worker-0": "A", "j/ps-0": "A", "j/ps-1": "B", "j/dense-ps-0-g0": "A"}


def test_a_draining_node_has_its_workers_and_ps_replaced_but_not_the_dense_ps():
    job, events = fake_job(NODES)
    drains = NodeDrains(job, draining=lambda: {"A": None})
    drains.tick()
    assert job.control.asked == [(["j/ps-0", "j/worker-0"], "node A is being drained")]
    (seen,) = [e for e in events if e["kind"] == "node_drain"]
    assert seen["node"] == "A" and seen["deadline_in_s"] is None


def test_nothing_is_asked_while_a_rescale_is_under_way_and_drained_workers_are_left_to_leave():
    job, _ = fake_job(NODES)
    drains = NodeDrains(job, draining=lambda: {"A": None})
    job.control.op = True
    drains.tick()
    assert job.control.asked == []
    job.control.op = False
    job.draining = {"j/worker-0"}  # already on its way out
    drains.tick()
    assert job.control.asked == [(["j/ps-0"], "node A is being drained")]


def test_the_deadline_is_read_on_the_wall_clock_and_kept_in_job_time():
    job, events = fake_job(NODES)
    drains = NodeDrains(job, draining=lambda: {"B": 1_000_060.0}, wall=lambda: 1_000_000.0)
    drains.tick()
    assert drains.orders["B"].deadline_s == 10.0 + 60.0
    assert [e["deadline_in_s"] for e in events if e["kind"] == "node_drain"] == [60.0]


def test_a_sigterm_notice_replaces_that_actor_alone():
    job, _ = fake_job(NODES)
    drains = NodeDrains(job, draining=lambda: {})
    drains.preempted("j/ps-1")
    drains.tick()
    assert job.control.asked == [(["j/ps-1"], "j/ps-1 got SIGTERM")]


def test_a_failing_poll_is_an_event_and_the_next_tick_asks_again():
    job, events = fake_job(NODES)
    answers = iter([RuntimeError("gcs down"), {"A": None}])

    def poll():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    drains = NodeDrains(job, draining=poll)
    drains.tick()
    assert [e["kind"] for e in events] == ["drain_poll_error"] and job.control.asked == []
    drains.tick()
    assert job.control.asked and "A" in drains.orders
