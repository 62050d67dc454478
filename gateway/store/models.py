"""The gateway's tables (SQLModel): the same code on SQLite and PostgreSQL.

Documents whose shape belongs to the model (a job, an allocation, an agent's answer) are kept
as JSON columns; what the gateway queries on (status, times, ids) are columns of their own.
Times are timezone-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Integer
from sqlmodel import Field, SQLModel

#: Bump when a table changes, with its upgrade in `gateway.store.db.UPGRADES`; an older
#: database is upgraded when opened, a newer one is refused with a clear error.
SCHEMA_VERSION = 7


def as_utc(when: datetime) -> datetime:
    """SQLite hands back naive datetimes; everything stored is UTC."""
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def iso(when: datetime | None) -> str | None:
    """A stored time as the API shows it: ISO 8601, UTC."""
    return None if when is None else as_utc(when).isoformat()


def _when(**kwargs: Any) -> Any:
    return Field(sa_column=Column(DateTime(timezone=True), **kwargs))


def epoch_ms(when: datetime) -> int:
    """A UTC instant as the meter history keys it: milliseconds since the Unix epoch."""
    return round(as_utc(when).timestamp() * 1000)


def from_epoch_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _epoch_key() -> Any:
    # BIGINT on PostgreSQL; on SQLite exactly INTEGER, so the key is the table's rowid (no
    # second b-tree for an index): a day of 1 s samples is half the size.
    kind = BigInteger().with_variant(Integer(), "sqlite")
    return Field(sa_column=Column(kind, primary_key=True, autoincrement=False))


class SchemaVersion(SQLModel, table=True):
    __tablename__ = "schema_version"
    id: int = Field(default=1, primary_key=True)
    version: int


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    id: str = Field(primary_key=True)
    doc: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    position: int = 0  #: keeps the mix in the order it was given


class EventRow(SQLModel, table=True):
    __tablename__ = "events"
    id: str = Field(primary_key=True)
    source: str  #: manual, openadr or fast
    status: str  #: pending, active, completed, cancelled, opted_out, failed
    start: datetime = _when(nullable=False)
    end: datetime = _when(nullable=False)
    reduction_kw: float  #: the largest of its intervals'
    #: [{"start", "end", "reduction_kw", "level_kw"?, "baseline_share"?, "fraction"?}], times
    #: in ISO UTC: the event's schedule (`gateway.services.grid.Interval`)
    intervals: list[dict[str, Any]] = Field(sa_column=Column(JSON, nullable=False))
    baseline_kw: float | None = None  #: the site's baseline facility power when it began
    feasible: bool | None = None  #: judged when it was accepted, until a plan judges it
    opt: str = "in"
    reason: str | None = None
    plan_id: str | None = None
    external_id: str | None = Field(default=None, index=True)  #: the VTN's event id
    modification: int = 0
    test: bool = False  #: an OpenADR test event: answered, never acted on
    created_at: datetime = _when(nullable=False)
    #: what the utility would count, as the opt-in decision read it (FLEXGATE_OPT_IN_BASELINE;
    #: `gateway.services.counted`; schema version 7)
    counted: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class PlanRow(SQLModel, table=True):
    __tablename__ = "plans"
    id: str = Field(primary_key=True)
    event_id: str | None = Field(default=None, index=True)
    generation: int
    doc: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = _when(nullable=False)


class CommandRow(SQLModel, table=True):
    __tablename__ = "commands"
    id: int | None = Field(default=None, primary_key=True)
    plan_id: str = Field(index=True)
    node: str
    generation: int
    status: str  #: acked, failed
    attempts: int
    sent_at: datetime = _when(nullable=False)
    acked_at: datetime | None = _when(nullable=True)
    delay_s: float | None = None
    error: str | None = None
    answer: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class Counter(SQLModel, table=True):
    __tablename__ = "counters"
    name: str = Field(primary_key=True)
    value: int


class AuditRow(SQLModel, table=True):
    __tablename__ = "audit"
    id: int | None = Field(default=None, primary_key=True)
    at: datetime = _when(nullable=False)
    actor: str
    action: str
    detail: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))


class NodeRow(SQLModel, table=True):
    __tablename__ = "nodes"
    node_id: str = Field(primary_key=True)
    url: str
    last_seen: datetime = _when(nullable=False)


class CalibrationRow(SQLModel, table=True):
    """One fit of the overhead factor on the meter (flexmodel.calibration); the latest counts."""

    __tablename__ = "calibrations"
    id: int | None = Field(default=None, primary_key=True)
    at: datetime = _when(nullable=False, index=True)
    meter_source: str  #: the meter the fit read
    k: float
    k_stderr: float
    static_kw: float
    static_stderr_kw: float
    lag_s: float  #: when the meter shows half of a step (dead time + tau ln 2) [s]
    points: int
    #: the meter path (schema version 5; None in older rows): flexmodel.meterpath
    dead_s: float | None = None
    dead_stderr_s: float | None = None
    tau_s: float | None = None
    tau_stderr_s: float | None = None
    averaging_s: float | None = None
    path_source: str | None = None


class DeliveryRow(SQLModel, table=True):
    """What an event shed at the meter, summed over the samples the site loop read during it:
    the facility power the site would draw without the event (the loop's reference: the meter
    before the event, moved by the model as the jobs changed) less the meter's reading.
    Divided by `seconds` they are time averages (schema version 4)."""

    __tablename__ = "deliveries"
    event_id: str = Field(primary_key=True)
    meter_source: str
    first_at: datetime = _when(nullable=False)
    last_at: datetime = _when(nullable=False)
    samples: int
    seconds: float  #: the time the meter was read during the event [s]
    requested_kws: float  #: the reduction asked for, integrated over that time [kW s]
    delivered_kws: float  #: the reduction seen at the meter, integrated over that time [kW s]
    #: a ceiling's compliance (schema version 5): the limit, the averaging intervals judged
    #: after the ramp allowance, how many averaged above it, and the highest average [kW]
    limit_kw: float | None = None
    limit_intervals: int | None = None
    limit_intervals_above: int | None = None
    limit_worst_kw: float | None = None


class JobCurveRow(SQLModel, table=True):
    """One fit of a job's measured curve (gateway.services.curves); the latest counts.

    `points` are the agents' points per cap level (`agents.protocol.CapPoint`, with the
    throughput in the job's units and where each came from); `fit` is flexmodel.sweeps' reading
    of them: the PFI with its standard error on the measured grid, the monotone curve, the
    points set aside."""

    __tablename__ = "job_curves"
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)
    at: datetime = _when(nullable=False, index=True)
    source: str  #: measured (the agents' points); the job's doc holds declared ones
    points: list[dict[str, Any]] = Field(sa_column=Column(JSON, nullable=False))
    fit: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))


class PfiRecordRow(SQLModel, table=True):
    """The site's measured PFI records, the predictor's own data (gateway.services.predictions):
    one row per job, its DRAM copy product over the uncapped run, its measured PFI (Eq. 1 on a
    sweep, on the grid `grid_w`), its model family (the predictor's group), where the PFI came
    from (`source`: `sweep` for a job-mix sweep, or the measuring service's name), when. A job
    measured again replaces its row."""

    __tablename__ = "pfi_records"
    job_id: str = Field(primary_key=True)
    feature: float  #: DRAM copy product, uncapped [0-1]
    pfi: float  #: measured
    model_family: str  #: the predictor's group
    source: str  #: `sweep`, or the measuring service's name
    grid_w: list[float] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    at: datetime = _when(nullable=False)


#: The meter history's interval lengths [s]: 1, 5, 15 and 30 minutes.
INTERVAL_LENGTHS_S = (60, 300, 900, 1800)


class MeterSampleRow(SQLModel, table=True):
    """One sample of the site's facility power, as the site took it every meter period
    (schema version 6; `gateway.services.meterhistory`): the meter's reading, or the estimate
    where there is no meter or it was faulted. Kept `FLEXGATE_METER_HISTORY_RAW_KEEP_S`.
    Keyed by time in UTC milliseconds rather than a datetime column, for the bytes per day."""

    __tablename__ = "meter_samples"
    at_ms: int = _epoch_key()  #: when the site took it, UTC [ms since the epoch]
    kw: float  #: facility power [kW]
    estimated: bool  #: the model's estimate, not a meter's reading
    fault: bool  #: taken while the meter was faulted or suspected (its value: the estimate)


class MeterIntervalRow(SQLModel, table=True):
    """The samples of one closed interval of `length_s` (`INTERVAL_LENGTHS_S`), aligned on
    UTC (schema version 6). Only intervals with a sample are stored: a missing one is a gap."""

    __tablename__ = "meter_intervals"
    length_s: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    start_ms: int = Field(
        sa_column=Column(BigInteger(), primary_key=True, autoincrement=False)
    )  #: UTC [ms since the epoch]
    mean_kw: float  #: the mean of its samples [kW]
    samples: int
    coverage: float  #: samples over those the meter period gives the interval, at most 1
    gap: bool  #: more than one sample of the period missing
    estimated_share: float  #: the share of its samples estimated or faulted
    estimated: bool  #: any sample estimated or faulted
    fault: bool  #: any sample taken while the meter was faulted or suspected


@dataclass(frozen=True)
class MeterInterval:
    """An interval of the meter history as a reader sees it; a gap has no mean."""

    start: datetime
    end: datetime
    mean_kw: float | None  #: [kW]
    samples: int
    coverage: float
    gap: bool
    estimated_share: float
    estimated: bool
    fault: bool


@dataclass(frozen=True)
class MeterSample:
    at: datetime
    kw: float  #: [kW]
    estimated: bool
    fault: bool
