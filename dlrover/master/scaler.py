"""ResourcePlan -> ScalePlan -> Scaler: turning a policy's decision into actors on Ray.

``scale_plan`` is pure: it diffs the running actors against the plan's target and says
which actors to launch, drain or retire, and whether vshards must move. ``Scaler``
executes it while training goes on:

1. launch the new PS (owning nothing yet) and workers (not started); the control loop
   goes on until they run (``begin`` / ``ready``);
2. if the PS set changes or a rebalance is asked, move vshards in two rounds
   (``dlrover.ps.migration``): while training goes on, the PS start tracking updated
   rows and the moving blocks (weights and optimizer state) are copied into the new
   owners' new tables; then every worker is paused at a step boundary (all of its
   pushes applied), only the rows updated since are copied, every PS switches to the
   new map at once and the workers resume with the new routing; retired PS go away
   only after that;
3. start the new workers; workers to remove are drained (they finish their leased shards
   and get no more).

Ray fixes an actor's CPUs and memory at creation, so a resize is a replacement: the plan
launches actors of the new size and drains or retires the old ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from dlrover.master.launcher import Launcher
from dlrover.resource.plan import ResourcePlan

PAUSE_TIMEOUT_S = 120.0
PREPARE_POLL_S = 0.05
LAUNCH_TIMEOUT_S = 120.0  # new actors not running by then: the plan is given up (cluster full?)


@dataclass
class ScalePlan:
    """What to do to the running actors (names are actor names, PS by id)."""

    add_workers: list[tuple[float, int]] = field(default_factory=list)  # (CPUs, memory MB) each
    drain_workers: list[str] = field(default_factory=list)
    add_ps: list[tuple[float, int]] = field(default_factory=list)
    retire_ps: list[int] = field(default_factory=list)
    rebalance: bool = False

    def empty(self) -> bool:
        return not (self.add_workers or self.drain_workers or self.add_ps or self.retire_ps or self.rebalance)

    def ops(self) -> list[str]:
        out = []
        for what, n in (("add_worker", len(self.add_workers)), ("drain_worker", len(self.drain_workers)), ("add_ps", len(self.add_ps)), ("retire_ps", len(self.retire_ps))):
            if n:
                out.append(f"{what} x{n}")
        if self.rebalance:
            out.append("rebalance")
        return out


def _keep(actors: dict[str, tuple[float, int]], n: int, size: tuple[float, int], replace: set[str]) -> list[str]:
    """Up to ``n`` running actors already of ``size`` (and not to be replaced), oldest first."""
    return [a for a, s in actors.items() if s == size and a not in replace][:n]


def scale_plan(
    plan: ResourcePlan,
    workers: dict[str, tuple[float, int]],
    ps: dict[int, tuple[float, int]],
    ps_name: Callable[[int], str],
) -> ScalePlan:
    """Diff the running actors (name -> (CPUs, memory MB)) against ``plan.config``."""
    c = plan.config
    replace = set(plan.replace)
    keep_w = _keep(workers, c.workers, (c.worker_cpu, c.worker_memory_mb), replace)
    by_name = {ps_name(k): s for k, s in ps.items()}
    keep_p = _keep(by_name, c.ps, (c.ps_cpu, c.ps_memory_mb), replace)
    return ScalePlan(
        add_workers=[(c.worker_cpu, c.worker_memory_mb)] * (c.workers - len(keep_w)),
        drain_workers=[w for w in workers if w not in keep_w],
        add_ps=[(c.ps_cpu, c.ps_memory_mb)] * (c.ps - len(keep_p)),
        retire_ps=[k for k in ps if ps_name(k) not in keep_p],
        rebalance=plan.rebalance_ps,
    )


class MigrationAborted(RuntimeError):
    """A vshard move given up before any PS switched: the job goes on as it was."""


@dataclass
class ScaleResult:
    new_workers: list[str]
    drained: list[str]
    retired_ps_stats: list[dict]
    launch_s: float = 0.0  # creating actors (training goes on meanwhile)
    pause_s: float = 0.0  # workers parked while vshards moved
    bytes_moved: int = 0  # weights + optimizer state copied to new owners (both rounds)
    bytes_in_pause: int = 0  # of which while workers were parked
    copy_s: float = 0.0  # the whole migration, pre-copy included
    vshards_moved: int = 0
    ps_switch_s: dict = field(default_factory=dict)  # slowest PS: receive / allocate / copy seconds


@dataclass
class ScaleOp:
    """A ScalePlan under way: its new actors are starting (training goes on)."""

    plan: ScalePlan
    new_ps: list[int]
    new_workers: list[str]
    probes: list[Any]
    started: float
    deadline: float
    spares_used: int = 0  # new actors taken from the pre-started spares


class Scaler:
    """Executes ScalePlans with a Launcher, in two steps so the control loop never blocks
    on actors that take long to start (or never start, on a full cluster): ``begin``
    creates the new actors; once ``ready``, ``finish`` moves vshards and switches routing.
    ``abort`` gives the new actors back."""

    def __init__(self, launcher: Launcher, running: Callable[[], list[str]], launch_timeout_s: float = LAUNCH_TIMEOUT_S) -> None:
        self.launcher = launcher
        self.running = running  # names of workers whose ``run`` is going on
        self.launch_timeout_s = launch_timeout_s

    def begin(self, sp: ScalePlan) -> ScaleOp:
        lz = self.launcher
        # A pre-started spare of the right size is taken first: it answers at once.
        spares = len(lz.spare_ps) + len(lz.spare_workers)
        new_ps = [_first(lz.take_spare_ps(cpu, mem), lambda: lz.add_ps(cpu, mem)) for cpu, mem in sp.add_ps]
        new_workers = [_first(lz.take_spare_worker(cpu, mem), lambda: lz.add_worker(cpu, mem)) for cpu, mem in sp.add_workers]
        probes = [lz.ps[k].stats.remote() for k in new_ps] + [lz.workers[w].ping.remote() for w in new_workers]
        now = time.monotonic()
        used = spares - len(lz.spare_ps) - len(lz.spare_workers)
        return ScaleOp(sp, new_ps, new_workers, probes, now, now + self.launch_timeout_s, used)

    def ready(self, op: ScaleOp) -> bool:
        """True once every new actor answers; raises RayActorError if one failed to start."""
        done, _ = ray.wait(op.probes, num_returns=len(op.probes), timeout=0)
        if len(done) == len(op.probes):
            ray.get(op.probes)
            return True
        return False

    def abort(self, op: ScaleOp, workers: bool = True) -> None:
        """Give back the op's new PS, and its new workers unless they already train."""
        for k in op.new_ps:
            self.launcher.remove_ps(k)
        for w in op.new_workers if workers else []:
            self.launcher.forget_worker(w)

    def start_new_workers(self, op: ScaleOp) -> dict[Any, str]:
        """Start the op's new workers on the current routing (``{run ref: name}``): they
        train while vshards move, and the move re-routes them with everyone else."""
        lz = self.launcher
        get_alive([lz.workers[w].set_routing.remote(dict(lz.ps), lz.vmap) for w in op.new_workers])
        return {lz.start(w): w for w in op.new_workers}

    def finish(self, op: ScaleOp, ps_load: dict[int, float] | None = None) -> ScaleResult:
        lz, sp = self.launcher, op.plan
        result = ScaleResult(op.new_workers, list(sp.drain_workers), [], launch_s=time.monotonic() - op.started)
        keep_ps = [k for k in lz.ps if k not in sp.retire_ps]
        new_vmap = lz.vmap.reassigned(keep_ps, ps_load if sp.rebalance else None) if (op.new_ps or sp.retire_ps or sp.rebalance) else None
        if new_vmap is not None and lz.vmap.moves(new_vmap):
            self._migrate(new_vmap, sp.retire_ps, result)
        for k in sp.retire_ps:
            lz.remove_ps(k)
        return result

    def _migrate(self, new_vmap: Any, retire: list[int], result: ScaleResult) -> None:
        """Move vshards to their new owners: pre-copy while training goes on, then the rows
        updated meanwhile with every worker parked (no update in flight)."""
        lz = self.launcher
        moves = lz.vmap.moves(new_vmap)
        keep = [k for k in lz.ps if k not in retire]
        sources = sorted({src for _, src, _ in moves})
        outgoing = {src: [v for v, s, _ in moves if s == src] for src in sources}

        def to(k: int, refs: dict[int, Any]) -> list[Any]:
            return [refs[s] for s in sources if any(s == src and d == k for _, src, d in moves)]

        try:
            # Round 1: training goes on.
            t_copy = time.monotonic()
            ray.get([h.track.remote() for h in lz.ps.values()])
            full = {src: lz.ps[src].export_vshards.remote(outgoing[src]) for src in sources}
            ray.get([lz.ps[k].prepare.remote(new_vmap, to(k, full)) for k in keep])
            deadline = time.monotonic() + PAUSE_TIMEOUT_S
            while True:
                states = ray.get([lz.ps[k].prepared.remote() for k in keep])
                errors = [s for s in states if isinstance(s, str)]
                if errors:
                    raise MigrationAborted(f"preparing the new vshard map failed: {errors[0]}")
                if all(states):
                    break
                if time.monotonic() > deadline:
                    raise MigrationAborted(f"PS did not prepare the new vshard map within {PAUSE_TIMEOUT_S:.0f}s")
                time.sleep(PREPARE_POLL_S)
            # Round 2: workers parked, only rows pushed since round 1 began move.
            t_pause = time.monotonic()
            running = [w for w in self.running() if w in lz.workers]
            parked = get_alive([lz.workers[w].pause.remote(PAUSE_TIMEOUT_S) for w in running])
            if any(p is False for p in parked):
                stuck = [w for w, ok in zip(running, parked) if ok is False]
                raise MigrationAborted(f"workers did not pause within {PAUSE_TIMEOUT_S:.0f}s: {stuck}")
        except (MigrationAborted, ray.exceptions.RayError) as e:
            # Nothing switched yet: drop the prepared tables, everyone goes on as before.
            get_alive([h.cancel_migration.remote() for h in lz.ps.values()])
            get_alive([h.set_routing.remote(dict(lz.ps), lz.vmap) for h in lz.workers.values()])
            raise MigrationAborted(str(e).strip().splitlines()[0]) from None
        delta = {src: lz.ps[src].export_vshards.remote(outgoing[src], dirty_only=True) for src in sources}
        replies = ray.get([lz.ps[k].reconfigure.remote(new_vmap, to(k, delta)) for k in keep])
        result.retired_ps_stats = ray.get([lz.ps[k].stats.remote() for k in retire])
        lz.vmap = new_vmap
        ps = {k: lz.ps[k] for k in keep}
        get_alive([h.set_routing.remote(ps, new_vmap) for h in lz.workers.values()])
        done = time.monotonic()
        result.pause_s = done - t_pause
        result.copy_s = done - t_copy
        result.bytes_moved = int(sum(r["bytes_precopied"] + r["bytes_in"] for r in replies))
        result.bytes_in_pause = int(sum(r["bytes_in"] for r in replies))
        result.vshards_moved = len(moves)
        slowest = max(replies, key=lambda r: r["recv_s"] + r["copy_s"], default={})
        result.ps_switch_s = {k: round(v, 4) for k, v in slowest.items() if k.endswith("_s")}


def _first(value: Any, make: Callable[[], Any]) -> Any:
    return value if value is not None else make()


def get_alive(refs: list[Any], timeout_s: float | None = None) -> list[Any]:
    """Results of calls on workers; ``None`` for a worker that died (its death reaches the
    master as an event on its ``run`` and is handled there) or, with ``timeout_s``, did
    not answer in time."""
    out = []
    for r in refs:
        try:
            out.append(ray.get(r, timeout=timeout_s))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
            out.append(None)
    return out
