"""The resolution physical figures are shown at: 1 W for kW figures, 0.1 W for watts.

Sums of floats leave dust (`shortfall_kw: 3.55e-15`); the API rounds every `*_kw` and `*_w`
field of what it answers to these resolutions, and nothing inside computes on the rounded
values."""

from __future__ import annotations

from typing import Any, TypeVar, cast

Doc = TypeVar("Doc")

KW_DECIMALS = 3  #: 1 W
W_DECIMALS = 1  #: 0.1 W


def rounded(doc: Doc) -> Doc:
    """`doc` with every float under a key ending in `_kw` or `_w` rounded (recursively); of
    the same type."""
    if isinstance(doc, dict):
        return cast(Doc, {key: _field(key, value) for key, value in doc.items()})
    if isinstance(doc, list):
        return cast(Doc, [rounded(item) for item in doc])
    return doc


def _field(key: str, value: Any) -> Any:
    if isinstance(value, float):
        if key.endswith("_kw"):
            return round(value, KW_DECIMALS) + 0.0  # + 0.0: no -0.0
        if key.endswith("_w"):
            return round(value, W_DECIMALS) + 0.0
        return value
    return rounded(value)
