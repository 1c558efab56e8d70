"""Continuous training end to end on one machine: synthetic click logs arrive in
data/continuous/in/ every few seconds while a job follows the directory, trains each file
once, and publishes a model version every 10 s (jobs/continuous.yaml).

    .venv/bin/python examples/continuous.py          # then, in another shell:
    .venv/bin/dlrover serve data/continuous/versions --port 8000
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import dlrover
from dlrover.data.synth import SynthConfig, generate

STAGING, INBOX = Path("data/continuous/staging"), Path("data/continuous/in")
EVERY_S = 4.0  # a new file this often


def drip() -> None:
    """Move the staged files into the inbox one by one, each appearing whole (written
    under a name starting with '.', which is never data, then renamed)."""
    for f in sorted(STAGING.glob("*.tsv")):
        shutil.copy(f, INBOX / f".{f.name}")
        os.replace(INBOX / f".{f.name}", INBOX / f.name)
        print(f"[drip] {f.name} arrived", flush=True)
        time.sleep(EVERY_S)


def main() -> None:
    if not (STAGING / "synth.json").exists():
        generate(str(STAGING), SynthConfig(rows=400_000, files=10, seed=1), progress=False)
    shutil.rmtree(INBOX, ignore_errors=True)
    shutil.rmtree("data/continuous/versions", ignore_errors=True)
    INBOX.mkdir(parents=True)
    threading.Thread(target=drip, daemon=True).start()
    result = dlrover.run(dlrover.JobSpec.from_yaml("jobs/continuous.yaml"), progress="lines")
    print(result.status, f"auc={result.auc:.4f}", f"trained={result.samples_trained:,}")
    published = result.events.query("kind == 'version_published'")
    print(f"{len(published)} versions in data/continuous/versions; serve them: dlrover serve data/continuous/versions")


if __name__ == "__main__":
    main()
