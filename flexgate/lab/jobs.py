"""The lab site's job mix and what every lab on it shares: its declared overhead factor and
the agents' token (the event lab, `flexgate.lab.run`; the fast lab; the simulated sites of the
replay, the campaign and the closed-loop benchmark)."""

from __future__ import annotations

from typing import Any

import numpy as np

from flexmodel.workload import MAIN_TYPES, POWER_W

OVERHEAD_FACTOR = 1.3
AGENT_TOKEN = "lab-agent-token-0123"


def lab_jobs(nodes: int, gpus_per_node: int, seed: int = 7) -> list[dict[str, Any]]:
    """Jobs of the study's types filling every GPU: one job per node or per group of nodes."""
    rng = np.random.default_rng(seed)
    jobs: list[dict[str, Any]] = []
    node = 0
    order = rng.permutation(len(MAIN_TYPES))
    while node < nodes:
        for t in (MAIN_TYPES[i] for i in order):
            span = max(t.gpus // gpus_per_node, 1)
            if node + span > nodes:
                continue
            low, high = POWER_W[(t.group, t.task)]
            jobs.append(
                {
                    "id": f"{t.name}-{len(jobs)}",
                    "gpus": span * gpus_per_node,
                    "power_w": round(float(rng.uniform(low, high)), 1),
                    "throughput": round(float(rng.uniform(2e3, 6e3)) * span * gpus_per_node, 1),
                    "pfi": t.pfi,
                    "pfi_stderr": 0.1,
                    "period_s": round(float(rng.uniform(0.8, 2.5)), 2),
                    "duty": round(float(rng.uniform(0.6, 0.85)), 2),
                    "placement": [
                        {"node": f"node-{node + k + 1:02d}", "gpus": list(range(gpus_per_node))}
                        for k in range(span)
                    ],
                }
            )
            node += span
            if node >= nodes:
                break
    return jobs
