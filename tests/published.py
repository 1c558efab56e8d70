"""Published versions made without a job (``dlrover.bench.serving``'s helpers): a small
spec publishing to a directory, and ``publish`` of a known state."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import small_spec
from dlrover.bench.serving import changed_state, initial_state, publish_state
from dlrover.serving.versions import Version


def publish_spec(data_dir: Path, out: Path, quantize: str = "none", rows: int = 2000):
    return small_spec(data_dir, model__num_embeddings=rows, publish={"dir": str(out), "every_s": 1, "quantize": quantize})


def elsewhere(spec, out: Path):
    """``spec`` publishing to ``out`` instead."""
    return spec.model_copy(update={"publish": spec.publish.model_copy(update={"dir": str(out)})})


initial = initial_state
step = changed_state


def publish(spec, state: list[np.ndarray], dense: np.ndarray, n: int, parent: int | None = None, base: int | None = None, rows: list[np.ndarray] | None = None) -> Version:
    return publish_state(spec, state, dense, n, parent, base, rows)
