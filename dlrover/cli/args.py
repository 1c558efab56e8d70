"""The command line's argument types and parser class, shared by ``dlrover.cli.main`` and the
modules that add its subcommands (``bench``, ``data``, ``serving`` of ``dlrover.cli``)."""

from __future__ import annotations

import argparse
import math
import sys

EXIT_USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    """A user error in the arguments: one ``error:`` line and exit 2, no usage dump."""

    def error(self, message: str) -> None:
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR)


def number(cast: type, low: float, strict: bool, what: str, high: float = math.inf):
    """An argparse type: ``cast(v)``, finite, above ``low`` (``strict``) or at least it,
    and at most ``high``."""

    def parse(v: str):
        try:
            x = cast(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v!r}") from None
        if not math.isfinite(x) or (x <= low if strict else x < low) or x > high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v!r}")
        return x

    return parse


positive_int = number(int, 0, True, "a positive integer")
nonneg_int = number(int, 0, False, "an integer >= 0")
positive_float = number(float, 0.0, True, "a positive number")
nonneg_float = number(float, 0.0, False, "a finite number >= 0")
probability = number(float, 0.0, False, "a probability in [0, 1]", high=1.0)
tick_s = number(float, 1.0, False, "at least 1 second")


def int_list(text: str) -> list[int]:
    """An argparse type: ``1,2,4`` (positive integers)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas (e.g. 1,2,4), got {text!r}")
    return values
