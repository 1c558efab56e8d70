"""A SIGTERM to an actor's process is a notice, not an exit: a spot reclaim or a
Kubernetes eviction sends it first and kills the process only after a grace period. The
actor tells the master, which moves it off with a live rescale (``dlrover.master.drain``)
while it keeps serving; the master stops it once it is replaced."""

from __future__ import annotations

import signal
import threading
from typing import Callable


def on_sigterm(notify: Callable[[], None]) -> bool:
    """Call ``notify`` (on a thread of its own, not in the signal handler) when the process
    gets SIGTERM, instead of exiting. False where no handler can be installed (only the
    main thread may, which is where Ray creates an actor)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    got = threading.Event()

    def wait() -> None:
        got.wait()
        notify()

    threading.Thread(target=wait, daemon=True, name="sigterm-notice").start()
    signal.signal(signal.SIGTERM, lambda signum, frame: got.set())
    return True
