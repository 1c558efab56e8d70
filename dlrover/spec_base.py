"""The base of every job-spec section (unknown keys are errors, values never change), and
the dotted-key overrides of a spec's document (``--set data.epochs=3``, ``with_overrides``)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict

from dlrover.errors import SpecError

DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class SpecSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # resolved once, on the driver; never changed after


def set_dotted(doc: dict, overrides: Mapping[str, Any]) -> None:
    """Set each ``section.field`` of ``overrides`` in a spec's document, making the
    sections on the way; a malformed key, or one through a value that is not a section,
    is a one-line :class:`SpecError` naming it."""
    for key, value in overrides.items():
        if not isinstance(key, str) or not DOTTED.fullmatch(key):
            raise SpecError(f"override {key!r}: bad key (expected dotted.name)")
        node = doc
        parts = key.split(".")
        for p in parts[:-1]:
            child = node[p] = {} if node.get(p) is None else node[p]
            if not isinstance(child, dict):
                raise SpecError(f"override {key}: {p} is not a section")
            node = child
        node[parts[-1]] = value
