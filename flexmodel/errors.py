"""The flexmodel exception tree.

    FlexModelError            every error flexmodel raises (a ValueError)
    ├── InvalidJobError       a job or job mix that cannot be modelled
    ├── InvalidSweepError     a measured sweep that cannot be used
    └── NoPeriodError         a power trace with no clear iteration period (an answer, not a fault)

Messages name the job, field or row at fault, so callers can show them unchanged.
"""


class FlexModelError(ValueError):
    """Root of every error raised by flexmodel."""


class InvalidJobError(FlexModelError):
    """A job or job mix is inconsistent or out of range."""


class InvalidSweepError(FlexModelError):
    """A measured sweep cannot give a PFI or a curve."""


class NoPeriodError(FlexModelError):
    """A power trace shows no clear iteration period: say so, never invent one."""
