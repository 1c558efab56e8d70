"""``dlrover serve PUBLISH_DIR``: an HTTP scoring server over published model versions
(FastAPI on uvicorn, docs/decisions/serve-with-fastapi.md) that follows the directory.

It loads the newest complete version, and a background thread applies each newer one
as it appears: a delta's rows are written into copies of the tables they touch (the
others are shared), the result is checked against the version's ``state_sha256``, and
the model is swapped in with one reference assignment. A request reads that reference
once, so it is scored by one version from start to end, and answers with its number:
no request waits for a version to load and none is dropped.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlrover.errors import DataError
from dlrover.serving.model import ServedModel
from dlrover.serving.predict import layout_of
from dlrover.serving.versions import LoadedVersion, Version, apply_rows, load_version, model_of, state_digest, version_dir, versions

POLL_S = 1.0


@dataclass(frozen=True)
class Served:
    """The version being served and its tables as arrays (the next delta copies from them)."""

    version: Version
    model: ServedModel
    tables: list[np.ndarray]


def served(loaded: LoadedVersion) -> Served:
    return Served(loaded.version, loaded.model, [t.numpy() for t in loaded.model.tables])


class VersionFollower:
    """The newest complete version of ``root``, kept current by a background thread."""

    def __init__(self, root: str | Path, poll_s: float = POLL_S) -> None:
        self.root, self.poll_s = Path(root), poll_s
        self.current = served(load_version(self.root))
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="version-follower")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.advance()
            except DataError as e:  # a bad version is skipped: the one served stays
                if str(e) not in self.errors:
                    self.errors.append(str(e))
                    print(f"[dlrover] serve: {e}", file=sys.stderr, flush=True)

    def advance(self) -> bool:
        """Move to the newest complete version; False when already there."""
        have = versions(self.root)
        if not have or have[-1] <= self.current.version.version:
            return False
        newest = have[-1]
        chain = [Version.read(version_dir(self.root, newest))]
        while chain[-1].kind == "delta" and chain[-1].parent > self.current.version.version:
            chain.append(Version.read(version_dir(self.root, int(chain[-1].parent))))
        if chain[-1].kind == "full" or chain[-1].parent != self.current.version.version:
            self.current = served(load_version(self.root, newest))  # a new chain: load it whole
            return True
        tables = list(self.current.tables)
        for v in reversed(chain):  # requests under way keep reading the served tables: copies are written
            apply_rows(tables, version_dir(self.root, v.version), shared=self.current.tables)
        if state_digest(tables) != chain[0].state_sha256:
            raise DataError(f"{version_dir(self.root, newest)}: the tables after its deltas do not match its state_sha256")
        model = model_of(version_dir(self.root, newest), tables)
        self.current = Served(chain[0], model, tables)
        return True


def score_rows(current: Served, rows: list[dict[str, Any]]) -> list[float]:
    """Click probabilities of rows given as ``{column: value}`` (the job's columns; the
    label, if present, is ignored). A bad row is a DataError naming it."""
    import pyarrow as pa

    from dlrover.data.columns import table_to_rows

    layout = replace(layout_of(current.model.manifest), labeled=False)
    try:
        table = pa.Table.from_pylist(rows)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise DataError(f"rows: {e}") from None
    batch, bad, reasons = table_to_rows(table, layout, "rows", lambda r: np.array([f"rows[{i}]" for i in r]))
    if len(bad):
        raise DataError(reasons[0])
    lengths = None if batch.lengths is None else torch.from_numpy(batch.lengths)
    logits = current.model.logits(torch.from_numpy(batch.dense), torch.from_numpy(batch.sparse), lengths)
    return torch.sigmoid(logits).tolist()


def make_app(follower: VersionFollower) -> Any:
    """The FastAPI app: ``POST /score`` ``{"rows": [{column: value}, ...]}`` ->
    ``{"version": n, "scores": [...]}``; ``GET /version``: the served version's record."""
    from fastapi import Body, FastAPI, HTTPException

    app = FastAPI(title="dlrover serve")

    @app.post("/score")
    def score(body: dict = Body(...)) -> dict:
        current = follower.current  # one version for the whole request
        rows = body.get("rows")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise HTTPException(400, 'expected {"rows": [{column: value, ...}, ...]}')
        try:
            scores = score_rows(current, rows)
        except DataError as e:
            raise HTTPException(400, str(e)) from None
        return {"version": current.version.version, "scores": scores}

    @app.get("/version")
    def version() -> dict:
        v = follower.current.version
        return {"version": v.version, "kind": v.kind, "rows_trained": v.rows_trained, "job_id": v.job_id, "watermark": len(v.watermark)}

    return app


def serve(root: str | Path, host: str = "127.0.0.1", port: int = 8000, poll_s: float = POLL_S) -> None:
    """Serve ``root``'s versions until interrupted."""
    import uvicorn

    follower = VersionFollower(root, poll_s)
    follower.start()
    print(f"[dlrover] serving {root} version {follower.current.version.version} on http://{host}:{port}", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        uvicorn.run(make_app(follower), host=host, port=port, log_level="warning")
    finally:
        follower.stop()
        print(f"[dlrover] serve: stopped after {time.monotonic() - started:.0f}s at version {follower.current.version.version}", file=sys.stderr, flush=True)
