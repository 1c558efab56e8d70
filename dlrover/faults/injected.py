"""Injected faults (the spec's ``chaos:`` list), as seen from inside an actor.

A ``ChaosState`` lives in each worker and PS actor. The master sets it through the
actor's ``set_chaos`` call; the actor calls ``after_step(busy_s)`` once per step (worker)
or per request (PS): a slowed actor then sleeps ``(factor - 1) x busy_s``, so it runs
``factor`` times slower whatever it does; a leaking one keeps ``mb_per_s`` x elapsed
megabytes alive. A delayed PS sleeps ``delay_s`` in every pull and push before it
answers (``before_call``), like a server behind a slow link: the delay does not depend
on how much work the call carries. Killing needs no help from the actor (``ray.kill``).

A slow *node* (for tests and benchmarks of placement) is a property of the node, not of
an actor: a Ray node label ``dlrover.io/slowdown: F`` makes every worker placed there,
now or later, run F times slower (read once, when the worker starts). It *burns* CPU for
``(F - 1) x`` the step's CPU time after each step, as a slower processor would spend it, rather than
sleeping: on nodes that share cores (a loopback cluster on one machine) a sleeping worker
would hand its CPU to the others and the slow node would cost the job nothing.
"""

from __future__ import annotations

import math
import time

import ray

from dlrover.errors import DLRoverError

SLOWDOWN_LABEL = "dlrover.io/slowdown"


def node_slowdown() -> float:
    """How many times slower workers run on the node this process runs on (its
    ``SLOWDOWN_LABEL``; 1 without one)."""
    raw = ray.get_runtime_context().get_node_labels().get(SLOWDOWN_LABEL) if ray.is_initialized() else None
    if raw is None:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        factor = 0.0
    if not (math.isfinite(factor) and factor >= 1):
        raise DLRoverError(f"node label {SLOWDOWN_LABEL}: {raw!r} is not a slowdown factor (a number >= 1)")
    return factor


def burn_cpu(seconds: float) -> None:
    """Keep this thread on a core for ``seconds`` of its own CPU time (time it waits for a
    core does not count, so the work is the same however busy the machine is)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class ChaosState:
    def __init__(self, node_slowdown: float = 1.0) -> None:
        """``node_slowdown``: the node's (:func:`node_slowdown`), burnt after every step."""
        self.node_slowdown = node_slowdown
        self.slowdown = 1.0
        self.leak_mb_per_s = 0.0
        self.delay_s = 0.0
        self._leak_since = 0.0
        self._leaked: list[bytearray] = []

    def set(self, slowdown: float | None = None, leak_mb_per_s: float | None = None, delay_ms: float | None = None) -> None:
        """Turn on the faults given; the others stay as they are (faults add up)."""
        if slowdown is not None:
            self.slowdown = max(1.0, float(slowdown))
        if leak_mb_per_s is not None:
            self.leak_mb_per_s = max(0.0, float(leak_mb_per_s))
            self._leak_since = time.monotonic()
        if delay_ms is not None:
            self.delay_s = max(0.0, float(delay_ms)) / 1000.0

    def before_call(self) -> None:
        if self.delay_s > 0:
            time.sleep(self.delay_s)

    def after_step(self, busy_s: float, cpu_s: float | None = None) -> None:
        """``busy_s``: the step's (or request's) wall time; ``cpu_s``: the CPU time its
        thread spent in it (``busy_s`` if not given), which a slow node multiplies: a
        slower processor computes slower, it does not wait longer."""
        cpu_s = busy_s if cpu_s is None else cpu_s
        if self.node_slowdown > 1.0 and cpu_s > 0:
            burn_cpu((self.node_slowdown - 1.0) * cpu_s)
        if self.slowdown > 1.0 and busy_s > 0:
            time.sleep((self.slowdown - 1.0) * busy_s)
        if self.leak_mb_per_s > 0:
            want = int(self.leak_mb_per_s * (time.monotonic() - self._leak_since))
            while len(self._leaked) < want:
                self._leaked.append(bytearray(b"\x01" * (1 << 20)))  # touched: counts in RSS
