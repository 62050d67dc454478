"""The gateway's own state for operators: `/health` and the Prometheus `/metrics` text."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy.exc import OperationalError

from gateway.services.configuration import effective_configuration
from gateway.services.events import Events
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.jobfeed import JobFeed
from gateway.services.oscillation import OscillationWatch
from gateway.services.site import SitePower
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings


class Status:
    def __init__(
        self,
        settings: GatewaySettings,
        fleet: Fleet,
        book: JobBook,
        power: SitePower,
        targets: Targets,
        events: Events,
        oscillation: OscillationWatch,
        feed: JobFeed | None = None,
    ) -> None:
        self.settings, self.fleet, self.book, self.power = settings, fleet, book, power
        self.targets, self.events, self.feed = targets, events, feed
        self.oscillation = oscillation
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def health(self) -> dict[str, Any]:
        """`status` ok when the store answers, unhealthy (with the reason) when it does not;
        degraded, with the reasons, when the gateway works on less than it should (a meter
        that faults: the site loop holds and figures are estimated; no agent reporting). A
        liveness answer still: service managers must not restart a gateway holding events for
        a dead agent or meter."""
        try:
            self.events.store.ping()
            store = "ok"
        except OperationalError as exc:
            store = f"unreachable: {type(exc.orig).__name__}"
        grid = self.events.grid
        fault = self.power.meter_fault
        degraded = [f"meter {self.power.source}: {fault}"] if fault else []
        last = self.fleet.last
        if self.settings.agent_urls and last is not None and not last:
            degraded.append(
                f"no agent reports (of {len(self.settings.agent_urls)} configured): the site's "
                "figures are empty and nothing can be capped"
            )
        degraded += self._job_source_reasons()
        simulated = self.fleet.simulated_refusal()
        if simulated:
            degraded.append(f"{simulated}; events are refused meanwhile")
        status = "unhealthy" if store != "ok" else "degraded" if degraded else "ok"
        return {
            "status": status,
            "degraded": degraded,
            "meter": {"source": self.power.source, "fault": fault},
            "store": store,
            "scheduler": self.events.scheduler.running,
            "agents_configured": len(self.settings.agent_urls),
            "agents_known": len(self.fleet.nodes),
            "ven": grid.state if grid is not None else None,
            "job_source": None if self.feed is None else self.feed.state(),
            "backends": self._backend_counts(),
            "configuration": effective_configuration(self.settings),
        }

    def _backend_counts(self) -> dict[str, int]:
        """How many known nodes run each GPU backend (`nvml`, `sim`)."""
        counts: dict[str, int] = {}
        for kind in self.fleet.backends.values():
            counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items()))

    def _job_source_reasons(self) -> list[str]:
        feed = self.feed
        if feed is None:
            return []
        out = []
        if feed.fault:
            out.append(f"job source {feed.kind}: {feed.fault}; planning on its last good view")
        if feed.stale:
            out.append(
                f"job source {feed.kind}: no good answer for {feed.age_s:.0f} s "
                f"(FLEXGATE_JOB_SOURCE_STALE_S {self.settings.job_source_stale_s:g} s): the job "
                "mix is stale"
            )
        if feed.problems:
            out.append(
                f"job source {feed.kind}: {len(feed.problems)} job(s) left out, first "
                f"{feed.problems[0]}"
            )
        return out

    def metrics(self) -> str:
        """`/metrics`: the Prometheus text exposition of `collect` (`prometheus_client`: HELP
        and TYPE lines, label values escaped)."""
        return generate_latest(self.registry).decode()

    def collect(self) -> Iterator[Metric]:
        """The gateway's metric families, read from the services when scraped."""
        live = self.events.live()
        yield _gauge("flexgate_agents_known", "Agents that have answered.", len(self.fleet.nodes))
        active = sum(e.status == "active" for e in live)
        yield _gauge("flexgate_events_active", "Events active now.", active)
        pending = sum(e.status == "pending" for e in live)
        yield _gauge("flexgate_events_pending", "Events accepted, not started.", pending)
        targets = self.targets
        yield CounterMetricFamily(
            "flexgate_fan_outs", "Desired states sent to every node.", value=targets.fan_outs
        )
        yield CounterMetricFamily(
            "flexgate_fan_outs_finished",
            "Fan-outs that ended, their answers recorded.",
            value=targets.fan_outs_finished,
        )
        unreachable = len(self.fleet.unreachable)
        yield _gauge("flexgate_nodes_unreachable", "Nodes whose last command failed.", unreachable)
        generation = targets.generation or 0
        yield _gauge("flexgate_generation", "Generation of the plan held.", generation)
        yield _gauge("flexgate_jobs", "Jobs in the mix.", len(self.book.mix().jobs))
        backends = GaugeMetricFamily(
            "flexgate_nodes_by_backend", "Nodes by GPU backend.", labels=["backend"]
        )
        for kind, count in self._backend_counts().items():
            backends.add_metric([kind], count)
        yield backends
        yield from self._meter_families()
        yield from self._job_source_families()
        yield from self._oscillation_families()

    def _meter_families(self) -> Iterator[Metric]:
        feed = self.power.feed
        if feed is None:
            return
        yield CounterMetricFamily(
            "flexgate_meter_readings", "Meter readings believed.", value=feed.readings
        )
        for name, text, counts in (
            ("flexgate_meter_rejected", "Meter readings rejected, by reason.", feed.rejected),
            ("flexgate_meter_suspected", "Meter readings suspected, by reason.", feed.suspected),
        ):
            family = CounterMetricFamily(name, text, labels=["reason"])
            for reason, count in counts.items():
                family.add_metric([reason], count)
            yield family
        fault = int(self.power.meter_fault is not None)
        yield _gauge("flexgate_meter_fault", "1 while the meter faults.", fault)
        reading = feed.state()["facility_power_kw"]
        yield _gauge(
            "flexgate_meter_power_kw",
            "The meter's last believed reading [kW] (NaN: none).",
            math.nan if reading is None else reading,
        )

    def _job_source_families(self) -> Iterator[Metric]:
        feed = self.feed
        if feed is None:
            return
        yield CounterMetricFamily(
            "flexgate_job_source_reads", "Reads of the job source.", value=feed.reads
        )
        yield CounterMetricFamily(
            "flexgate_job_source_failures", "Failed reads of the job source.", value=feed.failures
        )
        fault = int(feed.fault is not None)
        yield _gauge("flexgate_job_source_fault", "1 while the job source faults.", fault)
        yield _gauge("flexgate_job_source_stale", "1 while the job mix is stale.", int(feed.stale))
        yield _gauge(
            "flexgate_job_source_age_seconds", "Age of the last good read [s].", feed.age_s
        )
        yield _gauge(
            "flexgate_job_source_jobs_left_out",
            "Jobs of the source left out of the mix.",
            len(feed.problems),
        )

    def _oscillation_families(self) -> Iterator[Metric]:
        """The last oscillation check (each reconciliation): the in-band RMS per source (NaN
        where the band is out of its reach) and the alarm."""
        last = self.oscillation.last
        if last is None:
            return
        rms = GaugeMetricFamily(
            "flexgate_oscillation_rms_kw",
            "The site power's RMS within the oscillation band, per source [kW] (NaN: out of "
            "its reach).",
            labels=["source"],
        )
        for name in ("meter", "agents"):
            value = last[name]["rms_kw"]
            rms.add_metric([name], math.nan if value is None else value)
        yield rms
        alarm = int(last["alarm"])
        yield _gauge(
            "flexgate_oscillation_alarm", "1 while the oscillation is over its limit.", alarm
        )


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)
