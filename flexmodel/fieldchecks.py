"""A decoded document's fields checked, each refused with a one-line `InvalidJobError` that
names the field: numbers within a plausible range (naming the unit slip a value out of range
most likely is: kW for W, ms for s, percent for a share), booleans, lists of numbers, and
unknown fields. The job-mix reader's (`flexmodel.jobmix`)."""

from __future__ import annotations

import math
from typing import Any

from flexmodel.errors import InvalidJobError

#: Fractions and shares of a whole.
SHARE = (0.0, 1.0)
#: A value this many times too small or too large, in these units, was probably typed in them.
_UNIT_SLIPS = {"W": (1000.0, "kW"), "s": (0.001, "ms"), "": (0.01, "percent")}


def refuse_unknown(doc: dict[str, Any], allowed: set[str], where: str) -> None:
    """Refuse the fields of `doc` not in `allowed`, naming them."""
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise InvalidJobError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(
    value: Any,
    label: str,
    *,
    within: tuple[float, float] | None = None,
    minimum: float | None = None,
    strict: bool = False,
    unit: str = "",
) -> float:
    """`value` as a float, refused when outside `within` (or below `minimum`).

    `strict` makes the lower bound exclusive. The message names the unit and, when the value
    would fit in a neighbouring unit (kW for W, ms for s, percent for a share), says so.
    """
    if not _is_number(value) or not math.isfinite(value):
        raise InvalidJobError(f"{label} must be a finite number, got {value!r}")
    out = float(value)
    low, high = within if within is not None else (minimum, None)
    too_low = low is not None and (out <= low if strict else out < low)
    too_high = high is not None and out > high
    if not (too_low or too_high):
        return out
    suffix = f" {unit}" if unit else ""
    if high is None:
        bound = f"{'above' if strict else 'at least'} {low:g}{suffix}"
    elif low is None:
        bound = f"at most {high:g}{suffix}"
    elif strict:
        bound = f"above {low:g} and at most {high:g}{suffix}"
    else:
        bound = f"from {low:g} to {high:g}{suffix}"
    raise InvalidJobError(f"{label} must be {bound}, got {out:g}{_slip(out, within, unit)}")


def _slip(value: float, within: tuple[float, float] | None, unit: str) -> str:
    """A hint when `value` is in range once read in the unit people confuse with `unit`."""
    if within is None or unit not in _UNIT_SLIPS:
        return ""
    scale, other = _UNIT_SLIPS[unit]
    if unit == "" and within != SHARE:
        return ""
    fixed = value * scale
    if within[0] < fixed <= within[1]:
        return f" ({value:g} looks like {other}: {fixed:g}{f' {unit}' if unit else ''}?)"
    return ""


def number_field(
    doc: dict[str, Any],
    name: str,
    where: str,
    default: float | None = None,
    **bounds: Any,
) -> float:
    """Field `name` of `doc` checked by `check_number(**bounds)`, or `default` when absent."""
    if doc.get(name) is None:
        if default is None:
            raise InvalidJobError(f"{where}: missing required field '{name}'")
        return default
    return check_number(doc[name], f"{where}: '{name}'", **bounds)


def optional_field(doc: dict[str, Any], name: str, where: str, **bounds: Any) -> float | None:
    """Number field `name` of `doc` as `number_field` checks it, or None when absent."""
    if doc.get(name) is None:
        return None
    return number_field(doc, name, where, **bounds)


def boolean_field(doc: dict[str, Any], name: str, where: str) -> bool:
    """Field `name` of `doc`, true or false (false when absent)."""
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise InvalidJobError(f"{where}: '{name}' must be true or false, got {value!r}")
    return value


def number_list(value: Any, label: str, **bounds: Any) -> list[float]:
    """A list of numbers, each checked by `check_number(**bounds)`."""
    if not isinstance(value, list):
        raise InvalidJobError(f"{label} must be a list of numbers")
    return [check_number(v, label, **bounds) for v in value]
