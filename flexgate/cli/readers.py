"""What the `flexgate` commands read: job mixes, sweeps and power traces, from files.

A file that cannot be read, or does not hold what it should, is a `BadInputError` naming the
file (and the row or field): the command exits 2 with that one line. Job mixes go through
flexmodel's one reader (`flexmodel.jobmix`), as the agent's and the gateway's do.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import statistics
from pathlib import Path
from typing import Any

from flexmodel.errors import InvalidJobError
from flexmodel.jobmix import check_gpu_power_w, parse_job_mix_json, parse_json
from flexmodel.jobs import JobMix


class BadInputError(Exception):
    """Input the user can fix: exit 2 with the message."""


def read_text(path: Path) -> str:
    """The file as text; a UTF-8 byte-order mark (spreadsheets and Windows editors write one)
    is dropped, so it cannot make a header that looks right fail to match."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{path}: cannot read: {exc}") from None


def read_json(path: Path) -> Any:
    """A strict JSON document (no NaN or Infinity) from a file."""
    return parse_json(read_text(path), source=str(path))


def read_job_mix(path: Path) -> JobMix:
    return parse_job_mix_json(read_text(path), source=str(path))


def read_sweep(path: Path) -> list[tuple[float, float, float]]:
    """A sweep from CSV (`cap_w,power_w,throughput`) or JSON (`{"points": [...]}`)."""
    if path.suffix.lower() == ".json":
        doc = read_json(path)
        if (
            not isinstance(doc, dict)
            or set(doc) != {"points"}
            or not isinstance(doc["points"], list)
        ):
            raise BadInputError(
                f'{path}: expected {{"points": [{{"cap_w", "power_w", "throughput"}}, ...]}}'
            )
        rows = doc["points"]
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or set(row) != {"cap_w", "power_w", "throughput"}:
                raise BadInputError(
                    f"{path}: points[{i}] must have exactly cap_w, power_w, throughput"
                )
        return [_point(row, f"{path}: points[{i}]") for i, row in enumerate(rows)]
    text = read_text(path)
    header_line = text.partition("\n")[0]
    for name, delimiter in (("semicolons", ";"), ("tabs", "\t")):
        if delimiter in header_line and "," not in header_line:
            # Such files (spreadsheets in locales with decimal commas) usually write 600,5 for
            # 600.5 too: guessing which comma is which could read wrong numbers, so refuse.
            raise BadInputError(
                f"{path}: columns are separated by {name}, not commas: save the sweep as CSV "
                "with commas between columns and '.' for decimals (cap_w,power_w,throughput)"
            )
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [h.strip() for h in (reader.fieldnames or [])]
        if header != ["cap_w", "power_w", "throughput"]:
            raise BadInputError(
                f"{path}: CSV header must be cap_w,power_w,throughput, got {','.join(header)!r}"
            )
        return [_point(row, f"{path}: line {i + 2}") for i, row in enumerate(reader)]
    except csv.Error as exc:
        raise BadInputError(f"{path}: cannot read: {exc}") from None


def _point(row: dict[str, Any], where: str) -> tuple[float, float, float]:
    values = []
    for name in ("cap_w", "power_w", "throughput"):
        raw = row.get(name)
        try:
            value = float(raw) if not isinstance(raw, bool) and raw is not None else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "throughput"):
            raise BadInputError(f"{where}: {name} must be a finite positive number, got {raw!r}")
        if name != "throughput":
            try:  # a sweep in kW would give a PFI "on caps {0.2, ...} W"
                check_gpu_power_w(value, name)
            except InvalidJobError as exc:
                raise BadInputError(f"{where}: {exc}") from None
        values.append(value)
    return values[0], values[1], values[2]


TRACE_COLUMNS = ("t_s", "power_w")
#: Samples further apart than this [s] are refused: power traces (NVML, DCGM, nvidia-smi) come
#: at 1 Hz or faster, and 20 "s" between samples is a trace timed in milliseconds.
MAX_SAMPLE_INTERVAL_S = 2.0


def read_trace(path: Path) -> tuple[list[float], list[float]]:
    """A power trace from CSV with columns `t_s,power_w` (others, such as a GPU index, are
    ignored), times increasing; a bad row is named by its line."""
    text = read_text(path)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise BadInputError(
                f"{path}: CSV header must name the columns t_s,power_w; missing "
                f"{','.join(missing)} (got {','.join(header)!r})"
            )
        reader.fieldnames = header
        times: list[float] = []
        power: list[float] = []
        for i, row in enumerate(reader):
            where = f"{path}: line {i + 2}"
            t, p = (_finite(row.get(c), c, where) for c in TRACE_COLUMNS)
            if times and t <= times[-1]:
                raise BadInputError(
                    f"{where}: t_s {t:g} does not follow {times[-1]:g} (times must increase: "
                    "one GPU, or one job's mean, per file)"
                )
            if p < 0:
                raise BadInputError(f"{where}: power_w must be at least 0, got {p:g}")
            times.append(t)
            power.append(p)
    except csv.Error as exc:
        raise BadInputError(f"{path}: cannot read: {exc}") from None
    check_trace_units(path, times, power)
    return times, power


def check_trace_units(path: Path, times: list[float], power: list[float]) -> None:
    """A trace in kW or timed in ms refused as the job mix refuses a unit slip: its mean power
    must be a GPU's, its samples no further apart than `MAX_SAMPLE_INTERVAL_S`."""
    if power:
        try:
            check_gpu_power_w(statistics.fmean(power), "its mean power_w")
        except InvalidJobError as exc:
            raise BadInputError(f"{path}: {exc} (one GPU, or one job's mean per GPU)") from None
    if len(times) >= 2:
        step = statistics.median(b - a for a, b in itertools.pairwise(times))
        if step > MAX_SAMPLE_INTERVAL_S:
            raise BadInputError(
                f"{path}: samples are {step:g} s apart, more than {MAX_SAMPLE_INTERVAL_S:g} s "
                f"(traces come at 1 Hz or faster): t_s in milliseconds? ({step:g} ms is "
                f"{step / 1000:g} s)"
            )


def _finite(raw: Any, name: str, where: str) -> float:
    try:
        value = float(raw) if isinstance(raw, str) else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BadInputError(f"{where}: {name} must be a finite number, got {raw!r}")
    return value
