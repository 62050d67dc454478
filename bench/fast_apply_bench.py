"""Benchmark: what one agent process spends applying a fast trigger, per node (the agent's own
apply path: `ArmedController.fire`, its originals, sets, read-backs and results), without NATS.

A farm process (`bench/farm.py`) applies a trigger to its nodes one after another; this times
that loop in one process on `--nodes` simulated 8-GPU nodes (each with one job, the H200
enforcement and sensor, as in `bench/fast_bench.py`), armed at 20% and 30% (all 8 GPUs):

- **cold**: the first trigger (each node saves its originals to disk, one fsync each);
- **warm**: 30% again (every GPU set to the cap it has and read back);
- **moving**: 20% and 30% in turn (every GPU's limit moves).

CPU time (the process's, `time.process_time`) and wall time per node, the median of
`--rounds` rounds. `--trees A,B` runs the same measurement on other checkouts of the project
(each a subprocess in that folder, rounds interleaved), for a before/after in one run on a
shared machine:

    python bench/fast_apply_bench.py [--nodes 2500] [--rounds 5] [--trees /work/main,.]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def measure(nodes: int) -> dict[str, Any]:
    """One round in this process: cold, warm and moving triggers on `nodes` nodes."""
    sys.path.insert(0, os.getcwd())
    import agents
    from agents.protocol import GpuCap
    from agents.protocol_fast import ArmCommand, ArmedDepth, FastTrigger
    from agents.service import AgentNode
    from agents.simulated import SimulatedBackend
    from flexmodel.sensors import SENSORS

    try:  # a checkout from before the enforcement model: the apply path is the same
        from agents.enforcement import H200

        gpus: dict[str, Any] = {"sensor": SENSORS["H200"], "enforcement": H200}
    except ImportError:
        gpus = {}
    state = Path(tempfile.mkdtemp(prefix="fast-apply-"))
    fleet = [
        AgentNode(
            f"n{i:05d}",
            SimulatedBackend(8, node_id=f"n{i:05d}", noise_w=0.0, **gpus),
            state / f"n{i:05d}",
            sample_hz=0,
            window_s=1.6,
        )
        for i in range(nodes)
    ]
    arm = ArmCommand(
        generation=1,
        depths=[
            ArmedDepth(depth_pct=20.0, caps=[GpuCap(gpu=g, cap_w=500.0) for g in range(8)]),
            ArmedDepth(depth_pct=30.0, caps=[GpuCap(gpu=g, cap_w=400.0) for g in range(8)]),
        ],
    )
    for agent in fleet:
        agent.controller.arm(arm)
    seq = iter(range(1, 10**6))

    def fire(depth: float) -> tuple[float, float]:
        trigger = FastTrigger(
            seq=next(seq), sent_at_s=time.time(), depth_pct=depth, duration_s=60.0
        )
        cpu, wall = time.process_time(), time.perf_counter()
        for agent in fleet:
            agent.controller.fire(trigger, agent.controller.clock())
        return (time.process_time() - cpu) / nodes, (time.perf_counter() - wall) / nodes

    cold = fire(30.0)
    warm = [fire(30.0) for _ in range(4)]
    moving = [fire(20.0 if k % 2 == 0 else 30.0) for k in range(4)]
    return {
        "agents_from": str(Path(agents.__file__).parent),
        "cold_cpu_ms": cold[0] * 1e3,
        "cold_wall_ms": cold[1] * 1e3,
        "warm_cpu_ms": statistics.median(w[0] for w in warm) * 1e3,
        "warm_wall_ms": statistics.median(w[1] for w in warm) * 1e3,
        "moving_cpu_ms": statistics.median(m[0] for m in moving) * 1e3,
        "moving_wall_ms": statistics.median(m[1] for m in moving) * 1e3,
    }


def commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", default=".", help="checkouts to measure, comma-separated")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.nodes)))
        return
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    rounds: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    load = os.getloadavg()[0]
    one = [sys.executable, str(Path(__file__).resolve()), "--one", "--nodes", str(args.nodes)]
    for _ in range(args.rounds):
        for tree in trees:
            out = subprocess.run(
                one,
                cwd=tree,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rounds[tree].append(json.loads(out.strip().splitlines()[-1]))
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "nodes": args.nodes,
        "rounds": args.rounds,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "trees": [
            {
                "tree": str(tree),
                "commit": commit(tree),
                "agents_from": rounds[tree][0]["agents_from"],
                **{
                    k: statistics.median(r[k] for r in rounds[tree])
                    for k in rounds[tree][0]
                    if k.endswith("_ms")
                },
            }
            for tree in trees
        ],
    }
    print(json.dumps(doc, indent=2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fast_apply.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
