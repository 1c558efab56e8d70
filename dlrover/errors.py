"""User-facing errors.

Anything raised as a :class:`DLRoverError` is bad input or a bad environment that the
user can fix; the CLI prints ``error: <message>`` on one line and exits non-zero without
a traceback. Everything else is a bug and keeps its traceback.
"""


class DLRoverError(Exception):
    """A problem the user can fix (bad spec, bad data, bad CLI argument)."""


class SpecError(DLRoverError):
    """The job spec is invalid; the message names the field."""


class DataError(DLRoverError):
    """A data file is missing or malformed; the message names file:line."""
