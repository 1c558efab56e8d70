"""PAL placement in a live job (``policy.placement: pal``): node speeds from the workers'
step times, K-Means classes, new actors on the fastest class with room; and the slow-node
label that tests and benchmarks use. The pure logic is tested with plain values; the
placement itself on a real multi-node cluster (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlrover.errors import DLRoverError, SpecError
from dlrover.resource.placement import StepSample, node_speeds, pal_node
from dlrover.spec import spec_from_dict


def test_node_speed_is_the_jobs_median_step_time_over_the_nodes_median():
    samples = [StepSample("a", 0.1), StepSample("a", 0.1), StepSample("b", 0.2), StepSample("b", 0.4), StepSample("c", 0.0)]
    speeds = node_speeds(samples)  # job median 0.15; "c" reported no step
    assert speeds == pytest.approx({"a": 1.5, "b": 0.5})
    assert node_speeds([]) == {}


def test_pal_takes_the_fastest_class_with_room_and_there_the_roomiest_node():
    speeds = {"fast1": 1.4, "fast2": 1.38, "mid": 1.0, "slow": 0.4}
    free = {"fast1": 1.0, "fast2": 3.0, "mid": 8.0, "slow": 8.0}
    assert pal_node(free, speeds, cpu=1.0) == "fast2"  # fast class, most room
    assert pal_node(free, speeds, cpu=2.0) == "fast2"
    assert pal_node({**free, "fast2": 0.5}, speeds, cpu=1.0) == "fast1"
    assert pal_node({**free, "fast1": 0.0, "fast2": 0.5}, speeds, cpu=1.0) == "mid"  # fast class full: the next class
    assert pal_node({"fast1": 0.0, "slow": 2.0}, speeds, cpu=1.0) == "slow"  # room beats speed
    assert pal_node({"fast1": 0.5, "slow": 0.5}, speeds, cpu=1.0) is None  # no room anywhere: Ray decides


def test_unmeasured_nodes_count_as_median_speed():
    speeds = {"slow": 0.3, "fast": 1.2}
    free = {"slow": 4.0, "fast": 1.0, "new": 2.0}
    assert pal_node(free, speeds, cpu=1.0) == "fast"
    assert pal_node({**free, "fast": 0.0}, speeds, cpu=1.0) == "new"  # median beats slow, though slow has more room
    assert pal_node({"a": 1.0, "b": 3.0}, {}, cpu=1.0) == "b"  # nothing measured: one class, most room


def test_placement_is_default_or_pal_and_a_bad_value_is_one_line():
    base = {"data": {"paths": ["x/*.tsv"]}}
    assert spec_from_dict(base).policy.placement == "default"
    assert spec_from_dict({**base, "policy": {"placement": "pal"}}).policy.placement == "pal"
    with pytest.raises(SpecError) as e:
        spec_from_dict({**base, "policy": {"placement": "fastest"}})
    assert "\n" not in str(e.value) and "policy.placement" in str(e.value), e.value


def test_a_bad_step_delay_label_is_one_line_naming_the_label(monkeypatch):
    import ray

    from dlrover import chaos

    class Context:  # the node's labels, as Ray's runtime context gives them
        def __init__(self, labels: dict[str, str]) -> None:
            self.labels = labels

        def get_node_labels(self) -> dict[str, str]:
            return self.labels

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context({chaos.STEP_DELAY_LABEL: "40"}))
    assert chaos.node_step_delay_s() == pytest.approx(0.04)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context({}))
    assert chaos.node_step_delay_s() == 0.0
    for bad in ("fast", "-5", "nan"):
        monkeypatch.setattr(ray, "get_runtime_context", lambda bad=bad: Context({chaos.STEP_DELAY_LABEL: bad}))
        with pytest.raises(DLRoverError, match=f"node label {chaos.STEP_DELAY_LABEL}: '{bad}'") as e:
            chaos.node_step_delay_s()
        assert "\n" not in str(e.value)


PAL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import ray
    from ray.cluster_utils import Cluster
    from conftest import small_spec
    from dlrover.chaos import STEP_DELAY_LABEL
    from dlrover.runner import run_job

    cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 0}})
    # The slow node is the roomiest, so the first PS and worker land there (one class while
    # nothing is measured: most room); the second worker then goes to the fast node (room
    # 3 > 4 - 1.5), so both nodes are measured before the third worker, for which both have room.
    slow = cluster.add_node(num_cpus=4, labels={{STEP_DELAY_LABEL: "150"}})
    fast = cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="dlrover", logging_level="ERROR")
    steps = [{{"after_window_s": 1.5, "workers": 2}}, {{"after_window_s": 1.5, "workers": 3}}]
    spec = small_spec({data!r}, data__epochs=3, data__batch_size=256, train__log_every_s=0.3,
                      resources__workers=1, resources__ps=1, resources__ps_cpu=0.5, resources__dense_ps_cpu=0,
                      resources__budget_cpu=3.5,
                      policy={{"name": "scripted", "knobs": {{"steps": steps}}, "interval_s": 0.2, "warmup_s": 1.0,
                               "placement": "pal", "history_dir": {hist!r}}})
    s, path = run_job(spec, runs_dir={runs!r}, progress="none", job_id="pal-job")
    print("NODES " + json.dumps({{"slow": slow.node_id, "fast": fast.node_id}}))
    print("SUMMARY " + json.dumps(s, default=float))
    """
)


@pytest.mark.timeout(300)
def test_pal_puts_new_workers_on_the_fast_node_though_the_slow_one_has_room(synth_dir, tmp_path):
    script = PAL_SCRIPT.format(tests=str(Path(__file__).parent), data=str(synth_dir), runs=str(tmp_path / "runs"), hist=str(tmp_path / "h"))
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=280, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    s = json.loads(line[len("SUMMARY ") :])
    nodes = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("NODES "))[len("NODES ") :])
    assert s["status"] == "succeeded" and s["samples_trained"] == s["samples_expected"]
    assert [e["kind"] for e in s["scale_events"]] == ["scale_out", "scale_out"], s["scale_events"]
    events = [json.loads(x) for x in (tmp_path / "runs" / "pal-job" / "events.jsonl").read_text().splitlines()]
    ran_on: dict[str, set] = {}
    for e in events:
        if e["kind"] == "metrics" and e.get("node_id"):
            ran_on.setdefault(e["actor"].split("/")[-1], set()).add(e["node_id"])
    assert ran_on.get("worker-0") == {nodes["slow"]}, ran_on
    assert ran_on.get("worker-1") == {nodes["fast"]}, ran_on  # the first measurement of the fast node
    assert ran_on.get("worker-2") == {nodes["fast"]}, ran_on  # measured faster: not the slow node, though it has room
