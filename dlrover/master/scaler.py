"""ResourcePlan -> ScalePlan -> Scaler: turning a policy's decision into actors on Ray.

``scale_plan`` is pure: it diffs the running actors against the plan's target and says
which actors to launch, drain or retire, and whether vshards must move. ``Scaler``
executes it while training goes on:

1. launch the new PS (owning nothing yet) and workers (not started); the control loop
   goes on until they run (``begin`` / ``ready``); then start the new workers;
2. if the PS set changes or a rebalance is asked, move vshards in two rounds
   (``dlrover.ps.migration``): while training goes on, the PS start tracking updated
   rows and the new owners ask the old ones for the moving blocks (weights and optimizer
   state), a few vshards per call, and copy them into their tables (``start_migration``,
   checked on later ticks by ``precopied``);
   then every worker is paused at a step boundary (all of its pushes applied), only the
   rows updated since are copied, every PS stages the new map, and only once all have
   staged do they switch to it and the workers resume with the new routing
   (``finish``): a failure before that leaves every PS on the old map. Retired PS go
   away only after the switch; workers to remove are drained (they finish their leased
   shards and get no more).

Ray fixes an actor's CPUs and memory at creation, so a resize is a replacement: the plan
launches actors of the new size and drains or retires the old ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from dlrover.master.cluster import ActorDied, RayError, TaskFailed, get_alive
from dlrover.master.launcher import Launcher
from dlrover.ps.ps_stats import PsStats
from dlrover.resource.plan import ResourcePlan

PAUSE_TIMEOUT_S = 120.0
LAUNCH_TIMEOUT_S = 120.0  # new actors not running by then: the plan is given up (cluster full?)
# While vshards are pre-copied the loop asks the PS this often whether they are done (a
# PS call; the switch waited for the next 1 s tick before, 1.1-1.5 s of a 10 s move).
PRECOPY_PROBE_S = 0.1


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
    retired_ps_stats: list[PsStats]
    launch_s: float = 0.0  # creating actors (training goes on meanwhile)
    pause_s: float = 0.0  # workers parked while vshards moved
    bytes_moved: int = 0  # weights + optimizer state copied to new owners (both rounds)
    bytes_in_pause: int = 0  # of which while workers were parked
    copy_s: float = 0.0  # the whole migration, pre-copy included
    vshards_moved: int = 0
    ps_switch_s: dict = field(default_factory=dict)  # slowest PS: receive / allocate / copy seconds

    def timings(self) -> dict:
        """The scale event's fields of this switch."""
        rate = self.bytes_moved / self.copy_s if self.copy_s > 0 and self.bytes_moved else None
        return dict(
            launch_s=round(self.launch_s, 3), pause_s=round(self.pause_s, 3), vshards_moved=self.vshards_moved, bytes_moved=self.bytes_moved,
            ps_switch_s=self.ps_switch_s, bytes_in_pause=self.bytes_in_pause, copy_s=round(self.copy_s, 3), migration_bytes_per_s=rate,
        )


class ScalePhase(str, Enum):
    LAUNCHING = "launching"  # new actors starting; training goes on
    PRECOPYING = "precopying"  # round 1: moving vshards copied while training goes on
    DONE = "done"


@dataclass
class Migration:
    """The vshard move of a ScaleOp: the new map and who sends what to whom."""

    vmap: Any
    moves: list[tuple[int, int, int]]  # (vshard, from PS, to PS)
    keep: list[int]  # PS that stay (they switch to the new map)
    began_s: float
    deadline_s: float
    probes: list[Any] = field(default_factory=list)  # ``prepared`` calls in flight

    @property
    def outgoing(self) -> dict[int, list[int]]:
        """Source PS -> the vshards it sends."""
        return {src: [v for v, s, _ in self.moves if s == src] for src in sorted({s for _, s, _ in self.moves})}

    def senders(self, k: int) -> dict[int, list[int]]:
        """The vshards PS ``k`` receives, by the PS that sends them."""
        return {src: vs for src in sorted(self.outgoing) if (vs := [v for v, s, d in self.moves if s == src and d == k])}


@dataclass
class ScaleOp:
    """A ScalePlan under way, one phase per control tick: its new actors start, then
    vshards are pre-copied, then the switch; training goes on until the switch."""

    plan: ScalePlan
    new_ps: list[int]
    new_workers: list[str]
    probes: list[Any]
    started: float
    deadline: float
    spares_used: int = 0  # new actors taken from the pre-started spares
    phase: ScalePhase = ScalePhase.LAUNCHING
    migration: Migration | None = None
    launch_s: float = 0.0


class Scaler:
    """Executes ScalePlans with a Launcher, a step per control tick, so the loop never
    blocks on actors that take long to start (or never start, on a full cluster) nor on a
    pre-copy: ``begin`` creates the new actors; once ``ready``, ``start_migration`` begins
    round 1; once ``precopied``, ``finish`` parks the workers and switches routing.
    ``abort`` gives the new actors back. Times come from the master's clock."""

    def __init__(
        self, launcher: Launcher, running: Callable[[], list[str]], clock: Callable[[], float], soon: Callable[[float], None], launch_timeout_s: float = LAUNCH_TIMEOUT_S
    ) -> None:
        self.launcher = launcher
        self.cluster = launcher.cluster
        self.running = running  # names of workers whose ``run`` is going on
        self.clock = clock
        self.soon = soon  # the control loop's next wait at most this long (``RunGroup.soon``)
        self.launch_timeout_s = launch_timeout_s

    def begin(self, sp: ScalePlan) -> ScaleOp:
        lz = self.launcher
        # A pre-started spare of the right size is taken first: it answers at once.
        spares = len(lz.spare_ps) + len(lz.spare_workers)
        # A new PS allocates the slots it is about to fill while it starts (a spare, started
        # earlier, allocates during the pre-copy).
        reserve = -(-lz.vmap.num_vshards // max(1, len(lz.ps) - len(sp.retire_ps) + len(sp.add_ps)))
        new_ps = [_first(lz.take_spare_ps(cpu, mem), lambda: lz.add_ps(cpu, mem, reserve)) for cpu, mem in sp.add_ps]
        new_workers = [_first(lz.take_spare_worker(cpu, mem), lambda: lz.add_worker(cpu, mem)) for cpu, mem in sp.add_workers]
        probes = [lz.ps[k].stats.remote() for k in new_ps] + [lz.workers[w].ping.remote() for w in new_workers]
        now = self.clock()
        used = spares - len(lz.spare_ps) - len(lz.spare_workers)
        return ScaleOp(sp, new_ps, new_workers, probes, now, now + self.launch_timeout_s, used)

    def ready(self, op: ScaleOp) -> bool:
        """True once every new actor answers; raises ActorDied if one failed to start."""
        done, _ = self.cluster.wait(op.probes, num_returns=len(op.probes), timeout=0)
        if len(done) == len(op.probes):
            self.cluster.get(op.probes)
            return True
        return False

    def late(self, op: ScaleOp) -> bool:
        """The new actors are not running within the launch timeout."""
        return self.clock() > op.deadline

    def abort(self, op: ScaleOp, workers: bool = True) -> None:
        """Give back the op's new PS, and its new workers unless they already train; a
        pre-copy under way is dropped."""
        if op.migration is not None:
            get_alive(self.cluster, [h.cancel_migration.remote() for h in self.launcher.ps.values()])
        for k in op.new_ps:
            self.launcher.remove_ps(k)
        for w in op.new_workers if workers else []:
            self.launcher.forget_worker(w)

    def start_new_workers(self, op: ScaleOp) -> dict[Any, str]:
        """Start the op's new workers on the current routing (``{run ref: name}``): they
        train while vshards move, and the move re-routes them with everyone else."""
        lz = self.launcher
        lz.switch_map(lz.vmap, op.new_workers, alive_only=True)
        return {lz.start(w): w for w in op.new_workers}

    def start_migration(self, op: ScaleOp, ps_load: dict[int, float] | None = None) -> None:
        """Round 1 (training goes on): the PS track updated rows, the moving blocks are
        copied into their new owners' new tables. No vshard to move: straight to done."""
        lz, sp = self.launcher, op.plan
        op.launch_s = self.clock() - op.started
        keep = [k for k in lz.ps if k not in sp.retire_ps]
        new_vmap = lz.vmap.reassigned(keep, ps_load if sp.rebalance else None) if (op.new_ps or sp.retire_ps or sp.rebalance) else None
        moves = lz.vmap.moves(new_vmap) if new_vmap is not None else []
        if not moves:
            op.phase = ScalePhase.DONE
            return
        now = self.clock()
        mig = Migration(new_vmap, moves, keep, now, now + PAUSE_TIMEOUT_S)
        op.migration, op.phase = mig, ScalePhase.PRECOPYING
        try:
            self.cluster.get([h.track.remote() for h in lz.ps.values()])
            self.cluster.get([lz.ps[k].prepare.remote(new_vmap, [(lz.ps[s], vs) for s, vs in mig.senders(k).items()]) for k in keep])
        except RayError as e:
            raise MigrationAborted(f"starting the pre-copy failed: {str(e).strip().splitlines()[0]}") from None

    def precopied(self, op: ScaleOp) -> bool:
        """Whether every PS has its new tables ready (never blocks: asks, and looks at
        the answers on a later tick). MigrationAborted on an error or past the deadline."""
        mig, lz = op.migration, self.launcher
        if mig.probes:
            done, _ = self.cluster.wait(mig.probes, num_returns=len(mig.probes), timeout=0)
            if len(done) == len(mig.probes):
                try:
                    states = self.cluster.get(mig.probes)
                except RayError as e:
                    raise MigrationAborted(f"a PS failed during the pre-copy: {str(e).strip().splitlines()[0]}") from None
                mig.probes = []
                errors = [x for x in states if isinstance(x, str)]
                if errors:
                    raise MigrationAborted(f"preparing the new vshard map failed: {errors[0]}")
                if all(states):
                    return True
        if self.clock() > mig.deadline_s:
            raise MigrationAborted(f"PS did not prepare the new vshard map within {PAUSE_TIMEOUT_S:.0f}s")
        if not mig.probes:
            mig.probes = [lz.ps[k].prepared.remote() for k in mig.keep]
        self.soon(PRECOPY_PROBE_S)
        return False

    def finish(self, op: ScaleOp) -> ScaleResult:
        """Round 2 (when ``precopied``, or at once without a move): the switch."""
        lz, sp = self.launcher, op.plan
        result = ScaleResult(op.new_workers, list(sp.drain_workers), [], launch_s=op.launch_s)
        if op.migration is not None:
            self._switch(op.migration, sp.retire_ps, result)
        for k in sp.retire_ps:
            lz.remove_ps(k)
        op.phase = ScalePhase.DONE
        return result

    def _switch(self, mig: Migration, retire: list[int], result: ScaleResult) -> None:
        """Every worker parked (no update in flight), only the rows updated since round 1
        began move, every PS stages the new map, then all switch at once and the workers
        resume. Anything failing before every PS staged (a worker that does not pause, a
        PS that dies) leaves every PS on the old map: MigrationAborted."""
        lz = self.launcher
        t_pause = self.clock()
        try:
            running = [w for w in self.running() if w in lz.workers]
            parked = get_alive(self.cluster, [lz.workers[w].pause.remote(PAUSE_TIMEOUT_S) for w in running])
            if not all(parked):  # False: not in time; None: it died (its batches are uncertain)
                stuck = [w for w, ok in zip(running, parked) if not ok]
                raise MigrationAborted(f"workers did not pause within {PAUSE_TIMEOUT_S:.0f}s or died: {stuck}")
            delta = {src: lz.ps[src].export_vshards.remote(vs, dirty_only=True) for src, vs in mig.outgoing.items()}
            replies = self.cluster.get([lz.ps[k].stage_switch.remote(mig.vmap, [delta[s] for s in mig.senders(k)]) for k in mig.keep])
        except (MigrationAborted, RayError) as e:
            # Nothing switched: drop what was prepared, everyone goes on as before (a dead
            # PS is then lost under the old map, as at any other time).
            get_alive(self.cluster, [h.cancel_migration.remote() for h in lz.ps.values()])
            lz.switch_map(lz.vmap, alive_only=True)
            raise MigrationAborted(str(e).strip().splitlines()[0]) from None
        # A commit only swaps references: a PS that dies now is lost under the new map,
        # like one dying just after a switch (its replacement restores its new vshards).
        # One that cannot commit (a bug) must not serve the old map: it is made lost too.
        for k, ref in [(k, lz.ps[k].commit_switch.remote(mig.vmap.version)) for k in mig.keep]:
            try:
                self.cluster.get(ref)
            except TaskFailed:
                self.cluster.kill(lz.ps[k])
            except ActorDied:
                pass
        # A retired PS that died since staging lost nothing (its rows moved): only its counts.
        result.retired_ps_stats = [s for s in get_alive(self.cluster, [lz.ps[k].stats.remote() for k in retire]) if s is not None]
        lz.switch_map(mig.vmap, ps=mig.keep, alive_only=True)
        done = self.clock()
        result.pause_s = done - t_pause
        result.copy_s = done - mig.began_s
        result.bytes_moved = int(sum(r["bytes_precopied"] + r["bytes_in"] for r in replies))
        result.bytes_in_pause = int(sum(r["bytes_in"] for r in replies))
        result.vshards_moved = len(mig.moves)
        slowest = max(replies, key=lambda r: r["recv_s"] + r["copy_s"], default={})
        result.ps_switch_s = {k: round(v, 4) for k, v in slowest.items() if k.endswith("_s")}


def _first(value: Any, make: Callable[[], Any]) -> Any:
    return value if value is not None else make()
