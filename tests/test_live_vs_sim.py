"""One loop: the real ``dlrover_rm`` policy takes the same decisions live (the master's
Controller, over fake actors and no Ray) and in the simulator when both are fed the same
job."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from conftest import small_spec
from fake_cluster import FakeCluster
from dlrover.ps.ps_stats import PsStats
from dlrover.master.scaler import ScaleOp, ScalePhase, ScalePlan, ScaleResult
from dlrover.resource.configs import Config
from dlrover.resource.perf_model import PerfParams, throughput
from dlrover.resource.policies import load_policy
from dlrover.sim.truth import TRUTH_TERMS
from dlrover.worker.window import WorkerReport

TRUTH = PerfParams(t0=0.01, t1=1.2e-3, t2=0.01, t3=0.004, t4=3e-4)
NEEDS_MB = {"worker": 1000.0, "ps": 3300.0}  # the PS's share of the tables + 512 MB runs at 93% of its 4096 MB
REPORT_S = 10.0  # workers report this often
TICK_S = 300.0


class FakeLauncher:
    """The job's actors by name with their (CPUs, memory MB), as the real Launcher keeps them."""

    def __init__(self, job: str) -> None:
        self.cluster = FakeCluster()
        self.job, self.workers, self.ps, self.resources, self.vmap = job, {}, {}, {}, "routing"
        self.next_worker = self.next_ps = 0

    def ps_name(self, k: int) -> str:
        return f"{self.job}/ps-{k}"

    def launch(self, c: Config) -> None:
        for _ in range(c.workers):
            self.add_worker(c.worker_cpu, c.worker_memory_mb)
        for _ in range(c.ps):
            self.add_ps(c.ps_cpu, c.ps_memory_mb)

    def add_worker(self, cpu: float, mem: int) -> str:
        name = f"{self.job}/worker-{self.next_worker}"
        self.next_worker += 1
        self.workers[name], self.resources[name] = name, (cpu, mem)
        return name

    def add_ps(self, cpu: float, mem: int) -> int:
        k = self.next_ps
        self.next_ps += 1
        self.ps[k], self.resources[self.ps_name(k)] = self.cluster.actor(FakePS, self), (cpu, mem)
        return k

    def config(self, exclude: frozenset = frozenset()) -> Config:
        w = [self.resources[n] for n in self.workers if n not in exclude]
        p = [self.resources[self.ps_name(k)] for k in self.ps]
        return Config(len(w), len(p), w[0][0], p[0][0], w[0][1], p[0][1])


class FakePS:
    """A PS whose stats say what the simulator's truth says: RSS = its share of the tables + 512 MB."""

    def __init__(self, launcher: FakeLauncher) -> None:
        self.launcher = launcher

    def stats(self) -> PsStats:
        return PsStats(uptime_s=1.0, rss_mb=NEEDS_MB["ps"] / len(self.launcher.ps) + 512.0)


class FakeScaler:
    """Carries out a ScalePlan at once: new actors run as soon as they are asked for."""

    launch_timeout_s = 1.0

    def __init__(self, launcher: FakeLauncher) -> None:
        self.lz = launcher

    def begin(self, sp: ScalePlan) -> ScaleOp:
        new_workers = [self.lz.add_worker(*size) for size in sp.add_workers]
        new_ps = [self.lz.add_ps(*size) for size in sp.add_ps]
        return ScaleOp(sp, new_ps, new_workers, [], 0.0, float("inf"))

    def ready(self, op) -> bool:
        return True

    def start_new_workers(self, op) -> dict:
        return {}

    def start_migration(self, op: ScaleOp, ps_load: dict | None = None) -> None:
        op.phase = ScalePhase.DONE  # no vshard to move here: straight to the switch

    def finish(self, op: ScaleOp) -> ScaleResult:
        for k in op.plan.retire_ps:
            self.lz.resources.pop(self.lz.ps_name(k))
            del self.lz.ps[k]
        return ScaleResult(op.new_workers, list(op.plan.drain_workers), [])


class FakeMaster:
    """What the Controller reads of its JobMaster, on a fake clock."""

    def __init__(self, spec, total: float) -> None:
        self.spec, self.job_id, self.t0, self.now = spec, "t", 0.0, 0.0
        self.launcher = FakeLauncher("t")
        self.cluster = self.launcher.cluster
        self.events = SimpleNamespace(add=lambda kind, **fields: None)
        self.scale_events: list = []
        self.books = FakeBooks(self.launcher, total)
        self.evaluator = SimpleNamespace(busy=lambda: False)
        self.recovery = SimpleNamespace(corrected=lambda *a: None)
        self.runs = SimpleNamespace(soon=lambda timeout_s: None, workers=lambda: [])
        self.follower = None  # not a data.follow job

    def clock(self) -> float:
        return self.now


class FakeBooks:
    """The books' calls the Controller makes; a drained worker leaves at once."""

    def __init__(self, launcher: FakeLauncher, total: float) -> None:
        self.launcher = launcher
        self.queue = SimpleNamespace(samples_done=0, samples_expected=int(total), finished=False)
        self.metrics: dict[str, WorkerReport] = {}

    def worker_reports(self) -> dict[str, WorkerReport]:
        return dict(self.metrics)

    def draining(self) -> frozenset[str]:
        return frozenset()

    def settled(self) -> bool:
        return True

    def drain(self, names: list[str]) -> None:
        for n in names:
            del self.launcher.workers[n]
            self.launcher.resources.pop(n)
            self.metrics.pop(n, None)


def job_spec(tmp_path):
    return small_spec(
        tmp_path,
        data__batch_size=512,
        resources={"workers": 2, "ps": 1, "worker_cpu": 2, "ps_cpu": 2, "worker_memory_mb": 4096, "ps_memory_mb": 4096, "budget_cpu": 32, "budget_memory_mb": 65536},
        policy={"name": "dlrover_rm", "config": "policies/cluster/dlrover_rm.yaml", "interval_s": TICK_S, "warmup_s": 60.0, "history_dir": str(tmp_path / "history")},
    )


def live_decisions(spec, total: float) -> list[tuple[float, dict]]:
    """When the live Controller moved the job, and to what: its workers report every
    ``REPORT_S`` at the truth's throughput, it ticks every ``TICK_S`` once they run."""
    from dlrover.master.control import Controller

    m = FakeMaster(spec, total)
    p = spec.policy
    ctl = Controller(m, SimpleNamespace(files={}, ids_per_sample=lambda layout: 26.0), load_policy(p.name, p.config, p.knobs))
    config = ctl.initial_config()
    m.launcher.launch(config)
    ctl.scaler = FakeScaler(m.launcher)
    ctl.started(config)
    samples = 0.0
    while samples < total:
        c = m.launcher.config()
        thr = float(throughput(TRUTH, c.workers, c.ps, c.worker_cpu, c.ps_cpu, 512)[0])
        samples = min(total, samples + thr * REPORT_S)
        m.now += REPORT_S
        m.books.queue.samples_done = int(samples)
        for w in m.launcher.workers:
            m.books.metrics[w] = WorkerReport(
                samples=0, steps=0, samples_per_s=0.0, loss=0.0, step_time_s=c.workers * 512 / thr, wait_ps_s=0.0, pull_s=0.0, push_s=0.0,
                queue_depth=0, rss_mb=NEEDS_MB["worker"], cpu_percent=0.0, node_id="", step_median_s=0.0, pull_ahead=0, at_s=m.now,
            )
            ctl.on_report(w, m.books.metrics[w], m.now, int(samples))
        if m.now % TICK_S == 0:
            ctl.tick()
    ctl.finish("running", 0, 0.0)
    return [(e.at_s, e.new.to_dict()) for e in m.scale_events]


def simulated_decisions(spec, total: float) -> list[tuple[float, dict]]:
    """When the simulator moved the same job, and to what: one node with room, no
    noise, no start-up or switch costs, ticks and warm-up as live."""
    from dlrover.resource.configs import job_budget
    from dlrover.sim import ClusterSpec, SimSettings, simulate

    r = spec.resources
    budget = job_budget(spec, Config.from_resources(r))
    row = {
        "job_id": "t", "submit_s": 0.0, "signature": "m", "batch_size": spec.data.batch_size, "samples": total, "epochs": 1,
        "req_workers": r.workers, "req_ps": r.ps, "req_worker_cpu": r.worker_cpu, "req_ps_cpu": r.ps_cpu,
        "req_worker_memory_mb": r.worker_memory_mb, "req_ps_memory_mb": r.ps_memory_mb, **dict(zip(TRUTH_TERMS, TRUTH)),
        "budget_cpu": budget.cpu, "budget_memory_mb": budget.memory_mb,
        "worker_memory_need_mb": NEEDS_MB["worker"], "ps_memory_need_mb": NEEDS_MB["ps"],
    }  # fmt: skip
    cluster = ClusterSpec(nodes=1, node_cpu=1000, node_memory_mb=10**7, perf_sigma=0.0, p_slow=0.0, failure_rate=0.0)
    settings = SimSettings(
        control_interval_s=TICK_S, restart_s=0.0, rescale_s=0.0, rescale_pause_s=0.0, warmup_s=spec.policy.warmup_s,
        measure_noise=0.0, mem_start=1.0, max_ps=spec.train.vshards,
    )  # fmt: skip
    res = simulate(pd.DataFrame([row]), spec.policy.name, spec.policy.config, spec.policy.knobs, cluster=cluster, settings=settings)
    return [(e["t_s"], e["config"]) for e in res.events.to_dict("records") if e["kind"] == "scale"]


def test_dlrover_rm_takes_the_same_decisions_live_and_simulated(tmp_path):
    """The real dlrover_rm policy, fed the same job (reports at the truth's throughput, PS
    RSS over its watermark) by the live Controller and by the simulator, makes the same
    decisions: a memory correction first, then a model-driven rescale once the cooldown
    and the profile window allow it."""
    spec, total = job_spec(tmp_path), 3e8
    live = live_decisions(spec, total)
    assert [t for t, _ in live] == [TICK_S, 4 * TICK_S]  # the first tick; then the cooldown (900 s) after it
    (_, memory), (_, scaled) = live
    assert memory["ps_memory_mb"] > spec.resources.ps_memory_mb and scaled["workers"] > spec.resources.workers
    assert simulated_decisions(spec, total) == live
