"""The agent's `GET /metrics` (docs/agents.md): a node's GPUs under the DCGM exporter's names
where DCGM has the quantity, so dashboards made for it read them unchanged, and its
controller's state as `flexgate_agent_*`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agents.backend import GpuBackend
from agents.caps import CapController
from agents.errors import AgentError
from agents.telemetry import Sampler

#: The DCGM exporter's fields flexgate has: (name, type, help, reading of (backend, index)).
DCGM_FIELDS: tuple[tuple[str, str, str, Callable[[GpuBackend, int], float | None]], ...] = (
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda b, i: b.power_w(i)),
    (
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Enforced power limit (in W).",
        lambda b, i: b.enforced_limit_w(i),
    ),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN",
        "gauge",
        "Minimum power management limit (in W).",
        lambda b, i: b.constraints(i).min_w,
    ),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
        "gauge",
        "Maximum power management limit (in W).",
        lambda b, i: b.constraints(i).max_w,
    ),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
        "gauge",
        "Default power management limit (in W).",
        lambda b, i: b.constraints(i).default_w,
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda b, i: None if (u := b.memory_utilisation(i)) is None else u * 100.0,
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda b, i: None if (j := b.energy_j(i)) is None else j * 1000.0,
    ),
)


def prometheus_text(
    node_id: str, backend: GpuBackend, controller: CapController, sampler: Sampler
) -> str:
    """Prometheus text (`prometheus_client`'s exposition: HELP and TYPE lines, label values
    escaped): DCGM exporter names where DCGM has the quantity, `flexgate_` otherwise."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_NodeMetrics(node_id, backend, controller, sampler))
    return generate_latest(registry).decode()


class _NodeMetrics:
    """A node's metric families, read from its GPUs and controller when scraped."""

    def __init__(
        self, node_id: str, backend: GpuBackend, controller: CapController, sampler: Sampler
    ) -> None:
        self.node_id, self.backend = node_id, backend
        self.controller, self.sampler = controller, sampler

    def collect(self) -> Iterator[Metric]:
        backend = self.backend
        labels: dict[int, list[str]] = {}
        for index in range(backend.count()):
            try:
                uuid, _ = backend.identity(index)
            except AgentError:
                continue
            labels[index] = [str(index), uuid, self.node_id]
        for name, kind, text, read in DCGM_FIELDS:
            # dcgm-exporter's names, a counter's included (its energy has no `_total`), so
            # its type is said only for gauges: the text format types a counter by that suffix.
            family = Metric(name, text, "gauge" if kind == "gauge" else "unknown")
            for index, label in labels.items():
                try:
                    value = read(backend, index)
                except AgentError:
                    continue
                if value is not None:
                    family.add_sample(name, dict(zip(DCGM_LABELS, label, strict=True)), value)
            yield family
        control = self.controller
        generation = -1 if control.generation is None else control.generation
        yield GaugeMetricFamily(
            "flexgate_agent_generation", "Generation of the last accepted cap command.", generation
        )
        yield GaugeMetricFamily(
            "flexgate_agent_lease_remaining_seconds",
            "Time left on the cap lease.",
            control.lease_remaining_s() or 0.0,
        )
        yield GaugeMetricFamily(
            "flexgate_agent_saved_originals",
            "GPUs whose original limit is saved (changed).",
            len(control.originals.saved()),
        )
        yield CounterMetricFamily(
            "flexgate_agent_power_read_errors",
            "Failed power readings.",
            self.sampler.read_errors,
        )
        delays = control.delay_stats()
        summary = Metric(
            "flexgate_agent_actuation_delay_seconds",
            "Request to enforced limit, per GPU.",
            "summary",
        )
        for quantile, value in (("0.5", delays.p50_s), ("0.99", delays.p99_s)):
            if value is not None:
                summary.add_sample(summary.name, {"quantile": quantile}, value)
        summary.add_sample(f"{summary.name}_count", {}, delays.count)
        yield summary


#: dcgm-exporter's labels, in its order.
DCGM_LABELS = ("gpu", "UUID", "Hostname")
