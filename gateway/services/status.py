"""The gateway's own state for operators: `/health` and the Prometheus `/metrics` text."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import OperationalError

from gateway.services.events import Events
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings


class Status:
    def __init__(
        self,
        settings: GatewaySettings,
        fleet: Fleet,
        book: JobBook,
        targets: Targets,
        events: Events,
    ) -> None:
        self.settings, self.fleet, self.book = settings, fleet, book
        self.targets, self.events = targets, events

    def health(self) -> dict[str, Any]:
        """`status` ok when the store answers, unhealthy (with the reason) when it does not."""
        try:
            self.events.active()
            store = "ok"
        except OperationalError as exc:
            store = f"unreachable: {type(exc.orig).__name__}"
        grid = self.events.grid
        return {
            "status": "ok" if store == "ok" else "unhealthy",
            "store": store,
            "scheduler": self.events.scheduler.running,
            "agents_configured": len(self.settings.agent_urls),
            "agents_known": len(self.fleet.nodes),
            "ven": grid.state if grid is not None else None,
        }

    def metrics(self) -> str:
        live = self.events.live()
        gauges = [
            ("flexgate_agents_known", "gauge", len(self.fleet.nodes)),
            ("flexgate_events_active", "gauge", sum(e.status == "active" for e in live)),
            ("flexgate_events_pending", "gauge", sum(e.status == "pending" for e in live)),
            ("flexgate_fan_outs_total", "counter", self.targets.fan_outs),
            ("flexgate_nodes_unreachable", "gauge", len(self.targets.down)),
            ("flexgate_generation", "gauge", self.targets.generation or 0),
            ("flexgate_jobs", "gauge", len(self.book.mix().jobs)),
        ]
        lines = [f"# TYPE {name} {kind}\n{name} {value}" for name, kind, value in gauges]
        return "\n".join(lines) + "\n"
