"""The `flexgate` command: the composition root that wires flexmodel, agents and gateway.

Nothing imports this package; it may import all three (docs/architecture.md).
"""

from gateway.openadr import quiet_signxml

quiet_signxml()  # before the mock VTN imports openleadr (its import sorts ahead of ours)
