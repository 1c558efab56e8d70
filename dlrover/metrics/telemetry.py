"""Live job metrics for Prometheus/Grafana, exported through ``ray.util.metrics``.

The master publishes its :meth:`~dlrover.master.master.JobMaster.progress` snapshot about once a
second. Ray's metrics agent on the master's node serves them with a ``ray_`` prefix
(counters also get ``_total``), next to Ray's own metrics, so the Prometheus that scrapes
Ray scrapes these too (``dashboards/prometheus.yml``). Ray adds no job label to custom
metrics: every metric carries a ``job_id`` tag, which ``dashboards/dlrover.json`` selects
with its ``job_id`` variable.

``METRICS`` is the one list of names: the dashboard test checks that every panel queries
only these and that every one of them is on a panel; ``dashboards/README.md`` lists them.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from dataclasses import dataclass
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class MetricDef:
    name: str  # as given to Ray; Prometheus sees prometheus_name()
    kind: str  # "gauge" | "counter"
    tags: tuple[str, ...]
    description: str

    @property
    def prometheus_name(self) -> str:
        return "ray_" + self.name + ("_total" if self.kind == "counter" else "")


_ACTOR = ("job_id", "actor", "role")
METRICS: tuple[MetricDef, ...] = (
    MetricDef("dlrover_throughput_samples_per_s", "gauge", ("job_id",), "Training throughput of the job: the sum of its workers' last report windows."),
    MetricDef("dlrover_progress_ratio", "gauge", ("job_id",), "Samples trained / samples the job will train (0..1)."),
    MetricDef("dlrover_step_time_s", "gauge", ("job_id", "actor"), "Mean step time of a worker over its last report window."),
    MetricDef("dlrover_actors", "gauge", ("job_id", "role"), "Running actors per role (worker, ps)."),
    MetricDef("dlrover_actor_cpus", "gauge", _ACTOR, "Logical CPUs allocated to an actor."),
    MetricDef("dlrover_actor_cpu_util", "gauge", _ACTOR, "CPU an actor used / CPUs allocated to it, last window."),
    MetricDef("dlrover_actor_memory_mb", "gauge", _ACTOR, "Resident memory (RSS) of an actor."),
    MetricDef("dlrover_actor_memory_limit_mb", "gauge", _ACTOR, "Memory limit of an actor (over it, the platform kills it)."),
    MetricDef("dlrover_pull_latency_s", "gauge", ("job_id", "actor"), "Per step, time a worker spent issuing and waiting for embedding pulls."),
    MetricDef("dlrover_push_latency_s", "gauge", ("job_id", "actor"), "Per step, time a worker spent issuing gradient pushes (asynchronous)."),
    MetricDef("dlrover_scale_events", "counter", ("job_id", "kind"), "Resource changes carried out (warm_start, scale_out, scale_in, resize, replace, rebalance, ...)."),
    MetricDef("dlrover_failures", "counter", ("job_id", "kind", "cause_class"), "Failures handled (worker_death, ps_death, master_death, node_loss, oom_kill, straggler, ...)."),
    MetricDef("dlrover_recovery_time_s", "gauge", ("job_id", "kind"), "Last failure of this kind: seconds from the fault to training again."),
    MetricDef("dlrover_ettr", "gauge", ("job_id",), "Effective training time ratio so far: productive training time / wall time."),
    MetricDef("dlrover_predicted_throughput_samples_per_s", "gauge", ("job_id",), "The performance model's prediction for the running configuration."),
    MetricDef("dlrover_measured_throughput_samples_per_s", "gauge", ("job_id",), "Throughput measured for the running configuration (after its warm-up)."),
    MetricDef("dlrover_checkpoint_age_s", "gauge", ("job_id", "tier"), "Seconds since the last checkpoint, per tier (memory, durable)."),
)
BY_NAME = {m.name: m for m in METRICS}


class Sink(Protocol):
    def set(self, value: float, tags: dict[str, str]) -> None: ...
    def inc(self, value: float, tags: dict[str, str]) -> None: ...


def ray_sink(m: MetricDef) -> Sink:
    """The Ray metric object for ``m`` (created in the process that records it)."""
    from ray.util import metrics

    cls = metrics.Gauge if m.kind == "gauge" else metrics.Counter
    return cls(m.name, description=m.description, tag_keys=m.tags)  # type: ignore[return-value]


def short_actor(name: str) -> str:
    """``<job>/worker-3`` -> ``worker-3`` (the job is its own tag)."""
    return name.rsplit("/", 1)[-1]


class Telemetry:
    """Turns job snapshots into metric values.

    Counters are kept as the job's running totals: after a master restart the new process
    counts the failures and scale events it restored again from zero, so a counter is the
    job's total in whichever master process is alive. Per-actor gauges of an actor that has
    gone are set to 0 once (Ray keeps exporting a gauge's last value).
    """

    def __init__(self, job_id: str, sink: Callable[[MetricDef], Sink] = ray_sink) -> None:
        self.job_id = job_id
        self._sink = sink
        self._metrics: dict[str, Sink] = {}
        self._counted: dict[str, Tally] = {"dlrover_scale_events": Tally(), "dlrover_failures": Tally()}
        self._actors: dict[str, str] = {}  # live actor -> role, as last published

    def _get(self, name: str) -> Sink:
        if name not in self._metrics:
            self._metrics[name] = self._sink(BY_NAME[name])
        return self._metrics[name]

    def _set(self, name: str, value: float | None, **tags: str) -> None:
        if value is None or not math.isfinite(float(value)):
            return
        self._get(name).set(float(value), {"job_id": self.job_id, **tags})

    def _count(self, name: str, now: Tally) -> None:
        """Increment a counter by what ``now`` has beyond what was counted before."""
        done = self._counted[name]
        for key, n in now.items():
            if n > done[key]:
                tags = dict(zip(BY_NAME[name].tags[1:], key))
                self._get(name).inc(float(n - done[key]), {"job_id": self.job_id, **tags})
                done[key] = n

    def publish(self, snap: dict[str, Any]) -> None:
        self._set("dlrover_throughput_samples_per_s", snap["samples_per_s"])
        self._set("dlrover_progress_ratio", snap["progress"])
        self._set("dlrover_ettr", snap.get("ettr"))
        self._set("dlrover_predicted_throughput_samples_per_s", snap.get("predicted"))
        self._set("dlrover_measured_throughput_samples_per_s", snap.get("measured"))
        for tier, age in (snap.get("checkpoint_age_s") or {}).items():
            self._set("dlrover_checkpoint_age_s", age, tier=tier)
        roles = Tally(a["role"] for a in snap["actors"])
        for role in ("worker", "ps"):
            self._set("dlrover_actors", roles[role], role=role)
        live = {}
        for a in snap["actors"]:
            actor, role = short_actor(a["name"]), a["role"]
            live[actor] = role
            self._set("dlrover_actor_cpus", a.get("cpus"), actor=actor, role=role)
            self._set("dlrover_actor_cpu_util", a.get("cpu_util"), actor=actor, role=role)
            self._set("dlrover_actor_memory_mb", a.get("rss_mb"), actor=actor, role=role)
            self._set("dlrover_actor_memory_limit_mb", a.get("memory_limit_mb"), actor=actor, role=role)
            if role == "worker":
                self._set("dlrover_step_time_s", a.get("step_time_s"), actor=actor)
                self._set("dlrover_pull_latency_s", a.get("pull_s"), actor=actor)
                self._set("dlrover_push_latency_s", a.get("push_s"), actor=actor)
        for actor, role in self._actors.items():
            if actor not in live:
                for name in ("dlrover_actor_cpus", "dlrover_actor_cpu_util", "dlrover_actor_memory_mb", "dlrover_actor_memory_limit_mb"):
                    self._set(name, 0.0, actor=actor, role=role)
                if role == "worker":
                    for name in ("dlrover_step_time_s", "dlrover_pull_latency_s", "dlrover_push_latency_s"):
                        self._set(name, 0.0, actor=actor)
        self._actors = live
        self._count("dlrover_scale_events", Tally((e.kind.value,) for e in snap["scale_events"]))
        self._count("dlrover_failures", Tally((f.kind.value, f.cause_class.value) for f in snap["failures"]))
        last: dict[str, float] = {}
        for f in snap["failures"]:  # Failure records
            if f.recovered_s is not None:
                last[f.kind.value] = float(f.recovered_s) - float(f.at_s)
        for kind, seconds in last.items():
            self._set("dlrover_recovery_time_s", seconds, kind=kind)
