"""One ray_data job in a Ray of its own (run as a script by tests/test_ray_data.py): a
capped object store whose spilling goes to a directory watched all along, the pipeline
of ``ray_data_pipeline`` named in the spec, worker-0 SIGKILLed once ``--kill-after`` rows
are trained, and the scripted policy's scale-out. Writes one JSON object to ``--out``
(Ray's logs share stdout): the summary's figures, the killed pid, and what reached the
disk (spilled or fallback-allocated)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import signal_when_training  # noqa: E402
from ray_data_pipeline import FEATURES, MODEL  # noqa: E402

READ_UNIT_BYTES = 8 << 20


def watch_disk(spill_dir: str, seen: dict, stop: threading.Event) -> None:
    """Record the most files ever in the spill directory and fallback bytes ever in use."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    gcs = ray.get_runtime_context().gcs_address  # this job's Ray (not whichever ran last on the machine)
    while not stop.is_set():
        seen["spill_files"] = max(seen["spill_files"], sum(len(f) for _, _, f in os.walk(spill_dir)))
        try:
            stats = get_memory_info_reply(get_state_from_address(gcs)).store_stats
            seen["fallback_bytes"] = max(seen["fallback_bytes"], int(stats.object_store_bytes_fallback))
            seen["spilled_bytes"] = max(seen["spilled_bytes"], int(stats.spilled_bytes_total))
        except Exception:  # noqa: BLE001 - the raylet busy: the next poll
            pass
        stop.wait(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--spill", required=True)
    ap.add_argument("--out", required=True, help="where the result's JSON goes")
    ap.add_argument("--store-mb", type=int, required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--kill-after", type=int, default=0, help="SIGKILL worker-0 once this many rows are trained (0: no kill)")
    ap.add_argument("--scale-out", action="store_true", help="3 workers and 3 PS at the first policy tick")
    a = ap.parse_args()
    os.environ["DATA_DIR"] = a.data
    # A Parquet read task of Ray Data decodes up to this many bytes before any of it can
    # be consumed (128 MiB by default): beside an 80 MiB store, one read unit must be small.
    os.environ["RAY_DATA_PARQUET_BIN_PACKING_BYTES"] = str(READ_UNIT_BYTES)
    import ray

    from dlrover.driver.runner import ray_runtime_env, run_job
    from dlrover.spec import spec_from_dict

    spilling = {"type": "filesystem", "params": {"directory_path": a.spill}}
    ray.init(address="local", num_cpus=12, object_store_memory=a.store_mb << 20, include_dashboard=False, _node_ip_address="127.0.0.1",
             namespace="dlrover", logging_level="ERROR", runtime_env=ray_runtime_env(), _system_config={"object_spilling_config": json.dumps(spilling)})  # fmt: skip
    steps = [{"at_s": 0.0, "workers": 3, "ps": 3}] if a.scale_out else []
    spec = spec_from_dict({
        "name": "raydata", "features": FEATURES, "model": MODEL,
        "data": {"source": "ray_data", "dataset": "ray_data_pipeline:click_log", "epochs": a.epochs, "batch_size": 1024, "shard_rows": 4096, "blocks_in_flight": 8},
        "resources": {"workers": 2, "ps": 2, "worker_memory_mb": 2048, "ps_memory_mb": 1024, "budget_cpu": 8},
        "train": {"log_every_s": 0.5},
        "policy": {"name": "scripted", "knobs": {"steps": steps}, "interval_s": 0.5, "warmup_s": 0.5} if steps else {"name": "static"},
    })  # fmt: skip
    seen = {"spill_files": 0, "fallback_bytes": 0, "spilled_bytes": 0}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_disk, args=(a.spill, seen, stop), daemon=True)
    watcher.start()
    killed: dict = {}
    job_id = f"raydata-{int(time.time())}"
    if a.kill_after:
        signal_when_training(job_id, "worker-0", signal.SIGKILL, killed, min_samples=a.kill_after)
    s, path = run_job(spec, runs_dir=a.runs, progress="none", job_id=job_id, dashboard=False)
    stop.set()
    watcher.join()
    events = [json.loads(line) for line in (path.parent / "events.jsonl").read_text().splitlines()]
    keys = ("status", "samples_expected", "samples_trained", "samples_lost", "samples_replayed", "ids_expected", "ps_ids_updated",
            "long_bags_truncated", "dense_updates", "failures", "scale_events", "final_config")  # fmt: skip
    result = {"summary": {k: s.get(k) for k in keys}, "killed_pid": killed.get("pid"), **seen, "epochs_streamed": [e for e in events if e["kind"] == "stream_epoch"]}
    with open(a.out, "w") as f:
        json.dump(result, f, default=str)
    ray.shutdown()


if __name__ == "__main__":
    main()
