"""Persistence functions, keyword-only, one small function per question (store layer), one
module per entity; callers use them as `repo.<function>`."""

from __future__ import annotations

from gateway.store.repo.auditlog import audit, latest_audit
from gateway.store.repo.calibrations import add_calibration, latest_calibration
from gateway.store.repo.curves import (
    add_job_curve,
    latest_job_curves,
    load_pfi_records,
    put_pfi_records,
)
from gateway.store.repo.delivery import (
    add_delivery_sample,
    add_limit_interval,
    deliveries,
    latest_deliveries,
)
from gateway.store.repo.events import (
    add_event,
    event_rows,
    get_event,
    link_plan,
    list_events,
    replace_event,
)
from gateway.store.repo.jobs import delete_job, load_jobs, put_job, replace_jobs
from gateway.store.repo.meter import (
    add_meter_samples,
    first_meter_sample_ms,
    mark_meter_fault,
    meter_intervals,
    meter_intervals_closed,
    meter_sample_tuples,
    meter_samples,
    prune_meter_history,
    replace_meter_intervals,
)
from gateway.store.repo.nodes import list_nodes, saw_node
from gateway.store.repo.plans import (
    add_commands,
    add_plan,
    get_plan,
    latest_commands,
    newest_plan,
    next_generation,
)

__all__ = [
    "add_calibration",
    "add_commands",
    "add_delivery_sample",
    "add_event",
    "add_job_curve",
    "add_limit_interval",
    "add_meter_samples",
    "add_plan",
    "audit",
    "delete_job",
    "deliveries",
    "event_rows",
    "first_meter_sample_ms",
    "get_event",
    "get_plan",
    "latest_audit",
    "latest_calibration",
    "latest_commands",
    "latest_deliveries",
    "latest_job_curves",
    "link_plan",
    "list_events",
    "list_nodes",
    "load_jobs",
    "load_pfi_records",
    "mark_meter_fault",
    "meter_intervals",
    "meter_intervals_closed",
    "meter_sample_tuples",
    "meter_samples",
    "newest_plan",
    "next_generation",
    "prune_meter_history",
    "put_job",
    "put_pfi_records",
    "replace_event",
    "replace_jobs",
    "replace_meter_intervals",
    "saw_node",
]
