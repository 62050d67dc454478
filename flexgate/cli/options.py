"""What every verb's options share: the parser that fails in one line, and the checks on values.

Options are checked as they are parsed (`finite`, `fraction`, ...), so a command starts only
with values it can use; a bad one exits 2 with argparse's one-line message.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def fractions(text: str) -> list[float]:
    values = [finite(part) for part in text.split(",") if part.strip()]
    outside = [v for v in values if not 0.0 <= v < 1.0]
    if not values or outside:
        hint = _percent_hint(outside[0]) if outside else ""
        raise argparse.ArgumentTypeError(
            f"expected fractions in [0, 1) separated by commas, got {text!r}{hint}"
        )
    return values


def noise(text: str) -> float:
    value = finite(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a fraction from 0 to below 1, got {text!r}{_percent_hint(value)}"
        )
    return value


def positive(text: str) -> float:
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative(text: str) -> float:
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = finite(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a number strictly between 0 and 1, got {text!r}{_percent_hint(value)}"
        )
    return value


def share(text: str) -> float:
    value = finite(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a fraction from 0 to 1, got {text!r}{_percent_hint(value)}"
        )
    return value


def _percent_hint(value: float) -> str:
    """A share typed as a percentage (25 for 0.25) is the usual slip: name the fix."""
    return f" (a percentage? {value:g}% is {value / 100:g})" if 1.0 < value <= 100.0 else ""


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
