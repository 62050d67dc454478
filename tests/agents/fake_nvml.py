"""A stateful stand-in for the `pynvml` module, for tests on machines without GPUs.

Same function names, milliwatt units, `[min, max]` constraint lists, unhashable handles and
`NVMLError` subclasses as pynvml. Faults can be injected per GPU. With `state_file`, the
"driver" state (limits) lives in a JSON file, so it outlives an agent process as a real driver
does, for crash tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_GPU_IS_LOST = 15
NVML_FI_DEV_POWER_INSTANT = 186
# pynvml's clock types (nvmlClockType_t)
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_VALUE_TYPE_UNSIGNED_INT = 1
nvmlClocksEventReasonSwPowerCap = 4


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            2: "Invalid Argument",
            3: "Not Supported",
            4: "Insufficient Permissions",
            15: "GPU is lost",
        }.get(self.value, f"NVML error {self.value}")


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_NoPermission(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NO_PERMISSION)


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_GPU_IS_LOST)


class Handle:
    """Like pynvml's ctypes pointer handles: not hashable, compared by identity."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """Use an instance as the `nvml` module: `NvmlBackend(nvml=FakeNvml(...))`."""

    NVMLError = NVMLError
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_SUCCESS = NVML_SUCCESS
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_CLOCK_VIDEO = NVML_CLOCK_VIDEO
    nvmlClocksEventReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap

    def __init__(
        self,
        gpus: int = 4,
        *,
        min_mw: int = 200_000,
        max_mw: int = 700_000,
        default_mw: int = 700_000,
        start_mw: int | None = None,
        draw_mw: int = 640_000,
        instant: bool = True,
        root: bool = True,
        state_file: Path | None = None,
        memory_util_pct: list[int] | None = None,
        sm_clock_mhz: list[int] | None = None,
    ) -> None:
        self.min_mw, self.max_mw, self.default_mw = min_mw, max_mw, default_mw
        self.draw_mw = draw_mw
        self.instant = instant
        self.root = root
        self.state_file = state_file
        #: per GPU, what `nvmlDeviceGetUtilizationRates(...).memory` answers [%]; None: the
        #: call is not supported
        self.memory_util_pct = memory_util_pct if memory_util_pct is not None else [35] * gpus
        self.utilisation_supported = True
        #: per GPU, what `nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)` answers [MHz] (an H200's
        #: boost clock by default); `clocks_supported` False: the call is not supported
        self.sm_clock_mhz = sm_clock_mhz if sm_clock_mhz is not None else [1980] * gpus
        self.clocks_supported = True
        self.lost: set[int] = set()
        self.readback_offset_mw: dict[int, int] = {}
        self.initialised = False
        self.calls: list[str] = []
        self._handles = [Handle(i) for i in range(gpus)]
        start = default_mw if start_mw is None else start_mw
        if state_file is not None and state_file.exists():
            self._limits = json.loads(state_file.read_text())["limits_mw"]
        else:
            self._limits = [start] * gpus
            self._save()

    def _save(self) -> None:
        if self.state_file is not None:  # replaced whole, as a driver's state is: never half
            partial = self.state_file.with_suffix(".partial")
            partial.write_text(json.dumps({"limits_mw": self._limits}))
            partial.replace(self.state_file)

    def _index(self, handle: Any) -> int:
        if not isinstance(handle, Handle):
            raise NVMLError_InvalidArgument()
        if handle.index in self.lost:
            raise NVMLError_GpuIsLost()
        return handle.index

    def limit_mw(self, index: int) -> int:
        return self._limits[index]

    # --- pynvml's functions ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"  # recent pynvml answers str; older ones bytes

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.570.124.06"

    def nvmlDeviceGetCount(self) -> int:
        return len(self._handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < len(self._handles):
            raise NVMLError_InvalidArgument()
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return f"GPU-fake-{self._index(handle):04d}"

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        self._index(handle)
        return b"NVIDIA H200"

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        self._index(handle)
        return [self.min_mw, self.max_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        self._index(handle)
        return self.default_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._limits[self._index(handle)]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        index = self._index(handle)
        return self._limits[index] + self.readback_offset_mw.get(index, 0)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit_mw: int) -> None:
        index = self._index(handle)
        self.calls.append(f"set {index} {limit_mw}")
        if not self.root:
            raise NVMLError_NoPermission()
        if not isinstance(limit_mw, int) or not self.min_mw <= limit_mw <= self.max_mw:
            raise NVMLError_InvalidArgument()
        self._limits[index] = limit_mw
        self._save()

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return min(self.draw_mw, self._limits[self._index(handle)])

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> list[Any]:
        index = self._index(handle)
        out = []
        for field in field_ids:
            ok = self.instant and field == NVML_FI_DEV_POWER_INSTANT
            out.append(
                SimpleNamespace(
                    fieldId=field,
                    nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                    value=SimpleNamespace(
                        uiVal=min(self.draw_mw, self._limits[index]) if ok else 0
                    ),
                )
            )
        return out

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        """Like pynvml's `c_nvmlUtilization_t`: `gpu` and `memory`, integer percent."""
        index = self._index(handle)
        if not self.utilisation_supported:
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=90, memory=int(self.memory_util_pct[index]))

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        """Like pynvml's: the clock of `clock_type` now, integer MHz."""
        index = self._index(handle)
        if clock_type not in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_VIDEO):
            raise NVMLError_InvalidArgument()
        if not self.clocks_supported:
            raise NVMLError_NotSupported()
        if clock_type == NVML_CLOCK_MEM:
            return 3201
        return int(self.sm_clock_mhz[index])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._index(handle)
        return 123_456_789

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        index = self._index(handle)
        return nvmlClocksEventReasonSwPowerCap if self._limits[index] < self.draw_mw else 0

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        self._index(handle)
        raise NVMLError_NotSupported()
