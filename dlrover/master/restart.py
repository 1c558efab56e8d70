"""Stop-checkpoint-restart: the way a job is rescaled without live elasticity.

It is the baseline ``dlrover bench elastic`` measures live rescaling against (and what a
job restarted from its last checkpoint goes through): every worker stops at a shard
boundary, every PS writes its vshards (weights and optimizer state) to disk, all of them
go away, the new configuration is launched from scratch and restored from the files.
The dense PS and the master (with the shard queue) stay; a full restart would also
reload those, so this baseline errs on the fast side.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlrover.master.cluster import get_alive
from dlrover.ps.migration import export_blocks
from dlrover.ps.ps_stats import PsStats
from dlrover.resource.configs import Config
from dlrover.resource.plan import ResourcePlan

from dlrover.master.job import Job


@dataclass(frozen=True)
class RestartRescale:
    """The controller's decision to carry ``plan`` out by a restart (``policy.rescale:
    restart``), taken from ``old``: data, so the job loop enters the RestartRescaling
    state for it (a recorded transition) and the state, not the control tick, carries it out."""

    plan: ResourcePlan
    old: Config


def _to_torch(payload: dict) -> dict:
    return {"vshards": torch.from_numpy(payload["vshards"]), "tables": [[torch.from_numpy(a) for a in t] for t in payload["tables"]]}


def _to_numpy(payload: dict) -> dict:
    return {"vshards": payload["vshards"].numpy(), "tables": [[a.numpy() for a in t] for t in payload["tables"]]}


def select(payload: dict, vshards: np.ndarray, rows_per_vshard: list[int]) -> dict:
    """The part of an export payload that holds ``vshards`` (each a block of rows)."""
    held = [int(v) for v in payload["vshards"]]
    keep = np.asarray([v for v in vshards if int(v) in held], dtype=np.int64)
    pos = np.asarray([held.index(int(v)) for v in keep], dtype=np.int64)
    return {"vshards": keep, "tables": export_blocks(payload["tables"], pos, rows_per_vshard)}


@dataclass
class RestartResult:
    started: dict[Any, str]  # run ObjectRef -> new worker
    retired_ps_stats: list[PsStats]
    stop_s: float
    checkpoint_s: float
    launch_s: float
    restore_s: float
    pause_s: float  # no worker trains from the stop to the end of the restore
    bytes_moved: int
    vshards_moved: int

    def timings(self) -> dict:
        """The scale event's fields of this restart."""
        return {k: v for k, v in vars(self).items() if k not in ("started", "retired_ps_stats")}


def stop_checkpoint_restart(master: Job, config: Config) -> RestartResult:
    lz = master.launcher
    t0 = master.clock()
    # 1. Stop: no more shards for anyone; each worker finishes what it holds and exits.
    names = list(lz.workers)
    master.books.drain(names)
    get_alive(master.cluster, master.runs.refs(set(names)))  # a worker dying now: its shards were requeued when it died
    master.runs.drop(set(names))
    t_stopped = master.clock()
    # 2. Checkpoint every PS to disk.
    ckpt = Path(tempfile.mkdtemp(prefix=f"dlrover-restart-{master.job_id.replace('/', '_')}-"))
    files, nbytes = [], 0
    for k, h in lz.ps.items():
        payload = master.cluster.get(h.export_vshards.remote(lz.vmap.owned(k).tolist()))
        nbytes += sum(a.nbytes for t in payload["tables"] for a in t)
        path = ckpt / f"ps-{k}.pt"
        torch.save(_to_torch(payload), path)
        files.append(path)
    t_saved = master.clock()
    # 3. Everything goes away.
    retired = master.cluster.get([h.stats.remote() for h in lz.ps.values()])
    for n in names:
        lz.forget_worker(n)
    for k in list(lz.ps):
        lz.remove_ps(k)
    # 4. Relaunch the new configuration from scratch.
    new_ps = [lz.add_ps(config.ps_cpu, config.ps_memory_mb) for _ in range(config.ps)]
    workers = [lz.add_worker(config.worker_cpu, config.worker_memory_mb) for _ in range(config.workers)]
    lz.wait_started([lz.ps_name(k) for k in new_ps] + workers)
    t_launched = master.clock()
    # 5. Restore: each new PS gets the blocks of the vshards it now owns, read from disk.
    vmap = lz.vmap.reassigned(new_ps)
    payloads = [_to_numpy(torch.load(f, weights_only=True)) for f in files]
    rpv = vmap.rows_per_vshard()
    master.cluster.get([lz.ps[k].reconfigure.remote(vmap, [master.cluster.put(select(p, vmap.owned(k), rpv)) for p in payloads]) for k in new_ps])
    lz.switch_map(vmap, workers)
    for f in files:
        f.unlink()
    ckpt.rmdir()
    started = {lz.start(w): w for w in workers}
    done = master.clock()
    return RestartResult(
        started,
        retired,
        stop_s=round(t_stopped - t0, 3),
        checkpoint_s=round(t_saved - t_stopped, 3),
        launch_s=round(t_launched - t_saved, 3),
        restore_s=round(done - t_launched, 3),
        pause_s=round(done - t_stopped, 3),
        bytes_moved=int(nbytes),
        vshards_moved=int(lz.vmap.num_vshards),
    )
