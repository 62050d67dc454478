"""The one small interface between the agent and its GPUs (NVML or simulated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Constraints:
    min_w: float
    max_w: float
    default_w: float


class GpuBackend(Protocol):
    kind: str
    #: How long a power reading averages over [s] (0 for instantaneous readings).
    averaging_s: float

    def count(self) -> int: ...
    def identity(self, index: int) -> tuple[str, str]:
        """(uuid, name)"""
        ...

    def constraints(self, index: int) -> Constraints: ...
    def enforced_limit_w(self, index: int) -> float: ...
    def set_limit_w(self, index: int, watts: float) -> None: ...
    def power_w(self, index: int) -> float: ...
    def energy_j(self, index: int) -> float | None: ...
    def sm_clock_mhz(self, index: int) -> float | None:
        """The SM clock now [MHz]; None where the GPU does not say."""
        ...

    def power_capped(self, index: int) -> bool | None:
        """Whether the SW power cap is slowing the clocks now."""
        ...

    def persistence_mode(self, index: int) -> bool | None: ...
    def memory_utilisation(self, index: int) -> float | None:
        """Share of the last sample period the device memory was read or written [0-1]
        (NVML's utilisation rates' `memory`, DCGM's MEM_COPY_UTIL); None where unsupported."""
        ...

    def close(self) -> None: ...
