"""dlrover-ray: elastic DLRM training on Ray.

The public API, importable from the package top (each name is its module's own, loaded
on first use: ``import dlrover`` stays as light as the CLI needs)::

    spec = dlrover.load_spec("jobs/quickstart.yaml")   # a validated JobSpec
    model = dlrover.ServedModel.load("runs/<job_id>/model")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "JobSpec": "dlrover.spec",
    "load_spec": "dlrover.spec",
    "spec_from_dict": "dlrover.spec",
    "DLRoverError": "dlrover.errors",
    "ServedModel": "dlrover.serving.model",
    "FailurePolicy": "dlrover.faults.policy",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dlrover' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
