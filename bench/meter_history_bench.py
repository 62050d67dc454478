"""Benchmark: the meter history's disk (bench/results/meter_history.json).

Writes `--hours` (default a day) of 1 s samples through the gateway's `MeterHistory` on a
stepped clock, written every `--flush-s` (the default flush period) with the intervals rolled
up as they close, as a site with a 1 s meter would, into each store: a fresh SQLite file, and
PostgreSQL at `--postgresql` (a schema of the benchmark's own, dropped after; `--postgresql ""`
skips it). Reports each store's growth per day (SQLite: the file after a WAL checkpoint;
PostgreSQL: the tables with their indexes and TOAST, `pg_total_relation_size`, after a VACUUM;
the empty store's size taken off) and how long the writes took. Retention is left at its
defaults, so nothing is pruned within a day.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from gateway.clock import SteppedClock
from gateway.services.meterhistory import MeterHistory
from gateway.settings import GatewaySettings
from gateway.store.db import Store

RESULTS = Path(__file__).resolve().parent / "results"
DAY_S = 86_400
TABLES = ("meter_samples", "meter_intervals")
POSTGRESQL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
#: the schema the PostgreSQL run writes in, created and dropped by it
SCHEMA = "meter_history_bench"


def sqlite_bytes(store: Store, path: Path) -> int:
    with store.engine.connect() as connection:
        connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    return path.stat().st_size


def postgresql_bytes(store: Store) -> int:
    """The history's tables with their indexes and TOAST, after a VACUUM (dead rows of
    rolled-up intervals replaced are space PostgreSQL reuses)."""
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        total = 0
        for table in TABLES:
            connection.execute(text(f"VACUUM {table}"))
            size = f"select pg_total_relation_size('{SCHEMA}.{table}')"
            total += connection.execute(text(size)).scalar_one()
    return total


def measure_store(
    url: str, size_of: Callable[[Store], int], *, hours: float, flush_s: float
) -> dict[str, Any]:
    """Write `hours` of 1 s samples (a noisy load near 2 MW, a share estimated) into the
    store at `url` and measure its growth with `size_of`."""
    settings = GatewaySettings(
        database_url=url,
        lab=True,  # no secrets: nothing is served
        meter_period_s=1.0,
        meter_history_flush_s=flush_s,
    )
    store = Store(settings.database_url)
    clock = SteppedClock(datetime(2026, 3, 1, tzinfo=UTC))
    history = MeterHistory(settings, store, clock)
    empty = size_of(store)
    draw = random.Random(1)
    seconds = round(hours * 3600)
    flushes, write_s = 0, 0.0

    async def run() -> None:
        nonlocal flushes, write_s
        for second in range(seconds):
            kw = 2000.0 + draw.gauss(0.0, 15.0)
            history.record(at=clock.now(), kw=kw, estimated=draw.random() < 0.01, fault=False)
            clock.step(1.0)
            if (second + 1) % flush_s == 0:
                began = time.perf_counter()
                await history.flush()
                write_s += time.perf_counter() - began
                flushes += 1
        await history.flush()

    asyncio.run(run())
    size = size_of(store) - empty
    with store.engine.connect() as connection:
        counts = {
            table: connection.execute(text(f"select count(*) from {table}")).scalar_one()
            for table in TABLES
        }
    store.close()
    return {
        "hours": hours,
        "sample_period_s": 1.0,
        "flush_s": flush_s,
        "samples": counts["meter_samples"],
        "intervals": counts["meter_intervals"],
        "bytes": size,
        "bytes_per_sample": size / max(counts["meter_samples"], 1),
        "bytes_per_day": size * DAY_S / seconds,
        "flushes": flushes,
        "mean_flush_ms": 1000 * write_s / max(flushes, 1),
    }


def measure(folder: Path, *, hours: float = 24.0, flush_s: float = 10.0) -> dict[str, Any]:
    """The SQLite figures, in a fresh file in `folder`."""
    path = folder / "history.db"
    return measure_store(
        f"sqlite:///{path}",
        lambda store: sqlite_bytes(store, path),
        hours=hours,
        flush_s=flush_s,
    )


def measure_postgresql(url: str, *, hours: float = 24.0, flush_s: float = 10.0) -> dict[str, Any]:
    """The PostgreSQL figures, in the schema `SCHEMA` of the database at `url`, made fresh
    and dropped after."""
    admin = create_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f"drop schema if exists {SCHEMA} cascade; create schema {SCHEMA}"))
    try:
        separator = "&" if "?" in url else "?"
        scoped = f"{url}{separator}options=-csearch_path%3D{SCHEMA}"
        return measure_store(scoped, postgresql_bytes, hours=hours, flush_s=flush_s)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f"drop schema if exists {SCHEMA} cascade"))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--flush-s", type=float, default=10.0)
    parser.add_argument("--postgresql", default=POSTGRESQL, help='a database URL; "" skips it')
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = measure(Path(folder), hours=options.hours, flush_s=options.flush_s)
    if options.postgresql:
        result["postgresql"] = measure_postgresql(
            options.postgresql, hours=options.hours, flush_s=options.flush_s
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "meter_history.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
