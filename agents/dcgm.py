"""DCGM's profiling fields, read from DCGM-exporter's Prometheus text endpoint.

DRAM activity (`DCGM_FI_PROF_DRAM_ACTIVE`: the share of cycles the device memory interface
sends or receives data, 0-1) is a profiling field: NVML has no such reading, DCGM does. Where
dcgm-exporter runs on the node (`FLEXGATE_AGENT_DCGM_URL`, its default port is 9400), the
agent reads it there: one GET per reading, every GPU at once. Rows are matched to this node's
GPUs by their `UUID` label, else by their `gpu` label (the index); rows of MIG instances
(a non-empty `GPU_I_ID`) are skipped, as a job's features are the whole GPU's. Every failure
(no answer, an HTTP error, no row for the field) is a `DcgmError` naming the URL.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request

from agents.errors import DcgmError

DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric `name` in Prometheus text: (labels, value)."""
    out = []
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = _LINE.match(line)
        if match is None or match["name"] != name:
            continue
        labels = {k: v.replace('\\"', '"') for k, v in _LABEL.findall(match["labels"] or "")}
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isfinite(value):
            out.append((labels, value))
    return out


class DcgmExporter:
    """`read_dram_active()`: each GPU's DRAM activity, from the exporter at `url`."""

    def __init__(self, url: str, uuids: list[str], *, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._index = {uuid: i for i, uuid in enumerate(uuids)}
        self._count = len(uuids)

    def read_dram_active(self) -> dict[int, float]:
        text = self._get()
        found: dict[int, float] = {}
        for labels, value in parse_samples(text, DRAM_ACTIVE):
            if labels.get("GPU_I_ID"):
                continue
            index = self._gpu(labels)
            if index is not None:
                found[index] = min(max(value, 0.0), 1.0)
        if not found:
            raise DcgmError(
                f"DCGM exporter at {self.url} reports no {DRAM_ACTIVE} for this node's GPUs "
                "(is the field in its counters file? profiling fields need DCGM's profiling "
                "module)"
            )
        return found

    def _gpu(self, labels: dict[str, str]) -> int | None:
        uuid = labels.get("UUID")
        if uuid:
            return self._index.get(uuid)
        gpu = labels.get("gpu", "")
        return int(gpu) if gpu.isdigit() and int(gpu) < self._count else None

    def _get(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as answer:
                body: bytes = answer.read()
        except urllib.error.HTTPError as exc:
            raise DcgmError(f"DCGM exporter at {self.url} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DcgmError(f"DCGM exporter at {self.url} did not answer: {reason}") from exc
        return body.decode("utf-8", errors="replace")
