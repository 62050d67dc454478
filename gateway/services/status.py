"""The gateway's own state for operators: `/health` and the Prometheus `/metrics` text."""

from __future__ import annotations

from typing import Any

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
        live = self.events.live()
        gauges = [
            ("flexgate_agents_known", "gauge", len(self.fleet.nodes)),
            ("flexgate_events_active", "gauge", sum(e.status == "active" for e in live)),
            ("flexgate_events_pending", "gauge", sum(e.status == "pending" for e in live)),
            ("flexgate_fan_outs_total", "counter", self.targets.fan_outs),
            ("flexgate_fan_outs_finished_total", "counter", self.targets.fan_outs_finished),
            ("flexgate_nodes_unreachable", "gauge", len(self.fleet.unreachable)),
            ("flexgate_generation", "gauge", self.targets.generation or 0),
            ("flexgate_jobs", "gauge", len(self.book.mix().jobs)),
        ]
        lines = [f"# TYPE {name} {kind}\n{name} {value}" for name, kind, value in gauges]
        lines += ["# TYPE flexgate_nodes_by_backend gauge"] + [
            f'flexgate_nodes_by_backend{{backend="{kind}"}} {count}'
            for kind, count in self._backend_counts().items()
        ]
        lines += self._meter_lines() + self._job_source_lines() + self._oscillation_lines()
        return "\n".join(lines) + "\n"

    def _oscillation_lines(self) -> list[str]:
        """The last oscillation check (each reconciliation): the in-band RMS per source (NaN
        where the band is out of its reach) and the alarm."""
        last = self.oscillation.last
        if last is None:
            return []
        rms = [
            f'flexgate_oscillation_rms_kw{{source="{name}"}} '
            f"{'NaN' if last[name]['rms_kw'] is None else round(last[name]['rms_kw'], 6)}"
            for name in ("meter", "agents")
        ]
        return [
            "# TYPE flexgate_oscillation_rms_kw gauge",
            *rms,
            f"# TYPE flexgate_oscillation_alarm gauge\nflexgate_oscillation_alarm "
            f"{int(last['alarm'])}",
        ]

    def _job_source_lines(self) -> list[str]:
        feed = self.feed
        if feed is None:
            return []
        gauges = [
            ("flexgate_job_source_reads_total", "counter", feed.reads),
            ("flexgate_job_source_failures_total", "counter", feed.failures),
            ("flexgate_job_source_fault", "gauge", int(feed.fault is not None)),
            ("flexgate_job_source_stale", "gauge", int(feed.stale)),
            ("flexgate_job_source_age_seconds", "gauge", round(feed.age_s, 3)),
            ("flexgate_job_source_jobs_left_out", "gauge", len(feed.problems)),
        ]
        return [f"# TYPE {name} {kind}\n{name} {value}" for name, kind, value in gauges]

    def _meter_lines(self) -> list[str]:
        feed = self.power.feed
        if feed is None:
            return []
        rejected = [
            f'flexgate_meter_rejected_total{{reason="{reason}"}} {count}'
            for reason, count in feed.rejected.items()
        ]
        suspected = [
            f'flexgate_meter_suspected_total{{reason="{reason}"}} {count}'
            for reason, count in feed.suspected.items()
        ]
        reading = feed.state()["facility_power_kw"]
        return [
            f"# TYPE flexgate_meter_readings_total counter\nflexgate_meter_readings_total "
            f"{feed.readings}",
            "# TYPE flexgate_meter_rejected_total counter",
            *rejected,
            "# TYPE flexgate_meter_suspected_total counter",
            *suspected,
            f"# TYPE flexgate_meter_fault gauge\nflexgate_meter_fault "
            f"{int(self.power.meter_fault is not None)}",
            f"# TYPE flexgate_meter_power_kw gauge\nflexgate_meter_power_kw "
            f"{reading if reading is not None else 'NaN'}",
        ]
