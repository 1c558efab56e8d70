"""A fake :class:`dlrover.master.cluster.Cluster` for tests of the master's parts.

Actors are plain Python objects made in this process; ``handle.method.remote(...)``
calls the method at once and returns a :class:`FakeRef` holding its answer or its
failure, raised by ``get`` as Ray would raise it (``TaskFailed`` wrapping the method's
exception, ``ActorDied`` once the actor is killed). A test can hold a call open
(``hold``) to make it late, or kill an actor, and then step the master's code.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from dlrover.master.cluster import ActorDied, CallTimeout, TaskFailed


OPEN = object()  # an actor method returning this leaves its call open (a run still training)


class FakeRef:
    """A call's answer: ready with a value or an error, or still open."""

    _ids = itertools.count()

    def __init__(self, value: Any = None, error: BaseException | None = None, ready: bool = True, actor: "FakeHandle | None" = None) -> None:
        self.id = next(self._ids)
        self.value, self.error, self.ready, self.actor = value, error, ready, actor
        self.method: str | None = None  # the actor method of a call left open

    def __hash__(self) -> int:
        return self.id

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"FakeRef({self.id}, ready={self.ready})"

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        """End a held call with ``value`` (or ``error``)."""
        self.value, self.error, self.ready = value, error, True


class FakeMethod:
    def __init__(self, handle: "FakeHandle", name: str, num_returns: int = 1) -> None:
        self.handle, self.name, self.num_returns = handle, name, num_returns

    def options(self, num_returns: int = 1, **_: Any) -> "FakeMethod":
        return FakeMethod(self.handle, self.name, num_returns)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        ref = self.handle.call(self.name, args, kwargs)
        if self.num_returns == 1:
            return ref
        if not ref.ready or ref.error is not None:
            return tuple(FakeRef(error=ref.error, ready=ref.ready, actor=ref.actor) for _ in range(self.num_returns))
        return tuple(FakeRef(v) for v in ref.value)


class FakeHandle:
    """A handle to an in-process actor object: every call is recorded in ``calls``."""

    def __init__(self, cluster: "FakeCluster", obj: Any, options: dict[str, Any]) -> None:
        self._cluster, self.obj, self.options = cluster, obj, options
        self.name: str = options.get("name", "")
        self.dead = False
        self.calls: list[tuple[str, tuple, dict]] = []
        self.open: list[FakeRef] = []  # calls held open, failed when the actor dies

    def __getattr__(self, name: str) -> FakeMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return FakeMethod(self, name)

    def __repr__(self) -> str:
        return f"FakeHandle({self.name or type(self.obj).__name__})"

    def call(self, name: str, args: tuple, kwargs: dict) -> FakeRef:
        self.calls.append((name, args, kwargs))
        if self.dead:
            return FakeRef(error=ActorDied(error_msg=f"{self.name} is dead"), actor=self)
        if name in self._cluster.held.get(self.name, ()):
            ref = FakeRef(ready=False, actor=self)
            ref.method = name
            self.open.append(ref)
            return ref
        try:
            value = getattr(self.obj, name)(*self._cluster.resolved(args), **kwargs)
        except Exception as e:  # noqa: BLE001 - raised to the caller's get, as Ray does
            return FakeRef(error=TaskFailed(name, f"{type(e).__name__}: {e}", e).as_instanceof_cause(), actor=self)
        if value is OPEN:
            ref = FakeRef(ready=False, actor=self)
            ref.method = name
            self.open.append(ref)
            return ref
        return FakeRef(value, actor=self)

    def sync(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` and return its answer (raise its failure) at once."""
        return self._cluster.get(self.call(name, args, kwargs))

    def names_called(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeCluster:
    """``make``: the object to stand for each actor class (default: the class itself),
    called with the actor's arguments. ``nodes``: node id -> its resources."""

    def __init__(self, make: dict[type, Callable[..., Any]] | None = None, nodes: dict[str, dict[str, float]] | None = None) -> None:
        self.make = make or {}
        self.nodes = nodes if nodes is not None else {"node-0": {"CPU": 16.0, "memory": 64.0 * 2**30}}
        self.here = next(iter(self.nodes), "node-0")
        self.actors: list[FakeHandle] = []
        self.tasks: list[tuple[Callable[..., Any], tuple]] = []
        self.held: dict[str, set[str]] = {}  # actor name -> methods whose calls stay open
        self.draining: dict[str, float | None] = {}
        self.autoscaler = False
        self.master: Any = None
        self.clock: Any = None  # a FakeClock (``.now``): waits with a timeout move it on
        self.script: list[tuple[float, Callable[[], None]]] = []  # (clock time, action), see ``at``
        self.processes_killed: list[tuple[str | None, int | None]] = []
        self.horizon_s = 3600.0  # a wait past this much clock time fails the test (no end in sight)
        self._began: float | None = None

    # -- what a test does ---------------------------------------------------------------
    def hold(self, actor: str, method: str) -> None:
        """Calls of ``method`` on ``actor`` stay open until resolved (or the actor dies)."""
        self.held.setdefault(actor, set()).add(method)

    def release(self, actor: str, method: str) -> None:
        self.held.get(actor, set()).discard(method)

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Do ``action`` once the clock reaches ``when`` (during a wait that would block)."""
        self.script.append((when, action))
        self.script.sort(key=lambda x: x[0])

    def _run_script(self, until: float) -> None:
        while self.script and self.script[0][0] <= until:
            when, action = self.script.pop(0)
            self.clock.now = max(self.clock.now, when)
            action()

    def by_name(self, name: str) -> FakeHandle:
        (handle,) = [h for h in self.actors if h.name == name and not h.dead]
        return handle

    def alive(self, cls: type | None = None) -> list[FakeHandle]:
        return [h for h in self.actors if not h.dead and (cls is None or h.options.get("cls") is cls)]

    # -- the Cluster protocol -----------------------------------------------------------
    def resolved(self, args: Iterable[Any]) -> list[Any]:
        """Arguments as the callee sees them. Unlike Ray, refs inside a list are resolved
        too: the PS code ``ray.get``s those itself, which here would start Ray."""
        def one(a: Any) -> Any:
            if isinstance(a, FakeRef):
                return self.get(a)
            return [one(x) for x in a] if isinstance(a, list) else a

        return [one(a) for a in args]

    def actor(self, cls: type, *args: Any, node: str | None = None, soft: bool = True, **options: Any) -> FakeHandle:
        obj = self.make.get(cls, cls)(*args)
        handle = FakeHandle(self, obj, {**options, "cls": cls, "node": node or self.here})
        self.actors.append(handle)
        return handle

    def task(self, fn: Callable[..., Any], *args: Any, node: str | None = None, soft: bool = True, **options: Any) -> FakeRef:
        self.tasks.append((fn, args))
        try:
            return FakeRef(fn(*self.resolved(args)))
        except Exception as e:  # noqa: BLE001
            return FakeRef(error=TaskFailed(getattr(fn, "__name__", "task"), str(e), e).as_instanceof_cause())

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        if isinstance(refs, list):
            return [self.get(r, timeout) for r in refs]
        ref: FakeRef = refs
        if not ref.ready:
            if timeout is None:
                raise AssertionError(f"get of {ref} would block for ever (resolve it, or pass a timeout)")
            raise CallTimeout()
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        """A wait that would block runs the script's actions due meanwhile and moves the
        clock on by ``timeout`` (or to the action that ended it)."""
        self.waiting()
        if sum(r.ready for r in refs) < num_returns and timeout and self.clock is not None:
            self._began = self.clock.now if self._began is None else self._began
            if self.clock.now - self._began > self.horizon_s:
                raise AssertionError(f"still waiting for {refs} after {self.horizon_s:.0f} s of clock time")
            end = self.clock.now + timeout
            while self.script and self.script[0][0] <= end and sum(r.ready for r in refs) < num_returns:
                self._run_script(self.script[0][0])
            if sum(r.ready for r in refs) < num_returns:
                self.clock.now = max(self.clock.now, end)
        ready = [r for r in refs if r.ready]
        if len(ready) < num_returns and timeout is None:
            raise AssertionError(f"wait for {num_returns} of {refs} would block for ever")
        return ready, [r for r in refs if not r.ready]

    def waiting(self) -> None:
        """Called at each wait: a subclass lets its actors make progress here."""

    def put(self, value: Any) -> FakeRef:
        return FakeRef(value)

    def is_ref(self, value: Any) -> bool:
        return isinstance(value, FakeRef)

    def cancel(self, ref: Any) -> None:
        ref.resolve(error=TaskFailed("cancelled", "", RuntimeError("cancelled")))

    def kill(self, handle: Any) -> None:
        handle.dead = True
        for ref in handle.open:
            if not ref.ready:
                ref.resolve(error=ActorDied(error_msg=f"{handle.name} was killed"))

    def kill_process(self, node_id: str | None, pid: int | None) -> None:
        """Recorded, never done: the fake actors' pids are this test's own process."""
        self.processes_killed.append((node_id, pid))

    def node_id(self) -> str:
        return self.here

    def current_actor(self) -> Any:
        return self.master

    def alive_nodes(self) -> dict[str, dict[str, float]]:
        return {n: dict(r) for n, r in self.nodes.items()}

    def free_cpus(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for h in self.alive():
            used[h.options["node"]] = used.get(h.options["node"], 0.0) + float(h.options.get("num_cpus", 0.0) or 0.0)
        return {n: r.get("CPU", 0.0) - used.get(n, 0.0) for n, r in self.nodes.items()}

    def draining_nodes(self) -> dict[str, float | None]:
        return dict(self.draining)

    def autoscaler_running(self) -> bool:
        return self.autoscaler

    def object_nodes(self, refs: list[Any]) -> dict[Any, list[str]]:
        return {}

    def run_on_nodes(self, fn: Callable[[], Any], nodes: Iterable[str], what: str) -> dict[str, Any]:
        return {n: fn() for n in nodes}
