"""GPUs through NVML (the `pynvml` module of the nvidia-ml-py package).

Milliwatts become watts here and nowhere else; NVML errors become the agent's own in one place
(`_translate`). The module is imported lazily (a node without GPUs never loads it) and can be
passed in (tests pass a fake with pynvml's names, units and error classes).

Limits are set with the v1 call (`nvmlDeviceSetPowerManagementLimit`) and read back with
`nvmlDeviceGetEnforcedPowerLimit`: the enforced limit is the truth (the v2 setter is known to
report success regardless). Power comes from the `NVML_FI_DEV_POWER_INSTANT` field where the GPU
offers it, else from `nvmlDeviceGetPowerUsage`, a 1 s average on Hopper (`averaging_s` says
which, so phase estimation can refuse periods it cannot resolve). Persistence mode is reported:
without it a driver reload forgets the limits. Memory utilisation (`nvmlDeviceGetUtilizationRates`,
percent) becomes a fraction here: one factor of the DRAM copy product (`agents.features`).
The SM clock (`nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)`, MHz, the clock now) is read with
the power: under a cap it shows how far the firmware lowered the clock, which gives the job's
power-to-clock shape (`flexmodel.dvfs`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from agents.backend import Constraints
from agents.errors import BackendError, GpuLostError, NoPermissionError, NotSupportedError

T = TypeVar("T")
INSTANT_FIELD = 186  # NVML_FI_DEV_POWER_INSTANT, when the module lacks the name
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
CLOCK_SM = 1  # NVML_CLOCK_SM, when the module lacks the name


class NvmlBackend:
    kind = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self._call(self._nvml.nvmlInit)
        count = self._call(self._nvml.nvmlDeviceGetCount)
        self._handles = [self._call(self._nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        self._instant = all(self._instant_supported(h) for h in self._handles) and count > 0
        self.averaging_s = 0.0 if self._instant else 1.0

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise _translate(self._nvml, exc) from exc

    def _handle(self, index: int) -> Any:
        if not 0 <= index < len(self._handles):
            raise BackendError(f"no GPU {index} on this node ({len(self._handles)} GPUs)")
        return self._handles[index]

    def _instant_supported(self, handle: Any) -> bool:
        try:
            return self._instant_mw(handle) is not None
        except BackendError:
            return False

    def _instant_mw(self, handle: Any) -> float | None:
        field = getattr(self._nvml, "NVML_FI_DEV_POWER_INSTANT", INSTANT_FIELD)
        value = self._call(self._nvml.nvmlDeviceGetFieldValues, handle, [field])[0]
        if value.nvmlReturn != getattr(self._nvml, "NVML_SUCCESS", 0):
            return None
        return float(value.value.uiVal)

    def count(self) -> int:
        return len(self._handles)

    def identity(self, index: int) -> tuple[str, str]:
        h = self._handle(index)
        return _text(self._call(self._nvml.nvmlDeviceGetUUID, h)), _text(
            self._call(self._nvml.nvmlDeviceGetName, h)
        )

    def constraints(self, index: int) -> Constraints:
        h = self._handle(index)
        low, high = self._call(self._nvml.nvmlDeviceGetPowerManagementLimitConstraints, h)
        default = self._call(self._nvml.nvmlDeviceGetPowerManagementDefaultLimit, h)
        return Constraints(min_w=low / 1000.0, max_w=high / 1000.0, default_w=default / 1000.0)

    def enforced_limit_w(self, index: int) -> float:
        h = self._handle(index)
        milliwatts: int = self._call(self._nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        return milliwatts / 1000.0

    def set_limit_w(self, index: int, watts: float) -> None:
        milliwatts = round(watts * 1000.0)
        self._call(self._nvml.nvmlDeviceSetPowerManagementLimit, self._handle(index), milliwatts)

    def power_w(self, index: int) -> float:
        h = self._handle(index)
        if self._instant:
            instant = self._instant_mw(h)
            if instant is not None:
                return instant / 1000.0
        milliwatts: int = self._call(self._nvml.nvmlDeviceGetPowerUsage, h)
        return milliwatts / 1000.0

    def energy_j(self, index: int) -> float | None:
        try:
            millijoules: int = self._call(
                self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle(index)
            )
        except NotSupportedError:
            return None
        return millijoules / 1000.0

    def sm_clock_mhz(self, index: int) -> float | None:
        kind = getattr(self._nvml, "NVML_CLOCK_SM", CLOCK_SM)
        try:
            return float(self._call(self._nvml.nvmlDeviceGetClockInfo, self._handle(index), kind))
        except NotSupportedError:
            return None

    def power_capped(self, index: int) -> bool | None:
        reasons = getattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self._nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if reasons is None:
            return None
        try:
            return bool(self._call(reasons, self._handle(index)) & SW_POWER_CAP)
        except NotSupportedError:
            return None

    def persistence_mode(self, index: int) -> bool | None:
        try:
            return bool(self._call(self._nvml.nvmlDeviceGetPersistenceMode, self._handle(index)))
        except NotSupportedError:
            return None

    def memory_utilisation(self, index: int) -> float | None:
        try:
            rates = self._call(self._nvml.nvmlDeviceGetUtilizationRates, self._handle(index))
        except NotSupportedError:
            return None
        return float(rates.memory) / 100.0  # NVML speaks percent

    def close(self) -> None:
        with contextlib.suppress(BackendError):
            self._call(self._nvml.nvmlShutdown)


def _translate(nvml: Any, exc: Exception) -> BackendError:
    """One NVML error as the agent's own, with NVML's words kept."""
    kinds = (
        ("NVMLError_GpuIsLost", GpuLostError, "the GPU is lost (fell off the bus)"),
        ("NVMLError_NoPermission", NoPermissionError, "no permission (setting limits needs root)"),
        ("NVMLError_NotSupported", NotSupportedError, "not supported by this GPU"),
        ("NVMLError_InvalidArgument", BackendError, "NVML refused the value"),
    )
    for name, cls, words in kinds:
        nvml_cls = getattr(nvml, name, None)
        if nvml_cls is not None and isinstance(exc, nvml_cls):
            return cls(f"{words}: {exc}")
    return BackendError(f"NVML error: {exc}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
