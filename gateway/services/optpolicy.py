"""Whether the site takes an event on, and what the utility would count of its shed.

An external event: the source's own verdict first (a test event, a signal the site cannot
read), then the site's policy (FLEXGATE_OPT_POLICY: `never`; `feasible`, in when the site's
firm kW over the event covers its largest reduction, `Quotes.shortfall`; `always`). With
FLEXGATE_OPT_IN_BASELINE, what the program's baseline rule would count of the firm shed
(`Counted.opt_in`): short of what is asked, an external event is opted out and a manual one
keeps its shortfall stated. While events run each is checked again (`recheck`): the site's job
mix may no longer shed what it asks. The events service acts on the answers
(`gateway.services.events`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.services.counted import Counted
from gateway.services.grid import ExternalEvent
from gateway.services.intervals import from_doc
from gateway.services.quotes import Quotes
from gateway.services.site import SitePower
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store.models import EventRow, as_utc


class OptPolicy:
    def __init__(
        self,
        settings: GatewaySettings,
        power: SitePower,
        quotes: Quotes,
        targets: Targets,
        counted: Counted,
    ) -> None:
        self.settings, self.power, self.quotes = settings, power, quotes
        self.targets, self.counted = targets, counted

    @property
    def rechecks(self) -> bool:
        """Whether running events are checked again at all (`recheck`)."""
        return self.settings.opt_policy == "feasible" or bool(self.settings.opt_in_baseline)

    def verdict(self, external: ExternalEvent) -> tuple[str, str | None]:
        """Opt in or out, and why out: the source's own verdict first, then the site's policy."""
        if external.opt_out_reason:
            return "out", external.opt_out_reason
        if self.settings.opt_policy == "never":
            return "out", "the site's policy is never to opt in"
        simulated = self.power.fleet.simulated_refusal()
        if simulated:
            return "out", simulated
        most = max((i.reduction_kw for i in external.intervals), default=0.0)
        window_s = (
            (external.end - external.start).total_seconds()
            if external.start and external.end
            else 1.0
        )
        if self.settings.opt_policy == "feasible":
            short = self.quotes.shortfall(most, window_s, self.settings.opt_confidence)
            if short is not None:
                return "out", short
        return "in", None

    async def count(
        self, start: datetime, end: datetime, asks_kw: float, *, left_s: float | None = None
    ) -> dict[str, Any] | None:
        """What the utility would count of the site's firm shed (over the `left_s` left of
        the event, default all of it) in [start, end) under FLEXGATE_OPT_IN_BASELINE
        (`Counted.opt_in`), when it is set; while caps hold the site down, from its uncapped
        level. A recount (`left_s` given) counts nodes silent now: they are re-planned around."""
        if not self.settings.opt_in_baseline:
            return None
        window_s = (end - start).total_seconds() if left_s is None else left_s
        firm = self.quotes.firm(window_s, self.settings.opt_confidence, left_s is None)
        level = self.counted.level_uncapped() if self.targets.holding else None
        return await self.counted.opt_in(start, end, asks_kw, firm, level)

    async def recheck(
        self, event: EventRow, baseline_kw: float, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        """A running event checked again: what the utility would count of it now (kept as
        its recount), and, for an external one, why the site can no longer hold it (None: it
        can). Nodes silent now do not count: the targets are re-planned around them."""
        began_kw = event.baseline_kw if event.baseline_kw is not None else baseline_kw
        asks = max(
            (from_doc(i).reduction_now_kw(baseline_kw, began_kw) for i in event.intervals),
            default=0.0,
        )
        start, end = as_utc(event.start), as_utc(event.end)
        left_s = (end - max(start, now)).total_seconds()
        counted = await self.count(start, end, asks, left_s=left_s)
        if counted is not None:
            self.counted.recounted(event.id, counted)
        if event.source == "manual":
            return counted, None
        short = None if counted is None else counted["short"]
        if self.settings.opt_policy == "feasible":  # a silent node is re-planned around
            confidence = self.settings.opt_confidence
            short = self.quotes.shortfall(asks, left_s, confidence, False) or short
        return counted, short
