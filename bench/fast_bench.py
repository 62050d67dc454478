"""Benchmark: the fast path, trigger to every node at its armed caps (bench/results/fast.json).

Per size (1,000 and 10,000 simulated 8-GPU nodes, one job each), on this machine: a fresh
`nats-server -js`, the agent farm (`bench/farm.py`, several processes, each checking a trigger
once and applying it on all its nodes) and a `flexgate gateway` process over NATS with
FLEXGATE_FAST_DEPTHS=10,20,30,40.

- **armed**: from the job mix put to every node holding its plans (`/v1/fast/armed`); then the
  gateway's and the farm's CPU and memory (RSS) over a quiet minute of keeping them armed
  (the gateway checks them every FLEXGATE_FAST_REARM_S; nothing moved, nothing sent).
- **trigger to enforced**, counted from the trigger: `POST /v1/fast/trigger` (the API: the
  gateway signs and publishes) or a signed message published straight on the subject (a
  trigger source on the broker, such as a relay); done when every farm process has reported
  its nodes' caps read back (`flexgate.fast.fired`). The first trigger is cold (every node
  saves its originals to disk first); then warm ones at 30% (each kind in turn) and ones
  moving between 20% and 30%; p50/p99 over the triggers of each kind.
- **the sum of GPU power**, counted from the trigger: the farm's GPUs hold a limit as an H200
  does (`--gpus h200`: `agents.enforcement.H200`, the average reaching a new limit over the
  controller's time constant, instants swinging above it; the H200's sensor, each reading held
  100 ms, the mean of the last 100 ms, each node's at its own moments). Triggers at 30% from a
  site settled at 20% (the armed step between them); after each, every farm process sums its
  GPUs' power over the trigger's first 2 s (`GET /farm/power`), as the sensors read it and as
  the controllers hold it on average. Per trigger: when each sum first reached 90% of the
  step, and the share of the step delivered 1 s after the trigger; p50/p99 over the triggers.
- **from the frequency's crossing**: the gateway reads a line-per-reading TCP stream (50
  readings a second, `tcp://` in FLEXGATE_FREQUENCY_URL) in threshold mode (below 49.7 Hz:
  30%). The stream steps from 50.00 to 49.60 Hz; counted from the moment the first reading
  under the threshold is written to the socket to every farm process's report, over
  `--triggers` crossings (each released at 50 Hz before the next). The nodes hold the same
  caps as the warm triggers: the difference is the feed's sampling and the gateway's path.
  The gateway's own `flexgate_fast_crossing_to_enforced_seconds` (counted from the reading
  that crossed) is read back from `/metrics` for comparison.
- **the power model alone** (no farm, no trigger path): 200 of the same nodes on a stepped
  clock, each put at its caps for 30% at one instant, for several controller time constants
  (the one figure assumed): when the sensed and the average sums reach 90% of the step.
- **the ordinary path**, in the same run for comparison: three events (30%, 31%, 32%), event
  start to every node's answer (docs/benchmarks.md's other figures come from other runs).

    python bench/fast_bench.py [--sizes 1000,10000] [--triggers 20] [--processes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import nats
import numpy as np
from farm import Farm, node_mixes, node_name
from gateway_bench import API_TOKEN, TOKEN, gateway_env, serve_gateway
from nats_bench import (
    NATS_TOKEN,
    cpu_s,
    event_to_acked,
    metric,
    one_job_per_node,
    planned_caps,
    rss_mib,
    start_nats,
)
from prometheus_client.parser import text_string_to_metric_families

from agents.enforcement import H200, Enforcement
from agents.protocol_fast import FAST_FIRED_SUBJECT, FAST_TRIGGER_SUBJECT, FastFired, FastTrigger
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix
from flexmodel.sensors import SENSORS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SECRET = "bench-fast-secret-0123456789"
MAX_AGE_S = 30.0
#: The sum of GPU power: read on this grid after a trigger [s], the settled level this long
#: after it [s], a settled site this long after the previous trigger [s].
POWER_STEP_S, POWER_SPAN_S, POWER_SETTLED_S, SETTLE_S = 0.01, 2.0, 60.0, 2.0


class GridFeed:
    """The grid's frequency as a line stream on a loopback port: every `period_s` a line with
    `hz` to whoever is connected. `cross(hz)` moves it; the moment the first line with the
    new value went out is `crossed_at` (perf_counter)."""

    def __init__(self, hz: float = 50.0, period_s: float = 0.02) -> None:
        self.hz, self.period_s = hz, period_s
        self.crossed_at: float | None = None
        self._moved = threading.Event()
        self._stop = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def cross(self, hz: float) -> None:
        self.crossed_at = None
        self.hz = hz
        self._moved.set()

    def _serve(self) -> None:
        self._server.settimeout(0.5)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._stream, args=(conn,), daemon=True).start()

    def _stream(self, conn: socket.socket) -> None:
        with conn:
            while not self._stop.is_set():
                moved = self._moved.is_set()
                try:
                    conn.sendall(f"{self.hz:.3f}\n".encode())
                except OSError:
                    return
                if moved:
                    self.crossed_at = time.perf_counter()
                    self._moved.clear()
                self._moved.wait(self.period_s)

    def close(self) -> None:
        self._stop.set()
        self._server.close()


class Reports:
    """Every farm process's `FastFired`, by trigger sequence: when the nodes were all in
    (those armed at the depth at their caps, the others unchanged)."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.reported: dict[int, int] = {}
        self.applied: dict[int, int] = {}
        self.done_at: dict[int, float] = {}
        self.elapsed: dict[int, list[float]] = {}
        self.arrived: dict[int, list[float]] = {}  #: each report's arrival (perf_counter)

    async def heard(self, msg: Any) -> None:
        fired = FastFired.model_validate_json(msg.data)
        self.arrived.setdefault(fired.seq, []).append(time.perf_counter())
        self.reported[fired.seq] = self.reported.get(fired.seq, 0) + fired.nodes
        self.applied[fired.seq] = self.applied.get(fired.seq, 0) + fired.applied
        self.elapsed.setdefault(fired.seq, []).append(fired.elapsed_s)
        if self.reported[fired.seq] >= self.nodes:
            self.done_at[fired.seq] = time.perf_counter()

    async def wait(self, seq: int, timeout_s: float = 30.0) -> float:
        deadline = time.perf_counter() + timeout_s
        while seq not in self.done_at:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"trigger {seq}: {self.reported.get(seq, 0)} nodes reported")
            await asyncio.sleep(0.001)
        return self.done_at[seq]


def signed(seq: int, depth_pct: float) -> tuple[bytes, str]:
    body = FastTrigger(
        seq=seq, sent_at_s=time.time(), depth_pct=depth_pct, duration_s=60.0
    ).model_dump_json()
    return body.encode(), hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()


class Triggers:
    """Triggers sent two ways, each timed to the last farm process's report."""

    def __init__(self, url: str, nc: Any, reports: Reports) -> None:
        self.nc, self.reports = nc, reports
        self.api = httpx.AsyncClient(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {API_TOKEN}"}
        )
        self.applied: list[int] = []  #: per trigger, the nodes now at their caps
        self.process_s: list[float] = []  #: per process and trigger, its nodes' apply time
        #: per process and trigger, from the trigger to the process starting to apply it
        #: (publish, the broker's delivery, the process's queue) and its report's way back
        self.waited_s: list[float] = []

    async def by_api(self, depth: float) -> float:
        start = time.perf_counter()
        answer = await self.api.post(
            "/v1/fast/trigger", json={"depth_pct": depth, "duration_s": 60}
        )
        answer.raise_for_status()
        return await self._done(answer.json()["seq"], start)

    async def by_broadcast(self, depth: float) -> float:
        seq = int(time.time() * 1_000_000)
        body, sig = signed(seq, depth)
        start = time.perf_counter()
        await self.nc.publish(FAST_TRIGGER_SUBJECT, body, headers={"Flexgate-Signature": sig})
        await self.nc.flush()
        return await self._done(seq, start)

    async def _done(self, seq: int, start: float) -> float:
        done = await self.reports.wait(seq, timeout_s=120.0)
        self.applied.append(self.reports.applied[seq])
        self.process_s += self.reports.elapsed[seq]
        self.waited_s += [
            arrived - start - elapsed
            for arrived, elapsed in zip(
                self.reports.arrived[seq], self.reports.elapsed[seq], strict=True
            )
        ]
        await asyncio.sleep(0.2)
        return done - start


def site_power(farm: Farm, start: float, step: float, count: int) -> tuple[Any, Any]:
    """The farm's GPU power summed at `start + k * step` (monotonic; this process's clock is
    the farm's): (as the sensors read it, as the controllers hold it) [W]."""

    def one(url: str) -> dict[str, list[float]]:
        doc = httpx.get(url, params={"start": start, "step": step, "count": count}, timeout=600)
        doc.raise_for_status()
        return dict(doc.json())

    sensed, average = np.zeros(count), np.zeros(count)
    with ThreadPoolExecutor(len(farm.power_urls)) as pool:  # each process sums its own
        for doc in pool.map(one, farm.power_urls):
            sensed += np.array(doc["sensed_w"])
            average += np.array(doc["average_w"])
    return sensed, average


def step_response(farm: Farm, sent_at: float) -> dict[str, float]:
    """One trigger's step in the sum of GPU power, from `sent_at` (monotonic): the step (the
    average held before it less the one settled after), and for the sensed and the average
    sums when each first reached 90% of it and the share of it delivered 1 s after."""
    count = round(POWER_SPAN_S / POWER_STEP_S) + 1
    sensed, average = site_power(farm, sent_at, POWER_STEP_S, count)
    _, settled_w = site_power(farm, sent_at + POWER_SETTLED_S, 1.0, 1)
    before_w = float(average[0])
    step_w = before_w - float(settled_w[0])
    at_1s = round(1.0 / POWER_STEP_S)
    out = {"step_kw": step_w / 1000, "before_kw": before_w / 1000}
    for name, series in (("sensed", sensed), ("average", average)):
        delivered = (before_w - series) / step_w
        reached = np.flatnonzero(delivered >= 0.9)
        out[f"{name}_to_90pct_s"] = (
            float(reached[0] * POWER_STEP_S) if len(reached) else float("inf")
        )
        out[f"{name}_delivered_at_1s"] = float(delivered[at_1s])
    return out


class SteppedTime:
    """A clock the power model reads, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def model_alone(nodes: int = 200, controllers_s: tuple[float, ...] = (0.03, 0.1, 0.25, 0.5)):
    """The sum of GPU power of `nodes` nodes put at their 30% caps all at once (t = 0), for
    each controller time constant: when the sensed and the average sums first reach 90% of
    the step [s]."""
    mix_doc = one_job_per_node(nodes)
    mixes = node_mixes(parse_job_mix(mix_doc))
    caps = planned_caps(mix_doc, 0.30)
    times = 10.0 + np.arange(0.0, POWER_SPAN_S, POWER_STEP_S)
    out = []
    for controller_s in controllers_s:
        clock = SteppedTime()
        enforcement = Enforcement(controller_s, H200.overshoot, H200.fluctuation_s)
        sims = [
            SimulatedBackend(
                8,
                mix=mixes.get(node_name(i)),
                node_id=node_name(i),
                clock=clock,
                noise_w=0.0,
                sensor=SENSORS["H200"],
                sensor_offset_s=0.1 * ((i * 0.618034) % 1.0),
                enforcement=enforcement,
            )
            for i in range(nodes)
        ]
        clock.now = 10.0
        for i, sim in enumerate(sims):
            for cap in caps.get(node_name(i), []):
                sim.set_limit_w(cap.gpu, min(max(cap.cap_w, 200.0), 700.0))
        sensed, average = np.zeros(len(times)), np.zeros(len(times))
        settled = 0.0
        for sim in sims:
            node_sensed, node_average = sim.site_power(times)
            sensed += node_sensed
            average += node_average
            settled += float(sim.site_power(np.array([10.0 + POWER_SETTLED_S]))[1][0])
        step = average[0] - settled
        row: dict[str, float] = {"controller_s": controller_s, "step_kw": step / 1000}
        for name, series in (("sensed", sensed), ("average", average)):
            reached = np.flatnonzero((average[0] - series) / step >= 0.9)
            row[f"{name}_to_90pct_s"] = float(reached[0] * POWER_STEP_S)
        out.append(row)
    return out


def percentiles(values: list[float]) -> dict[str, float]:
    q = np.percentile
    return {"p50_s": float(q(values, 50)), "p99_s": float(q(values, 99)), "max_s": max(values)}


async def from_crossing(reports: Reports, feed: GridFeed, count: int) -> list[float]:
    """`count` dips below the threshold, each timed from the first reading under it going out
    to every farm process's report on the trigger the gateway fired."""
    out = []
    for _ in range(count):
        known = set(reports.done_at)
        feed.cross(49.6)
        deadline = time.perf_counter() + 60.0
        while not (set(reports.done_at) - known) or feed.crossed_at is None:
            if time.perf_counter() > deadline:
                raise RuntimeError("the frequency's crossing fired nothing within 60 s")
            await asyncio.sleep(0.001)
        (seq,) = set(reports.done_at) - known
        out.append(reports.done_at[seq] - feed.crossed_at)
        feed.cross(50.0)
        await asyncio.sleep(1.5)  # released, and past the re-trigger limit
    return out


async def triggers(
    url: str, nats_url: str, nodes: int, count: int, farm: Farm, feed: GridFeed
) -> dict[str, Any]:
    """Cold (every armed node saves its GPUs' originals, fsync, before its first change),
    then warm at 30% (API and broadcast in turn: every armed node sets and reads back its
    caps), then moving between 20% and 30% (nodes released and capped again: disk both ways),
    then the sum of GPU power's step from 20% to 30%."""
    reports = Reports(nodes)
    nc = await nats.connect(nats_url, token=NATS_TOKEN)
    await nc.subscribe(FAST_FIRED_SUBJECT, cb=reports.heard)
    run = Triggers(url, nc, reports)
    try:
        cold = await run.by_api(30.0)
        warm: dict[str, list[float]] = {"api": [], "broadcast": []}
        for _ in range(count):
            warm["api"].append(await run.by_api(30.0))
            warm["broadcast"].append(await run.by_broadcast(30.0))
        moving = [await run.by_broadcast(20.0 if k % 2 == 0 else 30.0) for k in range(count)]
        steps, stepped = [], []
        for _ in range(count):
            await run.by_broadcast(20.0)
            await asyncio.sleep(SETTLE_S)
            sent_at = time.monotonic()
            stepped.append(await run.by_broadcast(30.0))
            steps.append(await asyncio.to_thread(step_response, farm, sent_at))
            await asyncio.sleep(max(sent_at + SETTLE_S - time.monotonic(), 0.0))
        crossing = await from_crossing(reports, feed, count)
    finally:
        await run.api.aclose()
        await nc.close()
    return {
        "triggers_each": count,
        "farm_max_age_s": MAX_AGE_S,
        "nodes_capped_at_30_20": [run.applied[0], run.applied[-2]],
        "cold_api_to_enforced_s": cold,
        "warm_api_to_enforced": percentiles(warm["api"]),
        "warm_broadcast_to_enforced": percentiles(warm["broadcast"]),
        "moving_broadcast_to_enforced": percentiles(moving),
        "farm_process_apply": percentiles(run.process_s),
        "farm_process_waited": percentiles(run.waited_s),
        "gpu_power": gpu_power(steps, stepped),
        "frequency_crossing_to_enforced": percentiles(crossing),
    }


def gpu_power(steps: list[dict[str, float]], stepped: list[float]) -> dict[str, Any]:
    """The sum of GPU power's steps (`step_response`), p50/p99 over the triggers."""
    out: dict[str, Any] = {
        "gpus": "h200",
        "enforcement": asdict(H200),
        "sensor": asdict(SENSORS["H200"]),
        "triggers": len(steps),
        "step_kw": [min(s["step_kw"] for s in steps), max(s["step_kw"] for s in steps)],
        "broadcast_to_enforced": percentiles(stepped),
    }
    for key in steps[0]:
        if key.endswith("_s"):
            out[key] = percentiles([s[key] for s in steps])
        elif key.endswith("_at_1s"):
            q = np.percentile
            values = [s[key] for s in steps]
            out[key] = {"p50": float(q(values, 50)), "p1": float(q(values, 1))}
    out["steps"] = steps
    return out


def crossing_histogram(api: httpx.Client) -> dict[str, float]:
    """The gateway's own `flexgate_fast_crossing_to_enforced_seconds`: its count and mean
    (one observation per farm process and crossing)."""
    name = "flexgate_fast_crossing_to_enforced_seconds"
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(api.get("/metrics").text)
        for s in family.samples
        if s.name in (f"{name}_count", f"{name}_sum")
    }
    count = values.get(f"{name}_count", 0.0)
    return {"count": count, "mean_s": values[f"{name}_sum"] / count if count else float("nan")}


def settled(api: httpx.Client) -> bool:
    doc = api.get("/v1/fast/armed").json()
    return bool(doc["settled"] and doc["generation"] > 0)


def keep_armed(
    api: httpx.Client, gateway_pid: int, farm: Farm, nodes: int, quiet_s: float
) -> dict[str, Any]:
    """Put the mix, wait for every node armed, then a quiet minute's CPU and memory."""
    mix_doc = one_job_per_node(nodes)
    start = time.monotonic()
    api.put("/v1/jobs", json=mix_doc).raise_for_status()
    while not settled(api):
        if time.monotonic() - start > 300:
            raise RuntimeError("the plans were not armed within 300 s")
        time.sleep(0.1)
    armed_s = time.monotonic() - start
    doc = api.get("/v1/fast/armed").json()
    sent = doc["nodes_sent"]
    before = (cpu_s([gateway_pid]), cpu_s(farm.pids), time.monotonic())
    time.sleep(quiet_s)
    after = (cpu_s([gateway_pid]), cpu_s(farm.pids), time.monotonic())
    wall = after[2] - before[2]
    farm_rss = [rss_mib(p) for p in farm.pids]
    return {
        "mix_put_to_all_armed_s": armed_s,
        "armed_states_sent": sent,
        "armed_nodes_per_depth": doc["armed_nodes"],
        "sent_again_while_quiet": api.get("/v1/fast/armed").json()["nodes_sent"] - sent,
        "gateway_rss_mib": rss_mib(gateway_pid),
        "gateway_cpu_share_of_a_core_quiet": (after[0] - before[0]) / wall,
        "farm_rss_mib_per_node": sum(farm_rss) / nodes,
        "farm_cpu_share_of_a_core_per_1000_nodes_quiet": (after[1] - before[1])
        / wall
        / (nodes / 1000),
    }


def ordinary_events(api: httpx.Client, nodes: int) -> list[float]:
    """The same site's ordinary path in the same run, for comparison: events of 30%, 31% and
    32% of the GPU power, each from `POST /v1/events` to every node's answer (planned, stored
    and fanned out; the nodes are warm by then, their originals saved)."""
    baseline_kw = sum(j["gpus"] * j["power_w"] for j in one_job_per_node(nodes)["jobs"]) / 1000
    return [event_to_acked(api, f * baseline_kw)["at_target_s"] for f in (0.30, 0.31, 0.32)]


def one_size(tmp: Path, nodes: int, processes: int, count: int, quiet_s: float) -> dict[str, Any]:
    nats_server, nats_url = start_nats(tmp / f"nats-{nodes}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
        "FLEXGATE_AGENT_TOKEN": TOKEN,
        "FLEXGATE_AGENT_NATS_URL": nats_url,
        "FLEXGATE_AGENT_NATS_TOKEN": NATS_TOKEN,
        "FLEXGATE_AGENT_FAST_SECRET": SECRET,
        # A farm process's thousands of nodes, on a shared machine, may queue a trigger for
        # longer than the default 2 s; the bench measures the delay, not the refusal.
        "FLEXGATE_AGENT_FAST_MAX_AGE_S": str(MAX_AGE_S),
    }
    feed = GridFeed()
    mix_path = tmp / f"mix-{nodes}.json"
    mix_path.write_text(json.dumps(one_job_per_node(nodes)))
    try:
        with Farm(
            nodes, processes, env, mix_path=str(mix_path), telemetry_period_s=30.0, gpus="h200"
        ) as farm:
            gateway, url = serve_gateway(
                gateway_env(
                    tmp / f"gateway-{nodes}.db",
                    transport="nats",
                    nats_url=nats_url,
                    nats_token=NATS_TOKEN,
                    agents=",".join(node_name(i) for i in range(nodes)),
                    overhead_factor="1.0",
                    tracking="false",
                    dispatch_timeout_s="30",
                    fast_depths="10,20,30,40",
                    fast_secret=SECRET,
                    fast_rearm_s="10",
                    frequency_url=feed.url,
                    frequency_mode="threshold",
                    frequency_threshold_hz="49.7",
                    frequency_depth_pct="30",
                    frequency_retrigger_s="1",
                    frequency_hold_s="60",
                )
            )
            try:
                with httpx.Client(
                    base_url=url, timeout=120, headers={"Authorization": f"Bearer {API_TOKEN}"}
                ) as api:
                    while metric(api, "flexgate_agents_known") < nodes:
                        time.sleep(0.5)
                    armed = keep_armed(api, gateway.pid, farm, nodes, quiet_s)
                    fired = asyncio.run(triggers(url, nats_url, nodes, count, farm, feed))
                    fired["gateway_crossing_histogram"] = crossing_histogram(api)
                    fired["ordinary_event_at_target_s"] = ordinary_events(api, nodes)
            finally:
                gateway.terminate()
                gateway.wait(60)
    finally:
        feed.close()
        nats_server.terminate()
        nats_server.wait(10)
    return {"nodes": nodes, "farm_processes": processes, **armed, **fired}


def finite(value: Any) -> Any:
    """`value` with every infinite or undefined number as null (strict JSON: a sum that did not
    reach 90% within the read is infinitely late, and the percentiles over it undefined)."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--triggers", type=int, default=20)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--quiet-s", type=float, default=60.0, help="CPU measured over [s]")
    args = parser.parse_args()
    results = []
    alone = model_alone()
    print(json.dumps(alone), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for nodes in (int(s) for s in args.sizes.split(",")):
            load = os.getloadavg()[0]
            result = one_size(Path(tmp), nodes, args.processes, args.triggers, args.quiet_s)
            result["load_before"], result["load_after"] = load, os.getloadavg()[0]
            print(json.dumps(result), flush=True)
            results.append(result)
            doc = {  # written after each size: a later one that fails loses only itself
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "cores": os.cpu_count(),
                "targets": {
                    "p99_at_1000_s": 0.1,
                    "p99_at_10000_s": 0.5,
                    "gpu_power_90pct_s": 1.0,
                },
                "power_model_alone": alone,
                "sizes": results,
            }
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "fast.json").write_text(json.dumps(finite(doc), indent=2) + "\n")


if __name__ == "__main__":
    main()
