"""Driver side of ``dlrover run``: data on first use, Ray, the JobMaster, progress, summary."""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import ray

from dlrover.data.follow import FollowPlan
from dlrover.data.plan import DataPlan
from dlrover.data.ray_source import StreamPlan, call_dataset_function, dataset_function
from dlrover.errors import DLRoverError, SpecError
from dlrover.driver.observers import Observer, progress_display
from dlrover.runlogs.records import JobSummary
from dlrover.paths import check_creatable_dir, is_url
from dlrover.driver.rayauth import use_token_auth
from dlrover.resource.plan import Policy
from dlrover.spec import JobSpec
from dlrover.tracking import trackers

POLL_S = 0.5  # progress refresh period


MASTER_RESTARTS = 3


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def ensure_data(spec: JobSpec) -> None:
    """Generate the spec's synthetic data when it is missing, incomplete or stale.

    ``synth.json`` is written last, so a generation that was interrupted (or one with
    another row count or seed) is regenerated instead of being trained on silently.
    """
    from dlrover.data.reader import data_files

    s = spec.data.synth
    if s is None:
        data_files(spec.data.paths, spec.layout())
        return
    meta = Path(s.out) / "synth.json"
    try:
        cfg = json.loads(meta.read_text()).get("config", {})
    except (OSError, ValueError):
        cfg = {}
    if (cfg.get("rows"), cfg.get("files"), cfg.get("seed"), cfg.get("fixed_bags", False)) != (s.rows, s.files, s.seed, s.bags == "fixed"):
        if spec.features is not None:
            from dlrover.data.synth_schema import SchemaSynthConfig, generate_for_schema, synth_format

            print(f"[dlrover] generating synthetic data for the job's features: {s.rows:,} rows in {s.files} files -> {s.out}", file=sys.stderr)
            generate_for_schema(s.out, spec.layout(), SchemaSynthConfig(s.rows, s.files, s.seed, s.bags == "fixed"), synth_format(spec))
        else:
            from dlrover.data.synth import SynthConfig, generate

            print(f"[dlrover] generating synthetic Criteo data: {s.rows:,} rows in {s.files} files -> {s.out}", file=sys.stderr)
            generate(s.out, SynthConfig(rows=s.rows, files=s.files, seed=s.seed), progress=True)
    data_files(spec.data.paths, spec.layout())


def required_cpus(spec: JobSpec) -> float:
    """Logical CPUs the job may hold at once: its budget, else its request; and a ray_data
    job's ``data.ray_data_cpu`` beside them, for Ray Data's tasks (the Dataset's limit)."""
    r, d = spec.resources, spec.data
    stream = d.ray_data_cpu if d.source == "ray_data" else 0.0
    return max(r.budget_cpu or 0.0, r.workers * r.worker_cpu + r.ps * r.ps_cpu + r.dense_cpu) + stream


def resolve_policy(spec: JobSpec) -> tuple[JobSpec, Policy]:
    """Build the policy here, on the driver (a bad knob is a one-line error before Ray
    starts; the master gets the built policy), and make its paths absolute."""
    from dlrover.resource.history import default_history_dir
    from dlrover.resource.policies import load_policy

    p = spec.policy
    built = load_policy(p.name, p.config, p.knobs)
    policy = p.model_copy(
        update={
            "config": os.path.abspath(p.config) if p.config else None,
            "history_dir": os.path.abspath(os.path.expanduser(p.history_dir or default_history_dir())),
        }
    )
    return spec.model_copy(update={"policy": policy}), built


def resolve_checkpoint_dir(spec: JobSpec) -> JobSpec:
    """Check a local ``checkpoint.dir`` here, on the driver, before anything is written
    (else the job would fail at its first checkpoint, or at its end), and make it absolute
    for the master actor. A URL is the store's to check."""
    d = spec.checkpoint.dir
    if not d or is_url(d):
        return spec
    check_creatable_dir(d, "checkpoint.dir")
    checkpoint = spec.checkpoint.model_copy(update={"dir": os.path.abspath(os.path.expanduser(d.removeprefix("file://")))})
    return spec.model_copy(update={"checkpoint": checkpoint})


def ray_runtime_env() -> dict:
    """The runtime env of a Ray this driver starts: quiet actors, and the dlrover
    environment switches passed on."""
    passed = {k: v for k, v in os.environ.items() if k in ("DLROVER_NO_SHM", "DLROVER_HISTORY_DIR")}
    return {"env_vars": {"PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR", "RAY_IGNORE_UNHANDLED_ERRORS": "1", **passed}}


def init_ray(
    spec: JobSpec, address: str | None, dashboard: bool = False, memory_mb: int | None = None, object_store_mb: int | None = None, populate_store: bool = False
) -> bool:
    """Connect to ``address`` or start an embedded local Ray on loopback.

    Returns True when this call started Ray (so the caller shuts it down). The embedded
    cluster advertises at least the CPUs the job asks for: logical CPUs are a scheduling
    budget, and oversubscribing 2 cores with 4 single-threaded actors is fine. So is
    ``memory_mb``, its logical memory (default: Ray's share of this machine's), and
    ``object_store_mb`` bounds its object store (default: Ray's, 30% of memory).
    ``populate_store``: the store's memory is allocated as Ray starts (Ray's
    ``preallocate_plasma_memory``) rather than page by page as objects first use it. On
    our VMs a page freed back to the host costs ~12 us to touch again: 3 s of kernel
    time per GB a PS exports or a checkpoint cuts into new pages of the store. For jobs
    whose checkpoints and vshard moves fill a store sized for them (6.5 GB: 1.8 s at start);
    without ``object_store_mb`` it is Ray's default size that is allocated. Both are
    ignored when joining a running cluster (its nodes' ``ray start`` set them).
    """
    if ray.is_initialized():
        return False
    # Inside a Ray Jobs entrypoint RAY_ADDRESS points at the cluster: join it.
    address = address or os.environ.get("RAY_ADDRESS")
    env = ray_runtime_env()
    if address:
        use_token_auth()
        try:
            ray.init(address=address, namespace="dlrover", logging_level="ERROR")
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise DLRoverError(f"--address {address}: cannot connect to Ray: {str(e).splitlines()[0]}") from None
        return False
    # Twice the job's CPUs: a rescale starts its new actors while the old ones still run.
    cpus = max(os.cpu_count() or 1, 2 * math.ceil(required_cpus(spec)))
    ray.init(
        address="local",  # always a new cluster, never a stale one from /tmp/ray
        num_cpus=cpus,
        _memory=memory_mb * 2**20 if memory_mb else None,
        object_store_memory=object_store_mb * 2**20 if object_store_mb else None,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        _node_ip_address="127.0.0.1",
        namespace="dlrover",
        runtime_env=env,
        logging_level="ERROR",
        log_to_driver=True,
        _system_config={"preallocate_plasma_memory": True} if populate_store else None,
    )
    return True


def run_job(
    spec: JobSpec,
    runs_dir: str = "runs",
    address: str | None = None,
    progress: str = "bar",
    dashboard: bool = False,
    job_id: str | None = None,
    stop_when: Callable[[dict], bool] | None = None,
    observers: Sequence[Observer] = (),
    dataset: Any = None,
) -> tuple[dict, Path]:
    """Train ``spec`` to the end; returns (``summary.json``'s object, the file's path):
    the JSON form of the master's ``JobSummary``, which ``JobSummary.from_json`` reads back.

    ``progress``: "bar" (``tqdm.auto`` on stderr), "lines" (a plain line every few seconds,
    for logs) or "none". ``stop_when(progress)``: stop the job early once it returns True
    (benchmarks; the summary then says ``stopped``). ``observers``: told of the job as
    the progress display is (:mod:`dlrover.driver.observers`). ``dataset``: a
    ``ray.data.Dataset`` to train from instead of the spec's data source (its ``paths``,
    ``synth`` and held-out rows); its columns follow the spec's features.
    """
    # Every check before the run directory is written: a bad input leaves nothing behind.
    check_creatable_dir(runs_dir, "--runs-dir")
    if dataset is not None and spec.data.source == "files":
        spec = spec.with_overrides(STREAM_OVERRIDES)
    spec, policy = resolve_policy(spec)
    spec = resolve_checkpoint_dir(spec)
    started = False
    try:
        if spec.data.source == "ray_data":
            make = None if dataset is not None else stream_function(spec)  # a bad name costs no Ray start
            started = init_ray(spec, address, dashboard)
            data: DataPlan | StreamPlan = StreamPlan.of(spec, dataset if make is None else call_dataset_function(spec.data.dataset, make))
        elif spec.data.follow is not None:
            data = FollowPlan.build(spec)  # the files come while it trains
        else:
            ensure_data(spec)
            data = DataPlan.build(spec)  # files that hold no training rows fail here; the master gets this plan
        job_id = job_id or new_job_id(spec.name)
        # A tracker that cannot start fails before a bar is drawn or the run directory written.
        watching = [*trackers(spec, job_id), *progress_display(progress, job_id), *observers]
        try:
            run_dir = Path(runs_dir) / job_id
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "spec.json").write_text(spec.model_dump_json(indent=2))
            started = init_ray(spec, address, dashboard) or started
            summary = _run_master(spec, data, policy, job_id, run_dir, stop_when, watching)
            with open(run_dir / "events.jsonl", "w") as f:
                for event in summary.events:
                    f.write(json.dumps(event.to_json(), default=float) + "\n")
            path = run_dir / "summary.json"
            doc = summary.to_json()
            path.write_text(json.dumps(doc, indent=2, default=float))
            for o in watching:
                o.finished(summary, run_dir)
        finally:
            for o in watching:
                o.close()
    finally:
        if started:
            ray.shutdown()
    return doc, path


# A dataset given to run_job replaces a files spec's data source.
STREAM_OVERRIDES = {"data.source": "ray_data", "data.paths": [], "data.synth": None, "data.columns": None, "data.format": "auto", "data.eval_fraction": 0.0}


def stream_function(spec: JobSpec) -> Callable[[], Any]:
    """The function ``data.dataset`` names; a ray_data spec without one needs a dataset given."""
    if spec.data.dataset is None:
        raise SpecError("data.source: ray_data needs data.dataset (module:function), or a dataset given to dlrover.run")
    return dataset_function(spec.data.dataset)


def _run_master(
    spec: JobSpec, data: DataPlan | StreamPlan, policy: Policy, job_id: str, run_dir: Path,
    stop_when: Callable[[dict], bool] | None, watching: list[Observer],
) -> JobSummary:  # fmt: skip
    """The master started on the Ray this process joined, its progress polled to the end: the summary."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dlrover.master.master import JobMaster

    # A master that dies is restarted by Ray (its calls retried) and resumes from its
    # persisted state and the newest durable checkpoint; a ray_data job's master owns its
    # blocks, which die with it: it is not restarted.
    restarts = 0 if isinstance(data, StreamPlan) else MASTER_RESTARTS
    master = (
        ray.remote(JobMaster)
        # On the driver's node (the head in a cluster), which a worker node's loss spares.
        .options(
            name=f"{job_id}/master",
            max_concurrency=64,
            num_cpus=0,
            max_restarts=restarts,
            max_task_retries=-1 if restarts else 0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True),
        )
        .remote(job_id, spec, data, policy, run_dir=str(run_dir.resolve()))
    )
    ref = master.run.remote()
    seen_events, restarts = 0, 0
    try:
        while not ray.wait([ref], timeout=POLL_S)[0]:
            try:
                p = ray.get(master.progress.remote(since=seen_events))
            except ray.exceptions.RayTaskError:
                continue  # a snapshot that failed (a race with the run thread): the next one
            if p["restarts"] != restarts:  # a restarted master has a new event log
                restarts, seen_events = p["restarts"], 0
                p = ray.get(master.progress.remote(since=0))
            seen_events = p["events_next"]
            if stop_when is not None and stop_when(p):
                master.stop.remote()
                stop_when = None
            for o in watching:
                for e in p["events"]:
                    o.event(e)
                o.progress(p)
        return _get_summary(ref)
    except KeyboardInterrupt:
        master.stop.remote()
        raise
    finally:
        ray.kill(master, no_restart=True)


def _get_summary(ref) -> JobSummary:
    """The master's summary; a user error inside the job is re-raised as one line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if hasattr(e, "cause") else None
        if isinstance(cause, DLRoverError):
            raise type(cause)(str(cause)) from None
        raise
