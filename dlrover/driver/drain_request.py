"""``dlrover drain JOB --node NODE_ID [--deadline-s N] --address ADDR``: move a job's
actors off a node before it goes away.

It asks Ray to drain the node (the call ``ray drain-node`` and the autoscaler make, with
the reason "preemption"), so Ray places nothing new there; the job's master sees the
drain in Ray's list of draining nodes and moves its actors off with a live rescale
(``dlrover.master.drain``). A drain made any other way (``ray drain-node``, a cloud
autoscaler) takes the same path.
"""

from __future__ import annotations

import socket
import time

from dlrover.errors import DLRoverError


CONNECT_TIMEOUT_S = 5.0


def _check_listening(address: str) -> None:
    """One line at once when nothing listens at a ``host:port`` address: ``ray.init``
    would retry for minutes. Other addresses (``auto``, ``ray://...``) go to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise DLRoverError(f"--address {address}: cannot connect to Ray: nothing answers there ({e.strerror or e})") from None


def drain(address: str, job: str, node: str, deadline_s: float | None) -> int:
    import ray
    from ray.core.generated import autoscaler_pb2

    from dlrover.driver.rayauth import use_token_auth

    if deadline_s is not None and deadline_s <= 0:
        raise DLRoverError(f"--deadline-s: must be > 0, got {deadline_s:g}")
    _check_listening(address)
    use_token_auth()
    try:
        ray.init(address=address, namespace="dlrover", logging_level="ERROR")
    except Exception as e:  # noqa: BLE001 - unreachable or refused: one line
        raise DLRoverError(f"--address {address}: cannot connect to Ray: {str(e).strip().splitlines()[0]}") from None
    try:
        master = ray.get_actor(f"{job}/master", namespace="dlrover")
    except ValueError:
        raise DLRoverError(f"no running job {job!r} at {address}") from None
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    if node not in alive:
        raise DLRoverError(f"--node: no live node {node!r} at {address} (`ray list nodes` shows them)")
    if node == ray.get(master.node_id.remote()):
        raise DLRoverError(f"--node: {node[:12]} runs {job}'s master and dense PS; draining it restarts the job from its last durable checkpoint, not supported by a drain")
    deadline_ms = 0 if deadline_s is None else int((time.time() + deadline_s) * 1000)
    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    accepted, why = gcs.drain_node(node, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), f"dlrover drain {job}", deadline_ms)
    if not accepted:
        raise DLRoverError(f"Ray did not accept draining node {node[:12]}: {why}")
    left = "no deadline" if deadline_s is None else f"deadline in {deadline_s:g} s"
    print(f"node {node[:12]} is draining ({left}); {job} moves its actors off it (its events: node_drain, scale)")
    return 0
