"""PAL placement in a live job (``policy.placement: pal``): node speeds from the workers'
step times and, before those, a probe run on each node; K-Means classes; new actors on
the fastest class with room; and the slow-node label that tests and benchmarks use. The pure logic is tested with plain values; the
placement itself on a real multi-node cluster (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlrover.errors import DLRoverError, SpecError
from dlrover.ids import ActorId, Role
from dlrover.resource.placement import StepSample, merged_speeds, node_speeds, pal_node
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


def test_probed_speeds_fill_in_nodes_no_worker_measured_on_the_workers_scale():
    probed = {"a": 2.0, "b": 1.0, "c": 0.5}  # the probe's own median: b
    assert merged_speeds({}, probed, "abc") == probed
    # a worker measured a at 1.0 (the only node with workers): the probe's 2.0 there maps to 1.0
    assert merged_speeds({"a": 1.0}, probed, "abc") == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.25})
    # a node that joined after the probe counts as a typical probed node, not as the workers' median
    assert merged_speeds({"a": 1.0}, probed, "abcd")["d"] == pytest.approx(0.5)
    assert merged_speeds({"a": 1.2, "d": 0.6}, {}, "ade") == {"a": 1.2, "d": 0.6, "e": 1.0}  # no probe (or it failed)


def test_placement_is_default_or_pal_and_a_bad_value_is_one_line():
    base = {"data": {"paths": ["x/*.tsv"]}}
    assert spec_from_dict(base).policy.placement == "default"
    assert spec_from_dict({**base, "policy": {"placement": "pal"}}).policy.placement == "pal"
    with pytest.raises(SpecError) as e:
        spec_from_dict({**base, "policy": {"placement": "fastest"}})
    assert "\n" not in str(e.value) and "policy.placement" in str(e.value), e.value


def test_a_bad_slowdown_label_is_one_line_naming_the_label(monkeypatch):
    import ray

    from dlrover.faults import injected as chaos

    class Context:  # the node's labels, as Ray's runtime context gives them
        def __init__(self, labels: dict[str, str]) -> None:
            self.labels = labels

        def get_node_labels(self) -> dict[str, str]:
            return self.labels

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context({chaos.SLOWDOWN_LABEL: "2.5"}))
    assert chaos.node_slowdown() == pytest.approx(2.5)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context({}))
    assert chaos.node_slowdown() == 1.0
    for bad in ("fast", "0.5", "-5", "nan", "inf"):
        monkeypatch.setattr(ray, "get_runtime_context", lambda bad=bad: Context({chaos.SLOWDOWN_LABEL: bad}))
        with pytest.raises(DLRoverError, match=f"node label {chaos.SLOWDOWN_LABEL}: '{bad}'") as e:
            chaos.node_slowdown()
        assert "\n" not in str(e.value)


def test_a_slow_node_burns_cpu_rather_than_sleeping():
    from dlrover.faults.injected import ChaosState

    cpu0, wall0 = time.thread_time(), time.perf_counter()
    ChaosState(node_slowdown=3.0).after_step(0.05)  # a 50 ms step, 3x slower: 100 ms more of CPU
    assert time.thread_time() - cpu0 >= 0.1
    assert time.perf_counter() - wall0 >= 0.1
    cpu0 = time.thread_time()
    ChaosState(node_slowdown=3.0).after_step(2.0, cpu_s=0.05)  # a step that mostly waited: its CPU is multiplied
    assert 0.1 <= time.thread_time() - cpu0 < 1.0
    cpu0 = time.thread_time()
    ChaosState().after_step(0.05)  # no label: nothing added
    assert time.thread_time() - cpu0 < 0.05


PAL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    import ray
    from ray.cluster_utils import Cluster
    from conftest import small_spec
    from dlrover.faults.injected import SLOWDOWN_LABEL
    from dlrover.driver.runner import run_job

    cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 0}})
    # Two nodes of 4 CPUs; PAL's probe finds the slow one slow before anything runs, so the
    # PS, the first worker, the scale-out's worker and the first worker's replacement (it
    # is killed) all go to the fast node (2.5 CPUs at most), though the slow one has room.
    # 4 epochs: the replacement (a start-up of 10 s or more here) must still find work. The
    # scale-out's worker and the replacement both ran by 13% of 6 epochs' samples (the
    # first seconds train on one worker, then none while the two start).
    slow = cluster.add_node(num_cpus=4, labels={{SLOWDOWN_LABEL: "4"}})
    fast = cluster.add_node(num_cpus=4)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="dlrover", logging_level="ERROR")
    steps = [{{"after_window_s": 1.5, "workers": 2}}]
    spec = small_spec({data!r}, data__epochs=4, chaos=[{{"at_s": 6, "action": "kill", "target": "worker:0"}}],
                      data__batch_size=256, train__log_every_s=0.3,
                      resources__workers=1, resources__ps=1, resources__ps_cpu=0.5, resources__dense_ps_cpu=0,
                      resources__budget_cpu=2.5,
                      policy={{"name": "scripted", "knobs": {{"steps": steps}}, "interval_s": 0.2, "warmup_s": 1.0,
                               "placement": "pal", "history_dir": {hist!r}}})
    s, path = run_job(spec, runs_dir={runs!r}, progress="none", job_id="pal-job")
    print("NODES " + json.dumps({{"slow": slow.node_id, "fast": fast.node_id}}))
    print("SUMMARY " + json.dumps(s, default=float))
    """
)


@pytest.mark.timeout(300)
def test_pal_puts_new_workers_and_replacements_on_the_fast_node_though_the_slow_one_has_room(synth_dir, tmp_path):
    script = PAL_SCRIPT.format(tests=str(Path(__file__).parent), data=str(synth_dir), runs=str(tmp_path / "runs"), hist=str(tmp_path / "h"))
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=280, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    s = json.loads(line[len("SUMMARY ") :])
    nodes = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("NODES "))[len("NODES ") :])
    assert s["status"] == "succeeded" and s["samples_trained"] == s["samples_expected"]
    assert [e["kind"] for e in s["scale_events"]] == ["scale_out"], s["scale_events"]
    assert [c["action"] for c in s.get("chaos") or []] == ["kill"], "the kill at 6 s did not fire before the job ended"
    w = [ActorId(Role.WORKER, i).ray_name("pal-job") for i in range(3)]
    deaths = [f for f in s["failures"] if f["kind"] == "worker_death"]
    assert [f["actor"] for f in deaths] == [w[0]], s["failures"]
    assert deaths[0]["replacement"] in w[1:], deaths  # the kill came before or after the scale-out
    events = [json.loads(x) for x in (tmp_path / "runs" / "pal-job" / "events.jsonl").read_text().splitlines()]
    ran_on: dict[str, set] = {}
    for e in events:
        if e["kind"] == "metrics" and e.get("node_id") and e["actor"] in w:
            ran_on.setdefault(e["actor"], set()).add(e["node_id"])
    assert set(ran_on) == set(w), ran_on
    assert all(n == {nodes["fast"]} for n in ran_on.values()), (ran_on, nodes)
    probed = s["node_speeds_probed"]
    assert set(probed) == {nodes["slow"], nodes["fast"]}, probed  # the head offers no CPUs: not probed
    assert probed[nodes["slow"]] < probed[nodes["fast"]] / 2, probed  # 4x slower, measured before any worker ran there
