"""Benchmark: OpenADR event start -> every cap enforced, through the VEN (results/ven.json).

The lab's topology in separate processes: the mock VTN (openleadr's, in this process), the
gateway with its VEN (`flexgate gateway`, polling every second), and simulated nodes
(`bench/servers.py farm`), for 4 nodes (the lab) and 100 nodes. Each event is a LOAD_DISPATCH
delta of 20% of the site's baseline, issued 3 s before its start so a 1 s poll has delivered
it; the time measured runs from the event's dtstart until the plan's every command is acked
(each agent acks after its limits are set). No ramp-up. Anchor: Emerald's London trial shed
about 30% within about 40 s of the grid signal; target here < 2 s after the start.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from gateway_bench import (
    API_TOKEN,
    RESULTS,
    TOKEN,
    big_mix,
    gateway_env,
    serve,
    serve_gateway,
)  # bench/ is on sys.path

from flexgate.lab.mockvtn import MockVtn
from flexgate.serve import free_port

LEAD_S = 3.0
DURATION_S = 3.0
EVENTS = 8


def topology(nodes: int, tmp: Path) -> dict[str, object]:
    mix = big_mix(nodes, nodes)
    mix_file = tmp / f"mix-{nodes}.json"
    mix_file.write_text(json.dumps(mix))
    baseline = 1.3 * sum(8 * j["power_w"] for j in mix["jobs"]) / 1000.0
    spec = {
        "signal_name": "LOAD_DISPATCH",
        "signal_type": "delta",
        "start_offset_s": LEAD_S,
        "intervals": [{"duration_s": DURATION_S, "value": -round(0.2 * baseline, 1)}],
    }
    vtn = MockVtn(
        {"vtn_id": "BENCH_VTN", "poll_s": 1, "events": [spec]},
        port=free_port(),
        say=lambda line: None,
    )
    farm_port = free_port()
    farm = serve(
        ["bench/servers.py", "farm", str(farm_port), str(nodes), TOKEN, str(mix_file)],
        f"http://127.0.0.1:{farm_port}/nodes/n0000/health",
    )
    agents = ",".join(f"http://127.0.0.1:{farm_port}/nodes/n{i:04d}" for i in range(nodes))
    env = gateway_env(
        tmp / f"ven-{nodes}.db",
        agents=agents,
        vtn_url=vtn.url,
        vtn_allow_unsigned="true",
        recovery_ramp_s="0.5",
        recovery_steps="1",
        opt_policy="always",
    )
    delays: list[float] = []
    vtn.start()
    try:
        gateway, url = serve_gateway(env)
        try:
            auth = {"Authorization": f"Bearer {API_TOKEN}"}
            with httpx.Client(base_url=url, timeout=60, headers=auth) as api:
                api.put("/v1/jobs", json=mix).raise_for_status()
                while not vtn.issued:  # the first event goes out once the VEN registers
                    time.sleep(0.05)
                for i in range(EVENTS):
                    record = vtn.issued[-1] if i == 0 else vtn.issue(spec)
                    delays.append(enforced_after_start(api, record))
                    while api.get("/v1/site").json()["active_event_id"] or vtn_busy(api):
                        time.sleep(0.1)
                    time.sleep(1.0)  # recovery restores every GPU
        finally:
            gateway.terminate()
            gateway.wait()
    finally:
        vtn.stop()
        farm.terminate()
        farm.wait()
    p50, p99 = np.percentile(delays, [50, 99])
    return {
        "nodes": nodes,
        "events": len(delays),
        "p50_s": float(p50),
        "p99_s": float(p99),
        "max_s": max(delays),
        "delays_s": delays,
    }


def vtn_busy(api: httpx.Client) -> bool:
    return any(e["status"] in ("pending", "active") for e in api.get("/v1/events").json()["events"])


def enforced_after_start(api: httpx.Client, record: dict) -> float:
    """Seconds from the event's dtstart until every command of its plan is acked."""
    event_id = f"oadr-{record['event_id']}"
    deadline = time.monotonic() + LEAD_S + DURATION_S + 30
    while time.monotonic() < deadline:
        answer = api.get(f"/v1/events/{event_id}")
        plan_id = answer.json()["plan_id"] if answer.status_code == 200 else None
        if plan_id:
            commands = api.get(f"/v1/plans/{plan_id}").json()["commands"]
            if commands and all(c["status"] == "acked" for c in commands):
                return (datetime.now(UTC) - record["start"]).total_seconds()
        time.sleep(0.01)
    raise RuntimeError(f"{event_id}: caps not enforced in time")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ven-bench-"))
    out: dict[str, object] = {"benchmark": "ven", "target_s": 2.0}
    for nodes in (4, 100):
        result = topology(nodes, tmp)
        out[f"nodes_{nodes}"] = result
        print(
            f"VEN event start -> every cap enforced, {nodes} nodes: p50 {result['p50_s']:.3f} s, "
            f"p99 {result['p99_s']:.3f} s over {result['events']} events",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ven.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
