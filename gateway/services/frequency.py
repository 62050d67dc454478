"""The frequency trigger (docs/fast.md, "The frequency trigger"): a feed of the grid's
frequency, sampled every FLEXGATE_FREQUENCY_PERIOD_S, through the rule
(`flexmodel.frequencyrule`), fires the fast path's own trigger.

- **Faults.** A reading the feed cannot give (MeterError: no answer, a closed stream) or one
  outside FLEXGATE_FREQUENCY_MIN_HZ-MAX_HZ is a fault: logged when it starts and ends, shown
  in `GET /v1/fast/frequency`, and never fires nor renews (the caps in force end with their
  hold).
- **Safety.** In droop mode the droop's phase across the inter-area band
  (`flexmodel.droop.droop_report`) is checked at start with the feed path's delay (the sample
  period plus FLEXGATE_FREQUENCY_TRIGGER_DELAY_S) and refused beyond
  FLEXGATE_FREQUENCY_PHASE_BOUND_DEG: the gateway does not start.
- **Recorded.** The fast event's reason says the frequency feed fired it, the reading and when
  the frequency crossed; the agents' reports on an excursion's first trigger are timed from
  the reading that crossed (`flexgate_fast_crossing_to_enforced_seconds`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from flexmodel.droop import DroopRefusedError, DroopReport, droop_report
from flexmodel.frequencyrule import RuleState, fault, step
from gateway.clock import Clock
from gateway.errors import GatewayError, MeterError
from gateway.meter.frequency import FrequencySource
from gateway.services.fast import FastPath
from gateway.services.periodic import Every
from gateway.settingsgroups.fast import FastSettings

log = logging.getLogger("flexgate.gateway")


class FrequencyRefusedError(GatewayError):
    """The frequency trigger's settings put its droop beyond the phase bound."""


class FrequencyTrigger:
    def __init__(
        self,
        settings: FastSettings,
        clock: Clock,
        fast: FastPath,
        feed: FrequencySource | None,
    ) -> None:
        self.settings, self.clock, self.fast, self.feed = settings, clock, fast, feed
        self.rule = settings.frequency_rule
        self.state = RuleState()
        self.last_hz: float | None = None  #: the last plausible reading
        self.fault: str | None = None  #: why the last reading could not be acted on
        self.triggers = 0
        self.last_event_id: str | None = None
        self.crossing_at: str | None = None  #: the last excursion's crossing, ISO UTC
        self._counted_s: float | None = None  #: the crossing whose first trigger was sent
        self._every = Every(clock, settings.frequency_period_s, self.sample, "frequency not read")
        self.hz_gauge = Gauge(
            "flexgate_frequency_hz", "The frequency feed's last plausible reading.", registry=None
        )
        self.fault_gauge = Gauge(
            "flexgate_frequency_fault", "1 while the frequency feed is at fault.", registry=None
        )
        self.fired = Counter(
            "flexgate_frequency_triggers", "Fast triggers the frequency feed fired.", registry=None
        )

    def register(self, registry: CollectorRegistry) -> None:
        """The feed's reading, fault and triggers on the gateway's `/metrics` (for watching:
        Prometheus never fires anything)."""
        if self.enabled:
            for metric in (self.hz_gauge, self.fault_gauge, self.fired):
                registry.register(metric)

    @property
    def enabled(self) -> bool:
        return self.feed is not None and self.rule is not None and self.fast.enabled

    @property
    def delay_s(self) -> float:
        """The feed path's delay: a sample's period and the trigger path's [s]."""
        return self.settings.frequency_period_s + self.settings.frequency_trigger_delay_s

    def measured_trigger_delay_s(self) -> float | None:
        """The mean trigger-to-enforced time the agents reported since start (the fast path's
        histogram), to hold against FLEXGATE_FREQUENCY_TRIGGER_DELAY_S; None before any."""
        samples = [s for m in self.fast.latency.collect() for s in m.samples]
        total = {s.name.rpartition("_")[2]: s.value for s in samples if not s.labels}
        return total["sum"] / total["count"] if total.get("count") else None

    def droop(self) -> DroopReport | None:
        """The droop path's phase report (None outside droop mode); DroopRefusedError beyond
        the bound. Its gain: the deepest depth's planned reduction over the droop's span."""
        rule, settings = self.rule, self.settings
        if rule is None or rule.mode != "droop":
            return None
        assert settings.frequency_stiffness_hz_per_mw is not None  # the settings require it
        full_mw = self.fast.expected_kw.get(max(rule.depths_pct), 0.0) / 1000.0
        span_hz = rule.nominal_hz - rule.dead_band_hz - rule.full_hz
        return droop_report(
            self.delay_s,
            settings.frequency_stiffness_hz_per_mw,
            full_mw / span_hz,
            bound_deg=settings.frequency_phase_bound_deg,
        )

    def start(self) -> None:
        """Sampling starts; FrequencyRefusedError when the droop's phase is beyond the bound."""
        if not self.enabled:
            return
        try:
            self.droop()
        except DroopRefusedError as exc:
            raise FrequencyRefusedError(
                f"the frequency trigger is refused: {exc} (the delay is "
                f"FLEXGATE_FREQUENCY_PERIOD_S {self.settings.frequency_period_s:g} s + "
                f"FLEXGATE_FREQUENCY_TRIGGER_DELAY_S {self.settings.frequency_trigger_delay_s:g}"
                f" s; the bound FLEXGATE_FREQUENCY_PHASE_BOUND_DEG)"
            ) from exc
        self._every.start()

    async def stop(self) -> None:
        self._every.stop()
        if self.feed is not None:
            await self.feed.aclose()

    async def sample(self) -> None:
        """One reading through the rule; the fast trigger fired when it says so."""
        assert self.feed is not None
        assert self.rule is not None
        try:
            hz: float | None = await self.feed.read_hz()
            problem = fault(self.rule, hz)
        except MeterError as exc:
            hz, problem = None, str(exc)
        self._show(problem)
        reading = hz if problem is None else None
        self.last_hz = reading if reading is not None else self.last_hz
        self.fault_gauge.set(0 if problem is None else 1)
        if reading is not None:
            self.hz_gauge.set(reading)
        state, fire = step(self.rule, self.state, self.clock.monotonic(), reading)
        if state.crossing_s is not None and state.crossing_s != self.state.crossing_s:
            self.crossing_at = self.clock.now().isoformat()
        if fire is None:
            self.state = state
            return
        try:
            cause = f"the frequency feed read {fire.hz:.3f} Hz; it crossed at {self.crossing_at}"
            first = state.crossing_s is not None and state.crossing_s != self._counted_s
            answer = await self.fast.trigger(
                fire.depth_pct,
                fire.duration_s,
                cause=cause,
                since_s=state.crossing_s if first else None,
            )
        except GatewayError as exc:  # tried again at the next reading, the crossing kept
            log.warning("the frequency trigger could not fire: %s", exc)
            self.state = replace(self.state, crossing_s=state.crossing_s)
            return
        self.state = state
        self._counted_s = state.crossing_s
        self.triggers += 1
        self.fired.inc()
        self.last_event_id = answer["event_id"]

    def _show(self, problem: str | None) -> None:
        if problem != self.fault:
            if problem is None:
                log.info("the frequency feed reads again")
            else:
                log.warning("frequency feed fault, no trigger: %s", problem)
        self.fault = problem

    def doc(self) -> dict[str, Any]:
        """What `GET /v1/fast/frequency` shows."""
        try:
            report = self.droop()
            refused = None
        except DroopRefusedError as exc:
            report, refused = None, str(exc)
        return {
            "enabled": self.enabled,
            "source": self.feed.source if self.feed is not None else None,
            "mode": self.rule.mode if self.rule is not None else None,
            "period_s": self.settings.frequency_period_s,
            "hz": self.last_hz,
            "fault": self.fault,
            "depth_pct": self.state.depth_pct,
            "crossing_at": self.crossing_at if self.state.crossing_s is not None else None,
            "triggers": self.triggers,
            "last_event_id": self.last_event_id,
            "delay_s": self.delay_s,
            "measured_trigger_delay_s": self.measured_trigger_delay_s(),
            "droop": dataclasses.asdict(report) if report is not None else None,
            "droop_refused": refused,
        }
