"""The agent's exception tree; each class carries the HTTP status it answers with.

AgentError (500)
├── UnauthorizedError (401)       missing or wrong bearer token
├── InvalidCapError (422)         a command that names an unknown GPU, twice the same GPU ...
├── StaleGenerationError (409)    a command older than the last accepted one
├── InvalidSetupError             settings or a job mix that do not fit the node (at start)
│   └── NoNvmlError               --backend nvml on a node where NVML finds no GPU
└── BackendError (502)            the GPU or its driver failed
    ├── GpuLostError              the GPU fell off the bus
    ├── NoPermissionError         the agent may not set limits (needs root)
    └── NotSupportedError         the GPU does not offer this
DcgmError (502)                   DCGM's exporter did not answer, or not with what it should
"""

from __future__ import annotations


class AgentError(Exception):
    status_code = 500


class UnauthorizedError(AgentError):
    status_code = 401


class InvalidCapError(AgentError):
    status_code = 422


class StaleGenerationError(AgentError):
    status_code = 409


class InvalidSetupError(AgentError):
    """The agent cannot start as configured: bad input of its operator, not a GPU failure."""


class NoNvmlError(InvalidSetupError):
    """`--backend nvml` where NVML cannot be loaded or sees no GPU: never fall back to the
    simulated GPUs, whose caps would leave the real ones (if any) running flat out."""


class BackendError(AgentError):
    status_code = 502


class GpuLostError(BackendError):
    pass


class NoPermissionError(BackendError):
    pass


class NotSupportedError(BackendError):
    pass


class NodeNotFoundError(AgentError):
    status_code = 404


class DcgmError(AgentError):
    """DCGM's exporter did not answer, or its answer lacks what was asked for."""

    status_code = 502
