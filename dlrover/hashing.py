"""splitmix64's finaliser: the one 64-bit mixing function dlrover hashes ids with (a
dynamic table's vshard, the synthetic data's value ids and planted weights)."""

from __future__ import annotations

import numpy as np


def splitmix64(x: np.ndarray) -> np.ndarray:
    """Well-spread uint64 of uint64 values (wrapping arithmetic), so that sequential or
    structured ids spread evenly under a modulo."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
