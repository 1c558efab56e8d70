"""Held-out evaluation: AUC and log loss of predicted click probabilities."""

from __future__ import annotations

import numpy as np


def evaluate_scores(labels: np.ndarray, probs: np.ndarray, oracle: np.ndarray | None = None) -> dict:
    """AUC/logloss of ``probs``; with the generator's true probabilities (``oracle``), also
    the best AUC any model could reach on exactly these rows."""
    from sklearn.metrics import log_loss, roc_auc_score  # here: 1 s of the master's start-up otherwise

    out: dict = {"rows": int(len(labels))}
    if len(labels) == 0 or len(np.unique(labels)) < 2:
        return out
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    out["auc"] = float(roc_auc_score(labels, p))
    out["logloss"] = float(log_loss(labels, p, labels=[0, 1]))
    if oracle is not None:
        out["best_auc"] = float(roc_auc_score(labels, oracle))
    return out
