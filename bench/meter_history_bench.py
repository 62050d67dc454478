"""Benchmark: the meter history's disk (bench/results/meter_history.json).

Writes `--hours` (default a day) of 1 s samples through the gateway's `MeterHistory` into a
fresh SQLite file, on a stepped clock, written every `--flush-s` (the default flush period)
with the intervals rolled up as they close, as a site with a 1 s meter would; then reports the
file's growth per day (after a WAL checkpoint, the empty store's size taken off) and how long
the writes took. Retention is left at its defaults, so nothing is pruned within a day.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from gateway.clock import SteppedClock
from gateway.services.meterhistory import MeterHistory
from gateway.settings import GatewaySettings
from gateway.store.db import Store

RESULTS = Path(__file__).resolve().parent / "results"
DAY_S = 86_400


def file_bytes(store: Store, path: Path) -> int:
    with store.engine.connect() as connection:
        connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    return path.stat().st_size


def measure(folder: Path, *, hours: float = 24.0, flush_s: float = 10.0) -> dict[str, Any]:
    """Write `hours` of 1 s samples (a noisy load near 2 MW, a share estimated) and measure."""
    path = folder / "history.db"
    settings = GatewaySettings(
        database_url=f"sqlite:///{path}",
        lab=True,  # no secrets: nothing is served
        meter_period_s=1.0,
        meter_history_flush_s=flush_s,
    )
    store = Store(settings.database_url)
    clock = SteppedClock(datetime(2026, 3, 1, tzinfo=UTC))
    history = MeterHistory(settings, store, clock)
    empty = file_bytes(store, path)
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
    size = file_bytes(store, path) - empty
    with store.engine.connect() as connection:
        counts = {
            table: connection.execute(text(f"select count(*) from {table}")).scalar_one()
            for table in ("meter_samples", "meter_intervals")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--flush-s", type=float, default=10.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = measure(Path(folder), hours=options.hours, flush_s=options.flush_s)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "meter_history.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
