"""A scale event's record: its row round-trips, and a new worker's first step lands in
the event of the change that started it whichever comes first."""

from __future__ import annotations

from dlrover.master.scale_events import FirstSteps
from dlrover.runlogs.scale_record import ScaleEvent, ScaleKind
from dlrover.resource.configs import Config
from dlrover.resource.plan import ResourcePlan

OLD = Config(1, 1, 1.0, 1.0, 1024, 1024)
NEW = Config(3, 1, 1.0, 1.0, 1024, 1024)


def event(at_s: float) -> ScaleEvent:
    plan = ResourcePlan(config=NEW, reason="test", stage="scripted")
    return ScaleEvent.of(ScaleKind.of(OLD, NEW, plan), plan, OLD, NEW, at_s)


def test_a_first_step_after_the_event_is_written_is_timed_from_the_plan():
    firsts, ev = FirstSteps(), event(at_s=10.0)
    firsts.bind(["worker-1", "worker-2"], ev)
    firsts.stepped("worker-1", 12.5)
    assert ev.to_dict()["first_step_s"] == {"worker-1": 2.5}


def test_a_first_step_before_the_event_is_written_is_kept_until_it_is():
    firsts, ev = FirstSteps(), event(at_s=10.0)
    firsts.stepped("worker-1", 11.0)  # the switch is still finishing
    firsts.bind(["worker-1"], ev)
    assert ev.first_step_s == {"worker-1": 1.0}


def test_a_worker_never_bound_is_in_no_event_and_one_that_never_steps_leaves_no_entry():
    firsts, ev = FirstSteps(), event(at_s=10.0)
    firsts.stepped("worker-0", 1.0)  # of the first launch
    firsts.bind(["worker-1"], ev)  # drained before its first step
    assert "first_step_s" not in ev.to_dict()


def test_an_event_row_reads_back_as_the_same_event():
    ev = event(at_s=10.0)
    ev.first_step_s["worker-1"] = 2.0
    ev.timings["launch_s"] = 1.5
    back = ScaleEvent.from_dict(ev.to_dict())
    assert back == ev and back.kind is ScaleKind.SCALE_OUT
