"""The `flexgate` command: the composition root that wires flexmodel, agents and gateway.

Nothing imports this package; it may import all three (docs/architecture.md).
"""
