"""The master's one boundary around Ray: every Ray call of ``dlrover.master`` goes
through a :class:`Cluster`, and only this module imports ``ray`` (a house-rule test
enforces it).

:class:`RayCluster` is the implementation the job runs on. Tests give the master's parts
a fake cluster instead (``tests/fake_cluster.py``): its handles are plain objects whose
``method.remote(...)`` calls return refs the fake resolves, so recovery, rollback, the
scaler's phases and the states can be stepped without a Ray cluster. The failure
exceptions below are Ray's own classes under the names the master uses, so a fake
raises exactly what Ray would.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import ray
from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
from ray.autoscaler._private.util import format_readonly_node_type
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0

RayError = ray.exceptions.RayError  # any failure of a call (the base of the three below)
ActorDied = ray.exceptions.RayActorError  # the actor called (or one it called) is gone
TaskFailed = ray.exceptions.RayTaskError  # the call raised: ``.cause`` is its exception
CallTimeout = ray.exceptions.GetTimeoutError  # ``get`` gave up waiting


def signal_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Cluster(Protocol):
    """What the master asks of Ray. Handles are whatever ``actor`` returned; a call on
    one is ``handle.method.remote(*args)``, which returns a ref for ``get``/``wait``."""

    def actor(self, cls: type, *args: Any, node: str | None = None, soft: bool = True, **options: Any) -> Any:
        """Create an actor of ``cls`` (``options``: Ray's, e.g. ``name``, ``num_cpus``,
        ``memory``); ``node``: placed there (``soft``: or elsewhere when it is full)."""

    def task(self, fn: Callable[..., Any], *args: Any, node: str | None = None, soft: bool = True, **options: Any) -> Any:
        """Run ``fn(*args)`` as a task (zero CPUs unless ``options`` say); its ref."""

    def get(self, refs: Any, timeout: float | None = None) -> Any: ...

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]: ...

    def put(self, value: Any) -> Any: ...

    def is_ref(self, value: Any) -> bool: ...

    def cancel(self, ref: Any) -> None: ...

    def kill(self, handle: Any) -> None:
        """Kill the actor at once, without a restart."""

    def kill_process(self, node_id: str | None, pid: int | None) -> None:
        """SIGKILL process ``pid`` on node ``node_id`` (best effort: it may be gone)."""

    def node_id(self) -> str:
        """The node this process (the master) runs on."""

    def current_actor(self) -> Any:
        """The master's own handle (what its actors call back)."""

    def alive_nodes(self) -> dict[str, dict[str, float]]:
        """Each alive node's total resources, by node id."""

    def free_cpus(self) -> dict[str, float]: ...

    def draining_nodes(self) -> dict[str, float | None]:
        """Nodes Ray is draining, each with its deadline (Unix seconds; None: none given)."""

    def autoscaler_running(self) -> bool: ...

    def object_nodes(self, refs: list[Any]) -> dict[Any, list[str]]:
        """The nodes holding each object (best effort: unknown objects are left out)."""

    def run_on_nodes(self, fn: Callable[[], Any], nodes: Iterable[str], what: str) -> dict[str, Any]:
        """``fn()`` on each of ``nodes`` at once: the answers of those that gave one."""


class RayCluster:
    """:class:`Cluster` on the Ray cluster this process is connected to."""

    def __init__(self) -> None:
        self._remote: dict[Any, Any] = {}  # function or class -> its ray.remote wrapper (exported once)

    def _wrapped(self, target: Any) -> Any:
        if target not in self._remote:
            self._remote[target] = ray.remote(target)
        return self._remote[target]

    @staticmethod
    def _placed(options: dict[str, Any], node: str | None, soft: bool) -> dict[str, Any]:
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=soft)
        return options

    def actor(self, cls: type, *args: Any, node: str | None = None, soft: bool = True, **options: Any) -> Any:
        return self._wrapped(cls).options(**self._placed(options, node, soft)).remote(*args)

    def task(self, fn: Callable[..., Any], *args: Any, node: str | None = None, soft: bool = True, **options: Any) -> Any:
        options.setdefault("num_cpus", 0)
        return self._wrapped(fn).options(**self._placed(options, node, soft)).remote(*args)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        return ray.get(refs, timeout=timeout)

    def wait(self, refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        if not refs:
            return [], []
        return ray.wait(refs, num_returns=num_returns, timeout=timeout)

    def put(self, value: Any) -> Any:
        return ray.put(value)

    def is_ref(self, value: Any) -> bool:
        return isinstance(value, ray.ObjectRef)

    def cancel(self, ref: Any) -> None:
        ray.cancel(ref, force=True)

    def kill(self, handle: Any) -> None:
        ray.kill(handle, no_restart=True)

    def kill_process(self, node_id: str | None, pid: int | None) -> None:
        """Directly when it is this process's node (a stopped process dies at once), else
        from a task pinned to that node (which on a loaded node may take a while to
        start). Ray's kill alone leaves a stopped process holding its resources."""
        if pid is None or node_id is None:
            return
        if node_id == self.node_id():
            signal_kill(pid)
            return
        try:
            ray.get(self.task(signal_kill, pid, node=node_id, soft=False, max_retries=0), timeout=10)
        except RayError:
            pass

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def current_actor(self) -> Any:
        return ray.get_runtime_context().current_actor

    def alive_nodes(self) -> dict[str, dict[str, float]]:
        return {n["NodeID"]: dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")}

    def free_cpus(self) -> dict[str, float]:
        """Each alive node's unreserved Ray CPUs as the GCS sees them now (a node with all
        of them taken is missing from Ray's answer: 0). Ray 2.60 has no public per-node
        call without the dashboard; this DeveloperAPI reads the GCS, as Ray's own TPU
        utilities do. It lags actor creation by a resource report, so the caller counts
        its own recent placements."""
        from ray._private.state import available_resources_per_node

        return {node: float(res.get("CPU", 0.0)) for node, res in available_resources_per_node().items()}

    def draining_nodes(self) -> dict[str, float | None]:
        from ray._private.state import state

        return {node: (ms / 1000.0 if ms else None) for node, ms in state.get_draining_nodes().items()}

    def autoscaler_running(self) -> bool:
        """Autoscaler v2 reports its iterations to the GCS. v1's monitor runs on every head
        node and writes a status report; without an autoscaling config it is read-only,
        and names each node's type after the node itself."""
        from ray.autoscaler.v2.sdk import get_cluster_status
        from ray.experimental.internal_kv import _internal_kv_get

        try:
            stats = get_cluster_status(ray.get_runtime_context().gcs_address).stats
            if stats.autoscaler_iteration_time_s is not None or stats.autoscaler_version not in (None, "", "0"):
                return True
        except Exception as e:  # noqa: BLE001 - an older GCS without the v2 state: ask v1
            log.debug("autoscaler v2 state unavailable: %s", e)
        status = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
        if not status:
            return False
        types = (json.loads(status).get("autoscaler_report") or {}).get("node_type_mapping") or {}
        return any(kind != format_readonly_node_type(node) for node, kind in types.items())

    def object_nodes(self, refs: list[Any]) -> dict[Any, list[str]]:
        from ray.experimental import get_object_locations

        if not refs:
            return {}
        try:
            where = get_object_locations(refs, timeout_ms=int(PROBE_TIMEOUT_S * 1000))
        except (RuntimeError, RayError):  # placement is an optimisation: Ray places them
            return {}
        return {r: list(w.get("node_ids") or []) for r, w in where.items() if w.get("node_ids")}

    def run_on_nodes(self, fn: Callable[[], Any], nodes: Iterable[str], what: str) -> dict[str, Any]:
        """Zero-CPU tasks pinned to the nodes; a lost or late node is left out, with a
        warning naming ``what`` was asked."""
        refs = {self.task(fn, node=n, soft=False, max_retries=0): n for n in nodes}
        if not refs:
            return {}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        out = {}
        for ref in ready:
            try:
                out[refs[ref]] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a node lost meanwhile
                log.warning("%s probe of node %s failed: %s", what, refs[ref], e)
        for ref in late:
            log.warning("%s probe of node %s gave no answer in %.0f s", what, refs[ref], PROBE_TIMEOUT_S)
            ray.cancel(ref, force=True)
        return out



def get_alive(cluster: Cluster, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
    """Results of calls on workers; ``None`` for a worker that died (its death reaches the
    master as an event on its ``run`` and is handled there) or, with ``timeout_s``, did
    not answer in time."""
    out = []
    for r in refs:
        try:
            out.append(cluster.get(r, timeout=timeout_s))
        except (ActorDied, TaskFailed, CallTimeout):
            out.append(None)
    return out
