"""Injected faults (the spec's ``chaos:`` list), as seen from inside an actor.

A ``ChaosState`` lives in each worker and PS actor. The master sets it through the
actor's ``set_chaos`` call; the actor calls ``after_step(busy_s)`` once per step (worker)
or per request (PS): a slowed actor then sleeps ``(factor - 1) x busy_s``, so it runs
``factor`` times slower whatever it does; a leaking one keeps ``mb_per_s`` x elapsed
megabytes alive. A delayed PS sleeps ``delay_s`` in every pull and push before it
answers (``before_call``), like a server behind a slow link: the delay does not depend
on how much work the call carries. Killing needs no help from the actor (``ray.kill``).

A slow *node* (for tests and benchmarks of placement) is a property of the node, not of
an actor: a Ray node label ``dlrover.io/step-delay-ms`` makes every worker placed there,
now or later, sleep that long after each step (read once, when the worker starts).
"""

from __future__ import annotations

import time

import ray

from dlrover.errors import DLRoverError

STEP_DELAY_LABEL = "dlrover.io/step-delay-ms"


def node_step_delay_s() -> float:
    """The step delay of the node this process runs on (its ``STEP_DELAY_LABEL``), in s."""
    raw = ray.get_runtime_context().get_node_labels().get(STEP_DELAY_LABEL) if ray.is_initialized() else None
    if raw is None:
        return 0.0
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms >= 0:
        raise DLRoverError(f"node label {STEP_DELAY_LABEL}: {raw!r} is not a delay in milliseconds (a number >= 0)")
    return ms / 1000.0


class ChaosState:
    def __init__(self, step_delay_s: float = 0.0) -> None:
        """``step_delay_s``: the node's (:func:`node_step_delay_s`), slept after every step."""
        self.step_delay_s = step_delay_s
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

    def after_step(self, busy_s: float) -> None:
        if self.step_delay_s > 0:
            time.sleep(self.step_delay_s)
        if self.slowdown > 1.0 and busy_s > 0:
            time.sleep((self.slowdown - 1.0) * busy_s)
        if self.leak_mb_per_s > 0:
            want = int(self.leak_mb_per_s * (time.monotonic() - self._leak_since))
            while len(self._leaked) < want:
                self._leaked.append(bytearray(b"\x01" * (1 << 20)))  # touched: counts in RSS
