"""Elastic operations: vshard moves, scale plans, live rescaling with real actors."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest
import torch

from conftest import sleepy, small_spec
from dlrover.master.launcher import Launcher
from dlrover.master.scaler import scale_plan
from dlrover.ps.vshard import VShardMap
from dlrover.resource.configs import Config
from dlrover.resource.plan import ResourcePlan

SIZES = [10, 1000, 7]


def test_reassign_moves_few_vshards_and_balances():
    v = VShardMap.round_robin(SIZES, 12, 2)
    grown = v.reassigned([0, 1, 2])
    counts = np.bincount(grown.owner, minlength=3)
    assert sorted(counts) == [4, 4, 4]
    assert len(v.moves(grown)) == 4  # only what the new PS needs
    assert grown.version == v.version + 1
    shrunk = grown.reassigned([2])
    assert set(shrunk.owner) == {2} and len(grown.moves(shrunk)) == 8
    # Load-aware: PS 0 twice as busy as PS 1 -> it gives vshards away.
    hot = v.reassigned([0, 1], load={0: 2.0, 1: 1.0})
    assert np.sum(hot.owner == 0) < np.sum(hot.owner == 1)
    # No load measured yet (every PS at 0) or equal loads: ends, and moves nothing.
    assert not v.moves(v.reassigned([0, 1], load={0: 0.0, 1: 0.0}))
    assert not v.moves(v.reassigned([0, 1], load={0: 1.0, 1: 1.0}))


def test_scale_plan_diff():
    name = lambda k: f"j/ps-{k}"  # noqa: E731
    workers = {"j/worker-0": (1.0, 1024), "j/worker-1": (1.0, 1024)}
    ps = {0: (1.0, 512)}
    grow = scale_plan(ResourcePlan(Config(3, 2, 1.0, 1.0, 1024, 512), "t"), workers, ps, name)
    assert len(grow.add_workers) == 1 and not grow.drain_workers and len(grow.add_ps) == 1 and not grow.retire_ps
    resize = scale_plan(ResourcePlan(Config(2, 1, 2.0, 1.0, 1024, 512), "t"), workers, ps, name)
    assert resize.add_workers == [(2.0, 1024)] * 2 and sorted(resize.drain_workers) == sorted(workers)
    swap = scale_plan(ResourcePlan(Config(2, 1, 1.0, 1.0, 1024, 512), "t", replace=["j/worker-1", "j/ps-0"]), workers, ps, name)
    assert swap.drain_workers == ["j/worker-1"] and len(swap.add_workers) == 1 and swap.retire_ps == [0] and len(swap.add_ps) == 1
    assert scale_plan(ResourcePlan(Config(2, 1, 1.0, 1.0, 1024, 512), "t"), workers, ps, name).empty()


def _run(ray_local, spec, tmp_path, tag):
    from dlrover.driver.runner import run_job

    summary, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id=f"elastic-{tag}")
    return summary, torch.load(tmp_path / "ckpt" / f"elastic-{tag}" / "final.pt", weights_only=True)


DETERMINISTIC = dict(
    seed=1,
    optimizer__sparse={"name": "sgd", "lr": 0.05},
    optimizer__dense={"name": "sgd", "lr": 0.05},
    train__deterministic=True,
    train__staleness=0,
    train__log_every_s=0.2,
    data__epochs=2,  # the first rescale starts three actors on a busy 2-core host: 10+ s
    data__batch_size=128,  # many small steps (slept 2x after in the rescaled run): the job outlasts the rescales
    resources__workers=1,
    resources__ps=1,
    resources__budget_cpu=8,
)


def test_rescaled_run_ends_with_the_same_tables(ray_local, synth_dir, tmp_path):
    """Adding and removing PS and workers mid-training changes nothing in what is learnt:
    no update is lost or applied twice (deterministic mode: one shard at a time)."""
    common = dict(DETERMINISTIC, checkpoint__dir=str(tmp_path / "ckpt"), policy__history_dir=str(tmp_path / "hist"))
    base, base_model = _run(ray_local, small_spec(synth_dir, **common), tmp_path, "static")
    steps = [
        {"at_progress": 0.1, "workers": 2, "ps": 3},  # launches: the slow one
        {"at_progress": 0.5, "workers": 1, "ps": 2},  # drain a worker, retire a PS
        {"at_progress": 0.6, "ps": 1},
    ]
    spec = small_spec(synth_dir, **common, chaos=sleepy(3, workers=1), policy={"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.2, "warmup_s": 0.2})
    scaled, scaled_model = _run(ray_local, spec, tmp_path, "scripted")
    assert scaled["status"] == "succeeded" and scaled["samples_lost"] == 0
    assert scaled["samples_trained"] == base["samples_trained"] == base["samples_expected"]
    assert len(scaled["scale_events"]) == len(steps), scaled["scale_events"]
    assert sum(e["vshards_moved"] for e in scaled["scale_events"]) > 0
    for a, b in zip(base_model["tables"], scaled_model["tables"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(base_model["dense"], scaled_model["dense"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(base_model["tables"][0], torch.zeros_like(base_model["tables"][0]))
    # One code path: the same policy section, run by the cluster simulator, takes the same
    # decisions as it did in the live JobMaster.
    assert simulated_configs(spec) == [e["to"] for e in scaled["scale_events"]]


def simulated_configs(spec) -> list[dict]:
    """The configurations a job spec's policy moves to when the simulator runs it."""
    import pandas as pd

    from dlrover.resource.configs import job_budget
    from dlrover.resource.perf_model import DEFAULT_PRIOR
    from dlrover.resource.configs import Config
    from dlrover.sim import ClusterSpec, SimSettings, simulate
    from dlrover.sim.truth import TRUTH_TERMS

    r = spec.resources
    budget = job_budget(spec, Config.from_resources(r))
    row = {
        "job_id": "j", "submit_s": 0.0, "signature": "s", "batch_size": spec.data.batch_size, "samples": 10**7, "epochs": 1,
        "req_workers": r.workers, "req_ps": r.ps, "req_worker_cpu": r.worker_cpu, "req_ps_cpu": r.ps_cpu,
        "req_worker_memory_mb": r.worker_memory_mb, "req_ps_memory_mb": r.ps_memory_mb, **dict(zip(TRUTH_TERMS, DEFAULT_PRIOR)),
        "budget_cpu": budget.cpu, "budget_memory_mb": budget.memory_mb, "worker_memory_need_mb": 1, "ps_memory_need_mb": 1,
    }  # fmt: skip
    cluster = ClusterSpec(nodes=1, node_cpu=16, perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)
    settings = SimSettings(control_interval_s=5.0, max_ps=spec.train.vshards)
    res = simulate(pd.DataFrame([row]), spec.policy.name, spec.policy.config, spec.policy.knobs, cluster=cluster, settings=settings)
    return [e["config"] for e in res.events.to_dict("records") if e["kind"] == "scale"]


def test_async_rescale_applies_every_update_once(ray_local, synth_dir, tmp_path):
    """Normal (asynchronous) training through a scale-out that also resizes every PS
    (all vshards move to new, bigger PS), then a scale-in: every sample trained once and
    every bag update applied exactly once across the moves. The scale-in fires once the
    scaled-out job was measured 3 s (the policy is not asked while a rescale is under
    way): it drains the new worker, which has stepped by then, so the scale-out's event
    holds its first step."""
    steps = [
        {"at_s": 0.0, "workers": 3, "ps": 3, "ps_cpu": 2},
        {"after_window_s": 3.0, "workers": 2, "ps": 2},
    ]
    spec = small_spec(
        synth_dir,
        data__epochs=5,
        # The scale-out fires at the first tick, and the job (~50 s of training here)
        # outlasts starting its four new actors (~20 s here, ~30 s on a busy CI machine) by
        # as much again, so the scale-in has job left to fire in. It drains the new worker
        # (scale-in keeps the oldest), which has stepped by then. The first two workers
        # sleep twice each step's time after it (``slow``, factor 3): 5 epochs last as
        # long as 14 did, at the CPU of 5.
        chaos=sleepy(3),
        data__batch_size=128,
        resources__budget_cpu=10,
        train__log_every_s=0.2,
        policy={"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.2, "warmup_s": 0.2, "history_dir": str(tmp_path / "h")},
    )
    from dlrover.driver.runner import run_job

    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0
    assert s["samples_trained"] == s["samples_expected"]
    assert s["ps_bags_updated"] == 26 * s["samples_expected"]
    assert [e["kind"] for e in s["scale_events"]] == ["scale_out", "scale_in"], s["scale_events"]
    assert s["scale_events"][0]["vshards_moved"] == spec.train.vshards  # every PS replaced
    assert s["scale_events"][1]["vshards_moved"] > 0  # a retired PS handed its vshards on
    assert s["final_config"] == Config(2, 2, 1.0, 2.0, 2048, 1024).to_dict()
    first_steps = s["scale_events"][0].get("first_step_s", {})
    assert len(first_steps) == 1 and all(t > 0 for t in first_steps.values()), s["scale_events"][0]  # 2 -> 3 workers: one new
    assert s["auc"] > 0.6  # it learnt (5 epochs of 36k rows overfit a little)

    # Stage 1 of dlrover_rm: the next run of this job starts from the best configuration
    # measured above (read from the history store the run just wrote).
    best = max(s["configurations"], key=lambda c: c["measured_throughput"])["config"]
    again = small_spec(
        synth_dir,
        data__epochs=1,
        data__batch_size=128,
        resources__budget_cpu=10,
        policy={"name": "dlrover_rm", "history_dir": str(tmp_path / "h")},
    )
    s2, _ = run_job(again, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s2["status"] == "succeeded" and s2["samples_lost"] == 0
    assert s2["initial_plan"]["stage"] == "warm_start", s2["initial_plan"]
    assert s2["initial_plan"]["config"] == best


def test_stop_checkpoint_restart_baseline_loses_nothing(ray_local, synth_dir, tmp_path):
    """The benchmark's baseline (policy.rescale: restart) is a correct rescale too."""
    from dlrover.driver.runner import run_job

    spec = small_spec(
        synth_dir,
        data__epochs=2,
        resources__workers=1,
        resources__ps=1,
        resources__budget_cpu=6,
        policy={
            "name": "scripted",
            "knobs": {"steps": [{"at_progress": 0.1, "workers": 2, "ps": 2}]},
            "interval_s": 0.2,
            "rescale": "restart",
            "history_dir": str(tmp_path / "h"),
        },
    )
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none")
    assert s["status"] == "succeeded" and s["samples_lost"] == 0
    assert s["samples_trained"] == s["samples_expected"]
    assert s["ps_bags_updated"] == 26 * s["samples_expected"]
    (ev,) = s["scale_events"]
    assert ev["ops"] == ["stop", "checkpoint", "relaunch", "restore"] and ev["pause_s"] > 0
    assert s["final_config"]["workers"] == 2 and s["final_config"]["ps"] == 2


def test_a_precopy_cancelled_while_two_ps_feed_each_other_ends_and_changes_nothing(ray_local):
    """Each PS's pre-copy asks the other for vshards as both are told to cancel: the
    exports queued behind the cancels must keep neither waiting on the other."""
    from dlrover.ps.embedding_ps import EmbeddingPS

    v1 = VShardMap.round_robin([60_000, 40_000], 32, 2)
    v2 = v1.with_owner(1 - v1.owner)  # every vshard changes hands
    actor = ray_local.remote(EmbeddingPS)
    ps = [actor.remote(k, v1, 16, {"name": "rowwise_adagrad", "lr": 0.1}, seed=3) for k in range(2)]
    before = ray_local.get([p.snapshot.remote() for p in ps])
    ray_local.get([p.track.remote() for p in ps])
    ray_local.get([ps[k].prepare.remote(v2, [(ps[1 - k], v1.owned(1 - k).tolist())]) for k in range(2)])
    ray_local.get([p.cancel_migration.remote() for p in ps], timeout=60)
    assert ray_local.get([p.prepared.remote() for p in ps]) == [True, True]
    after = ray_local.get([p.snapshot.remote() for p in ps])
    for (_, b), (_, a) in zip(before, after):
        np.testing.assert_array_equal(a["vshards"], b["vshards"])
        for tb, ta in zip(b["tables"], a["tables"]):
            for xb, xa in zip(tb, ta):
                np.testing.assert_array_equal(xa, xb)


class PsOnly:
    """What a Scaler asks of its launcher, for PS actors alone (no workers to park)."""

    def __init__(self, ps: dict, vmap: VShardMap) -> None:
        from dlrover.master.cluster import RayCluster

        self.ps, self.vmap, self.workers, self.cluster = ps, vmap, {}, RayCluster()

    switch_map = Launcher.switch_map

    def remove_ps(self, k: int) -> None:
        self.ps.pop(k)


def two_to_three_ps(ray_local):
    """PS 0 and 1 on a map of 2 PS, PS 2 just started, and the Scaler op that moves
    vshards to it: ``(v1, ps, PS 0's snapshot, scaler, op)``."""
    from dlrover.master.scaler import ScaleOp, ScalePlan, Scaler
    from dlrover.ps.embedding_ps import EmbeddingPS

    v1 = VShardMap.round_robin([200_000, 40_000], 32, 2)
    actor = ray_local.remote(EmbeddingPS)
    ps = {k: actor.remote(k, v1, 16, {"name": "rowwise_adagrad", "lr": 0.1}, seed=3) for k in range(3)}  # PS 2: the new one
    before = ray_local.get(ps[0].snapshot.remote())[1]
    scaler = Scaler(PsOnly(ps, v1), running=list, clock=time.monotonic, soon=lambda s: None)
    op = ScaleOp(ScalePlan(add_ps=[(1.0, 512)]), new_ps=[2], new_workers=[], probes=[], started=0.0, deadline=float("inf"))
    return v1, ps, before, scaler, op


@pytest.mark.parametrize("kill", ["during_precopy", "before_switch"])
def test_a_ps_killed_during_a_move_leaves_every_survivor_on_the_old_map_and_tables(ray_local, kill):
    """PS 1 is SIGKILLed while 2 -> 3 PS pre-copies, or once it is done: PS 0 has nothing
    to receive and could switch alone, PS 2 cannot (PS 1's rows are gone). The move must
    be aborted everywhere, so that PS 1 is lost under the map every survivor still serves."""
    from dlrover.master.scaler import MigrationAborted

    v1, ps, before, scaler, op = two_to_three_ps(ray_local)
    pid = ray_local.get(ps[1].ping.remote()).pid
    scaler.start_migration(op)
    mig = op.migration
    assert {d for _, s, d in mig.moves if s == 0} == {2} and not any(d == 0 for _, _, d in mig.moves)
    if kill == "during_precopy":
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(MigrationAborted) as aborted:
        while not scaler.precopied(op):
            time.sleep(0.05)
        if kill == "before_switch":
            os.kill(pid, signal.SIGKILL)
        scaler.finish(op)
    assert ("pre-copy" in str(aborted.value)) == (kill == "during_precopy")
    scaler.abort(op, workers=False)
    assert scaler.launcher.vmap is v1 and sorted(ps) == [0, 1]
    after = ray_local.get(ps[0].snapshot.remote())[1]
    np.testing.assert_array_equal(after["vshards"], v1.owned(0))  # still PS 0's vshards under v1
    for tb, ta in zip(before["tables"], after["tables"]):
        for xb, xa in zip(tb, ta):
            np.testing.assert_array_equal(xa, xb)


class DiesOnCommit:
    """A PS handle whose process is SIGKILLed as the commit is sent to it: every PS has
    staged the new map, and this one dies before it switches."""

    def __init__(self, handle, pid: int) -> None:
        self.handle, self.pid = handle, pid

    def __getattr__(self, name: str):
        return getattr(self.handle, name)

    @property
    def commit_switch(self):
        import psutil

        os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(self.pid).wait(timeout=30)
        return self.handle.commit_switch


def test_a_ps_killed_between_staging_and_commit_is_lost_under_the_new_map_the_others_serve(ray_local):
    """PS 1 dies after every PS staged 2 -> 3 PS, before its commit: the switch cannot be
    undone on the PS that committed, so it goes through. The survivors serve the new map,
    holding the rows that moved to them, and PS 1 is lost under the new map (its
    replacement restores PS 1's new vshards, as after any PS loss)."""
    v1, ps, before, scaler, op = two_to_three_ps(ray_local)
    handle, pid = ps[1], ray_local.get(ps[1].ping.remote()).pid
    scaler.start_migration(op)
    while not scaler.precopied(op):
        time.sleep(0.05)
    v2 = op.migration.vmap
    scaler.launcher.ps[1] = DiesOnCommit(handle, pid)
    scaler.finish(op)  # no MigrationAborted: past staging there is no going back
    assert scaler.launcher.vmap is v2
    with pytest.raises(ray_local.exceptions.RayActorError):
        ray_local.get(handle.stats.remote(), timeout=60)
    snaps = {k: ray_local.get(ps[k].snapshot.remote())[1] for k in (0, 2)}
    for k, snap in snaps.items():
        np.testing.assert_array_equal(snap["vshards"], v2.owned(k))
    # The vshards PS 0 gave PS 2 arrived with their weights and optimizer state.
    given = [v for v, src, dst in op.migration.moves if src == 0 and dst == 2]
    assert given
    rpv = v1.rows_per_vshard()
    for v in given:
        i, j = list(before["vshards"]).index(v), list(snaps[2]["vshards"]).index(v)
        for t, r in enumerate(rpv):
            for xb, xa in zip(before["tables"][t], snaps[2]["tables"][t]):
                np.testing.assert_array_equal(xa[j * r : (j + 1) * r], xb[i * r : (i + 1) * r])
