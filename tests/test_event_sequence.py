"""The recovery story of an event log (``event_sequence.recovery_story``): what the real-kill
tests compare between a real run and its fake replay; and the story each of those kills
tells on the fake cluster, here without Ray. No Ray."""

from __future__ import annotations

import pytest

from event_sequence import recovery_story, role_of, side_by_side


def test_a_log_reduces_to_its_states_faults_and_recoveries_in_the_order_written():
    job = "t-20261202-210641-5fdd"
    rows = [
        {"at_s": 0.01, "kind": "job_start", "job_id": job, "samples_expected": 324000},
        {"at_s": 0.05, "kind": "state", "state": "Launching", "status": "starting"},
        {"at_s": 27.3, "kind": "launched", "workers": 2, "ps": 2},
        {"at_s": 27.4, "kind": "state", "state": "Running", "status": "training"},
        {"at_s": 27.9, "kind": "first_step", "actor": f"{job}/worker-0"},
        {"at_s": 28.0, "kind": "metrics", "actor": f"{job}/worker-0", "samples": 1024},
        {"at_s": 28.4, "kind": "ps_metrics", "actor": f"{job}/ps-1", "busy": 0.1},
        {"at_s": 29.4, "kind": "checkpoint", "seq": 2, "samples": 16384},
        {"at_s": 3.46, "kind": "chaos", "job_s": 30.756, "action": "kill", "target": "ps:1", "actor": f"{job}/ps-1"},
        {"at_s": 30.8, "kind": "checkpoint_skipped", "why": "The actor died unexpectedly"},
        {"at_s": 30.9, "kind": "state", "state": "Recovering", "status": "recovering"},
        {"at_s": 44.3, "kind": "rollback", "samples_replayed": 16384, "dead_ps": [1], "dense": False},
        # written when handled, at the time of the kill: the order written is the story's
        {"at_s": 30.75, "kind": "failure", "failure_kind": "ps_death", "actor": f"{job}/ps-1", "cause_class": "system"},
        {"at_s": 44.3, "kind": "state", "state": "Running", "status": "training"},
        {"at_s": 44.5, "kind": "recovered", "actor": f"{job}/ps-1", "failure_kind": "ps_death", "after_s": 13.8},
        {"at_s": 50.0, "kind": "failure", "failure_kind": "worker_death", "actor": f"{job}/worker-3", "cause_class": "system"},
        {"at_s": 50.1, "kind": "failure", "failure_kind": "worker_death", "actor": f"{job}/worker-4", "cause_class": "system"},
        {"at_s": 52.0, "kind": "recovered", "actor": f"{job}/worker-3", "failure_kind": "worker_death", "after_s": 2.0},
        {"at_s": 53.7, "kind": "worker_exit", "actor": f"{job}/worker-0", "steps": 143},
        {"at_s": 53.7, "kind": "state", "state": "Evaluating", "status": "evaluating"},
        {"at_s": 55.1, "kind": "eval", "final": True, "auc": 0.744},
        {"at_s": 55.1, "kind": "state", "state": "Succeeded", "status": "succeeded"},
        {"at_s": 55.1, "kind": "job_end", "status": "succeeded"},
    ]
    assert recovery_story(rows) == [
        ("state", "Launching"),
        ("state", "Running"),
        ("chaos", "kill", "ps"),
        ("state", "Recovering"),
        ("rollback", "embedding"),
        ("failure", "ps_death", "ps"),
        ("state", "Running"),
        ("recovered", "ps_death", "ps"),
        ("failure", "worker_death", "worker"),  # two deaths back to back of whichever workers: one step,
        # and no word of a replacement's first step (whether it comes before the data runs out is a race)
        ("state", "Evaluating"),
        ("state", "Succeeded"),
        ("job_end", "succeeded"),
    ]


def test_roles_ignore_names_and_generations_and_a_master_row_reads_like_a_file_row():
    assert [role_of(a) for a in ("j/worker-12", "j/ps-0", "j/dense-ps-0-g3", "j/master", "worker:1", "ps:0", "node:1", None)] == [
        "worker", "ps", "dense-ps", "master", "worker", "ps", "node", "?",
    ]  # fmt: skip

    class Event:  # a row of ``master.events.rows()`` as a record, not a dict
        def __init__(self, at_s: float, kind: str, **fields: object) -> None:
            self.at_s, self.kind, self.fields = at_s, kind, fields

        def to_json(self) -> dict:
            return {"at_s": self.at_s, "kind": self.kind, **self.fields}

    rows = [Event(1.0, "rollback", dense=True), Event(2.0, "partial_recovery", replaced={}), Event(3.0, "job_end", status="failed")]
    assert recovery_story(rows) == [("rollback", "dense"), ("partial_recovery",), ("job_end", "failed")]
    assert recovery_story([]) == []
    diff = side_by_side([("state", "Running"), ("job_end", "succeeded")], [("state", "Running"), ("job_end", "failed")])
    assert "- job_end succeeded" in diff and "+ job_end failed" in diff


KILLS = {  # the chaos and recovery mode of the real-kill tests, and the story all tell
    "worker kill": ([{"at_s": 2, "action": "kill", "target": "worker:0"}], {}, [("failure", "worker_death", "worker")]),
    "ps kill, rollback": (
        [{"at_s": 3, "action": "kill", "target": "ps:1"}], {"recovery__ps": "rollback"},
        [("state", "Recovering"), ("rollback", "embedding"), ("failure", "ps_death", "ps"), ("state", "Running"), ("recovered", "ps_death", "ps")],
    ),
    "ps kill, partial": (
        [{"at_s": 4, "action": "kill", "target": "ps:1"}], {},
        [("state", "Recovering"), ("partial_recovery",), ("failure", "ps_death", "ps"), ("state", "Running"), ("recovered", "ps_death", "ps")],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(KILLS))
def test_the_fake_replay_of_each_real_kill_tells_its_story(case, synth_dir, tmp_path):
    from conftest import fault_spec
    from event_sequence import fake_replay

    chaos, over, recovery = KILLS[case]
    summary, story = fake_replay(fault_spec(synth_dir, tmp_path, chaos, data__epochs=1, **over), tmp_path / "fake")
    assert summary["status"] == "succeeded" and summary["samples_trained"] == summary["samples_expected"]
    start, end = [("state", "Launching"), ("state", "Running"), ("chaos", "kill", chaos[0]["target"].split(":")[0])], [("state", "Evaluating"), ("state", "Succeeded"), ("job_end", "succeeded")]
    assert story == start + recovery + end, story
