"""What both synthetic generators (``synth``, ``synth_highcard``) share about their
planted logit: the readers' dense transform, the sigmoid, and the calibration that gives
each component its share of the logit's variance and the bias its base CTR."""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def dense_log(dense: np.ndarray) -> np.ndarray:
    """Exactly the readers' dense transform (float32), so an oracle sees what a model sees."""
    return np.log1p(np.maximum(dense, 0).astype(np.float32))


def calibrate(parts: dict[str, np.ndarray], shares: dict[str, float], logit_std: float, base_ctr: float) -> tuple[dict[str, float], float]:
    """``(scale, bias)``: each component of ``parts`` (on a fixed reference sample) scaled
    to ``shares[name]`` of ``logit_std**2``, and the bias at which the mean CTR is
    ``base_ctr`` (bisection: the mean CTR grows with the bias)."""
    scale = {}
    for name, share in shares.items():
        std = parts[name].std()
        scale[name] = float(logit_std * np.sqrt(share) / std) if std > 0 else 0.0
    logit = sum(scale[name] * parts[name] for name in shares)
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sigmoid(mid + logit).mean() < base_ctr else (lo, mid)
    return scale, (lo + hi) / 2
