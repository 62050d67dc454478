"""Where the running jobs come from: a scheduler behind one small interface.

- `base`: what a source yields (`SourceJob`, `SourceReading`), the `JobSource` protocol, the
  changes between two looks, and the `flexgate:` tag convention for tier and PFI.
- `slurm`: the Slurm commands (`squeue --json`), honouring `SLURM_CONF`.
- `kubernetes`: pods asking for `nvidia.com/gpu` (the official client: list and watch), joined
  with the GPU indices the node agents read from their kubelets.

The static job mix (`PUT /v1/jobs`) needs no source: it is the default.
"""

from gateway.jobsource.base import (
    JobChanges,
    JobProblem,
    JobSource,
    SourceJob,
    SourceReading,
    changes,
)

__all__ = ["JobChanges", "JobProblem", "JobSource", "SourceJob", "SourceReading", "changes"]
