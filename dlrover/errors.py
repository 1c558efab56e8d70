"""User-facing errors.

Anything raised as a :class:`DLRoverError` is bad input or a bad environment that the
user can fix; the CLI prints ``error: <message>`` on one line and exits non-zero without
a traceback. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class DLRoverError(Exception):
    """A problem the user can fix (bad spec, bad data, bad CLI argument)."""


class SpecError(DLRoverError):
    """The job spec is invalid; the message names the field."""


class DataError(DLRoverError):
    """A data file is missing or malformed; the message names file:line."""


def format_validation_error(source: str, err: ValidationError) -> str:
    """Pydantic's multi-line report as one line, ``<source>: <dotted.field>: <problem>``
    (the first problem, and how many more). A whole-model check names its field in its
    own message, so an empty location adds nothing."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = re.sub(r"^(Value error|Assertion failed), ", "", first["msg"])
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {loc + ': ' if loc else ''}{msg}{more}"
