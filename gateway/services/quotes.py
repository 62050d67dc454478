"""What the site can promise: quotes, and the firm kW an opt-in decision rests on.

Only jobs the gateway can cap count: placed, on nodes that answer and whose agents may set
limits, and lasting the window. The others are left out, each with the reason (a job with no
placement, one on a node that does not answer, one on a node whose agent NVML refused a set
for permission, one that ends before the window does). A quote is kept until the mix or
the set of jobs left out changes, by its parameters and by the request's raw body, so a
repeated request skips parsing too.

Firm kW carries the declared jobs' power error (`FLEXGATE_DECLARED_POWER_UNCERTAINTY`; a
measured curve's own) and the site's record at the meter: the deliveries of its last
`FLEXGATE_QUOTE_HISTORY_EVENTS` completed events (`delivery.recent`), read again when an
event ends (`history_changed`).
"""

from __future__ import annotations

import json
from typing import Any

from flexmodel.quote import Delivered, quote
from gateway.services import delivery
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.settings import GatewaySettings
from gateway.store.db import Store
from gateway.units import rounded

#: Quotes kept at most (by parameters and by raw request body) before the cache starts over.
QUOTE_CACHE = 256


class Quotes:
    def __init__(
        self, settings: GatewaySettings, store: Store, book: JobBook, fleet: Fleet
    ) -> None:
        self.settings, self.store, self.book, self.fleet = settings, store, book, fleet
        self._history: list[Delivered] | None = None  #: read on first use after a change
        self._cache: dict[tuple[float | None, float, float] | bytes, bytes] = {}
        self._cached_for: tuple[int, int] | None = None  #: what the cache was made on
        self._firm: dict[tuple[float, float, bool], dict[str, Any]] = {}  #: `firm` answers
        self._left_out: dict[str, str] = {}

    def left_out(self, reachable_only: bool = True) -> dict[str, str]:
        """The jobs the site cannot cap now, by id, with the reason; without `reachable_only`,
        only those it cannot cap until someone acts (no placement, a node whose agent may not
        set limits), not those on a node that is silent now."""
        answering = set(self.fleet.nodes) - set(self.fleet.unreachable)
        out = {}
        for job in self.book.mix().jobs:
            if not job.placement:
                out[job.id] = "no placement: the gateway cannot cap it"
                continue
            silent = sorted({p.node for p in job.placement} - answering)
            if silent and reachable_only:
                out[job.id] = f"on {', '.join(silent)}, which does not answer"
                continue
            barred = sorted({p.node for p in job.placement} & set(self.fleet.cannot_cap))
            if barred:
                why = self.fleet.cannot_cap[barred[0]]
                out[job.id] = f"on {', '.join(barred)}, whose agent may not set limits: {why}"
        return out

    def history(self) -> list[Delivered]:
        """The last completed events' deliveries at the meter, newest first."""
        if self._history is None:
            self._history = delivery.recent(self.store, self.settings.quote_history_events)
        return self._history

    def history_changed(self) -> None:
        """An event has ended: its delivery joins the record quotes read."""
        self._history = None
        self._cached_for = None

    def _quote(self, window_s: float, confidence: float, **options: Any) -> dict[str, Any]:
        return quote(
            self.book.mix(),
            window_s=window_s,
            confidence=confidence,
            power_uncertainty=self.settings.declared_power_uncertainty,
            history=self.history(),
            **options,
        )

    def _fresh(self) -> dict[str, str]:
        """The jobs left out now; the cache starts over when the mix, the nodes known or the
        nodes down have changed since it was made (checked by counters: a cached quote costs
        no walk over the mix)."""
        self.book.mix()  # a changed mix moves its version
        key = (self.book.version, self.fleet.version)
        if key != self._cached_for:
            self._cache, self._firm, self._cached_for = {}, {}, key
            self._left_out = self.left_out()
        return self._left_out

    def quote(
        self, reduction_kw: float | None, window_s: float, confidence: float, raw: bytes | None
    ) -> bytes:
        """A quote as JSON."""
        left_out = self._fresh()
        key = (reduction_kw, window_s, confidence)
        if key not in self._cache:
            if len(self._cache) >= QUOTE_CACHE:
                self._cache.clear()
            doc = self._quote(window_s, confidence, reduction_kw=reduction_kw, left_out=left_out)
            self._cache[key] = json.dumps(rounded(doc), allow_nan=False).encode()
        if raw is not None:
            self._cache[raw] = self._cache[key]
        return self._cache[key]

    def cached(self, raw: bytes) -> bytes | None:
        """The answer to exactly this request body, if nothing it depends on has changed."""
        self._fresh()
        return self._cache.get(raw)

    def firm(
        self, window_s: float, confidence: float, reachable_only: bool = True
    ) -> dict[str, Any]:
        """What the site can shed over `window_s` with probability `confidence`, and the
        jobs left out: `{"firm_kw", "achievable_kw", "left_out"}` (`left_out` as above);
        kept, as quotes are, while the mix and the nodes stay as they are."""
        left_out = self._fresh() if reachable_only else self.left_out(reachable_only)
        key = (max(window_s, 1.0), confidence, reachable_only)
        if key not in self._firm:
            if len(self._firm) >= QUOTE_CACHE:
                self._firm.clear()
            doc = self._quote(key[0], confidence, per_job_curves=False, left_out=left_out)
            self._firm[key] = {k: doc[k] for k in ("firm_kw", "achievable_kw", "left_out")}
        return self._firm[key]

    def shortfall(
        self, asked_kw: float, window_s: float, confidence: float, reachable_only: bool = True
    ) -> str | None:
        """Why the site cannot promise `asked_kw` over `window_s` at `confidence`, naming the
        jobs left out; None when it can."""
        firm = self.firm(window_s, confidence, reachable_only)
        if asked_kw <= firm["firm_kw"] * (1 + 1e-9):
            return None
        left = "; ".join(f"{j['id']} left out: {j['reason']}" for j in firm["left_out"])
        return (
            f"asks for {asked_kw:.1f} kW; the site can promise {firm['firm_kw']:.1f} kW "
            f"(at {confidence:.0%} confidence, of {firm['achievable_kw']:.1f} kW achievable)"
            + (f"; {left}" if left else "")
        )
