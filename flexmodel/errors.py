"""The flexmodel exception tree.

    FlexModelError            every error flexmodel raises (a ValueError)
    ├── InvalidJobError       a job or job mix that cannot be modelled
    ├── InvalidSweepError     a measured sweep that cannot be used
    ├── NoPeriodError         a power trace with no clear iteration period (an answer, not a fault)
    ├── InvalidBaselineError  a baseline rule's parameter, or meter data, that cannot be used
    └── NoBaselineError       meter data too thin for a baseline rule (an answer, not a fault)

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


class InvalidBaselineError(FlexModelError):
    """A baseline rule's parameter, or the shape of the meter data given to it, is out of range;
    the message names the parameter."""


class NoBaselineError(FlexModelError):
    """The meter data give no baseline under the rule (too few eligible days, no reading in a
    window the rule needs): an answer a settlement records with its reason, not a fault."""
