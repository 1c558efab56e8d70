"""Shared fixtures: one embedded local Ray per test session, small synthetic data sets."""

from __future__ import annotations

import os
import tempfile
import threading
import time
import warnings

import pytest

warnings.filterwarnings("ignore")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
os.environ.setdefault("PYTHONWARNINGS", "ignore")
# Finished jobs are recorded for warm starts; tests keep theirs out of ~/.dlrover, and each
# pytest-xdist process (which inherits the first process's environment) out of the other's.
os.environ["DLROVER_HISTORY_DIR"] = tempfile.mkdtemp(prefix=f"dlrover-test-history-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")


# What a test that starts Ray says in its source (or in its fixtures' names): the local
# Ray fixture, a cluster of its own, a job run in this or another process, a local head.
RAY_SIGNS = ("ray_local", "ray.init", "cluster_utils", "run_job", "LocalHead", "observed_job", "ray_head", "submit")
# Files whose Ray-starting tests get there through parametrised fixtures or the CLI in
# another process, where the source of the test itself does not show it: all marked.
STARTS_RAY = frozenset({
    "test_cli.py", "test_observability.py", "test_drain.py", "test_export.py", "test_own_data.py",
    "test_object_store.py", "test_pal_live.py", "test_faults.py",
})  # fmt: skip


def starts_ray(item: pytest.Item) -> bool:
    import inspect

    if item.path.name in STARTS_RAY or any(sign in name for name in getattr(item, "fixturenames", ()) for sign in RAY_SIGNS):
        return True
    try:
        source = inspect.getsource(item.function)  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError):
        return False
    return any(sign in source for sign in RAY_SIGNS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``ray`` every test that starts Ray; ``pytest -m "not ray"`` runs the rest."""
    for item in items:
        if starts_ray(item):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_local():
    """An embedded Ray on loopback with enough logical CPUs for 2 workers + 2 PS."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=12,  # logical: room for rescales (new actors start before old ones go)
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            namespace="dlrover",
            logging_level="ERROR",
            runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory):
    """40k rows of learnable synthetic Criteo data in 2 TSV files."""
    from dlrover.data.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth")
    generate(str(d), SynthConfig(rows=40_000, files=2, seed=3), progress=False)
    return d


@pytest.fixture(scope="session")
def synth_dir_large(tmp_path_factory):
    """120k rows: enough for async 2x2 training to converge near single-process TorchRec."""
    from dlrover.data.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth_large")
    generate(str(d), SynthConfig(rows=120_000, files=2, seed=4), progress=False)
    return d


@pytest.fixture(scope="session")
def synth_dir_auc(tmp_path_factory):
    """360k rows, trained once (``auc_spec``): AUC comparable between runs within 0.001."""
    from dlrover.data.synth import SynthConfig, generate

    d = tmp_path_factory.mktemp("synth_auc")
    generate(str(d), SynthConfig(rows=360_000, files=2, seed=4), progress=False)
    return d


def events_of(summary_path) -> list[dict]:
    """The rows of a run's ``events.jsonl``, given the path of its ``summary.json``."""
    from dlrover.runlogs.event_file import read_events

    return [e.to_json() for _, e in read_events(summary_path.parent / "events.jsonl")]


def small_spec(data_dir, **over):
    """A fast job spec over ``data_dir`` (small MLPs and tables)."""
    from dlrover.spec import spec_from_dict

    doc = {
        "name": "t",
        "seed": 0,
        "model": {"embedding_dim": 8, "num_embeddings": 5000, "dense_arch": [32, 8], "over_arch": [64, 32, 1]},
        "data": {"paths": [f"{data_dir}/*.tsv"], "epochs": 1, "batch_size": 1024, "eval_fraction": 0.1, "shard_rows": 4096},
        "resources": {"workers": 2, "ps": 2, "worker_cpu": 1, "ps_cpu": 1, "worker_memory_mb": 2048, "ps_memory_mb": 1024},
    }
    for key, value in over.items():
        node = doc
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return spec_from_dict(doc)


def sleepy(factor: float = 3.0, workers: int = 2) -> list[dict]:
    """Chaos that has the first ``workers`` workers sleep ``factor - 1`` times each step's
    time after it (``slow``): a job whose run must outlast a rescale or a recovery lasts as
    long as ``factor`` times its epochs, at their CPU; what it learns is unchanged."""
    return [{"at_s": 0, "action": "slow", "target": f"worker:{i}", "factor": factor} for i in range(workers)]


def fault_spec(synth_dir, tmp_path, chaos, **over):
    """A job that checkpoints often (in memory every 2 s, to disk every 5 s) and reports
    twice a second: faults are recovered from a recent cut."""
    fields = {
        "data__epochs": 3,
        "train__log_every_s": 0.5,
        "checkpoint__memory_interval_s": 2.0,
        "checkpoint__interval_s": 5.0,
        "checkpoint__min_interval_s": 5.0,
        "checkpoint__dir": str(tmp_path / "ckpt"),
    }
    return small_spec(synth_dir, chaos=chaos, **{**fields, **over})


def auc_spec(synth_dir, tmp_path, chaos, **over):
    """``fault_spec`` for one epoch over ``synth_dir_auc``: the jobs whose AUC is compared
    with the same job without faults. A few epochs over less data overfit, and there the
    final AUC depends on the order async updates happened to land in: fault-free runs
    of 3 epochs over 120k rows spread 0.7309-0.7366 and runs with a worker kill
    0.7264-0.7322, while 1 epoch over 360k rows (the same samples trained) gave
    0.7575-0.7578 and 0.7579-0.7583."""
    return fault_spec(synth_dir, tmp_path, chaos, data__epochs=1, **over)


def once_per_run(tmp_path_factory, name: str, make):
    """``make()``'s JSON value, made once per test run: pytest-xdist workers share it (the
    first to ask makes it, under a lock, the others read it; the workers' base temp
    directories have one parent per run)."""
    import fcntl
    import json

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    done = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(json.dumps(make(), default=float))
    return json.loads(done.read_text())


@pytest.fixture(scope="session")
def fault_free(ray_local, synth_dir_auc, tmp_path_factory):
    """The summary of ``auc_spec``'s job without faults: what a recovered job compares to.
    One job per test run (its data is generated alike on every pytest-xdist worker)."""
    from dlrover.driver.runner import run_job

    def make() -> dict:
        tmp = tmp_path_factory.mktemp("fault_free")
        s, _ = run_job(auc_spec(synth_dir_auc, tmp, []), runs_dir=str(tmp / "runs"), progress="none")
        assert s["status"] == "succeeded" and s["failures"] == []
        return s

    return once_per_run(tmp_path_factory, "fault_free", make)


def gathered_table(ray, ps, table: int, like):
    """Table ``table`` as the PS actors ``ps`` hold it between them (an array like ``like``)."""
    import numpy as np

    got = np.zeros_like(like)
    for h in ps:
        rows, vals = ray.get(h.table_rows.remote(table))
        got[rows] = vals
    return got


def batches_expected(spec) -> int:
    """Batches a job trains: each shard's rows in ``batch_size`` chunks (data without bad
    lines), counted from the same shard queue the master builds."""
    from dlrover.data.plan import DataPlan

    queue = DataPlan.build(spec).shard_queue(spec)
    bs = spec.data.batch_size
    return sum(-(-queue.shard(i).rows // bs) for i in range(queue.total_shards))


def check_exactly_once(s: dict, spec) -> None:
    """Every batch updated the model exactly once: each (sample, table) bag on one PS, and
    one dense update per batch (the job had no rollback)."""
    assert s["samples_replayed"] == 0
    assert s["ps_bags_updated"] == 26 * s["samples_expected"], (s["ps_bags_updated"], s["samples_expected"])
    assert s["dense_updates"] == batches_expected(spec), (s["dense_updates"], batches_expected(spec))


def signal_when_training(job_id: str, actor: str, sig: int, out: dict, min_samples: int = 20_000, ready=lambda: True) -> threading.Thread:
    """Background thread: once the job has trained ``min_samples`` and ``ready()`` holds,
    send ``sig`` to the process of ``<job_id>/<actor>`` (its pid from the actor's own
    liveness probe)."""
    import ray

    def pid_of(handle) -> int:
        return int(ray.get(handle.ping.remote()).pid)

    def go() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                master = ray.get_actor(f"{job_id}/master", namespace="dlrover")
                if ray.get(master.progress.remote(), timeout=10)["samples_done"] < min_samples or not ready():
                    continue
                pid = pid_of(ray.get_actor(f"{job_id}/{actor}", namespace="dlrover"))
            except (ValueError, ray.exceptions.RayError):
                continue  # not started yet
            os.kill(pid, sig)
            out["pid"] = pid
            return

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t
