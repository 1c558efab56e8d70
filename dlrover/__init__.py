"""dlrover-ray: elastic DLRM training on Ray.

The public API (docs/API.md), importable from the package top (each name is its module's own, loaded
on first use: ``import dlrover`` stays as light as the CLI needs)::

    spec = dlrover.JobSpec.from_yaml("jobs/quickstart.yaml").with_overrides({"data.epochs": 1})
    result = dlrover.run(spec)                    # a JobResult: result.auc, result.events
    job = dlrover.submit(spec, address="http://127.0.0.1:8265")   # job.wait(), job.result()
    dlrover.export_run(result.run_dir, "models/quickstart")   # then dlrover.predict(...)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "run": "dlrover.api.running",
    "submit": "dlrover.api.jobs",
    "JobResult": "dlrover.api.result",
    "SubmittedJob": "dlrover.api.jobs",
    "Observer": "dlrover.driver.observers",
    "JobSpec": "dlrover.spec",
    "spec_from_dict": "dlrover.spec",
    "DLRoverError": "dlrover.errors",
    "export_run": "dlrover.serving.export",
    "predict": "dlrover.serving.predict",
    "ServedModel": "dlrover.serving.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dlrover' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
