"""Soak: mixed API traffic from 50 concurrent clients while the gateway fans out to 1000 nodes
(results/soak.json; docs/reliability.md).

Three processes: simulated nodes (`bench/servers.py farm`), the gateway (`flexgate gateway`)
and this one, the clients. An event is active throughout, so every reconciliation
(`--reconcile-s`) sends the desired state to every node: a 1000-node fan-out each time.
Meanwhile the clients, each in a loop with no pause, send a fixed mix: quotes, health, event
and plan reads, the event list as a dashboard pages it (the last 50, `?limit=50`: the soak
creates hundreds of events a minute, and the whole list grows with every one), metrics, job
list, an event created and cancelled, a malformed event (422 expected). One more client
polls `/v1/site` and `/v1/sync` once a second, as a dashboard does
(each asks every node for telemetry).

Then the clients stop and the fan-outs go on alone for `--fan-out-s`, and longer (up to ten
times as long) until at least `--fan-outs-alone` of them are counted, so that a loaded machine's
slow fan-outs still give that phase something to measure: the gateway's resident
memory is sampled against the count of fan-outs (its `/metrics`), to show whether repeated
fan-outs grow it: the growth from the second quarter of that phase to the last, and the
fitted slope per 100 fan-outs (the first quarter warms up).

Reported: requests, errors (any answer but the expected one, or no answer), p50/p99 by kind
and overall; the memory figures of both phases. Exit status 1 on any error.

With `--transport nats` the gateway reaches the nodes over NATS instead (docs/nats.md): a
`nats-server -js` of the soak's own and the agent farm `bench/farm.py` (its nodes publish their
telemetry summaries every 5 s, which the gateway aggregates; nothing is asked of them for
`/v1/site` or `/v1/sync`); results/soak_nats.json.

    python bench/soak.py [--seconds 60] [--clients 50] [--nodes 1000] [--reconcile-s 0.5]
                         [--fan-out-s 90] [--fan-outs-alone 2] [--transport http|nats]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import httpx
import numpy as np
from farm import Farm, node_name
from gateway_bench import (
    API_TOKEN,
    RESULTS,
    TOKEN,
    big_mix,
    gateway_env,
    serve,
    serve_gateway,
)  # bench/ is on sys.path
from nats_bench import NATS_TOKEN, start_nats
from prometheus_client.parser import text_string_to_metric_families

from flexgate.serve import free_port

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
#: (kind, weight): what the clients send, in these proportions.
MIX = (
    ("quote", 35),
    ("health", 10),
    ("events", 10),
    ("event", 10),
    ("plan", 10),
    ("metrics", 10),
    ("jobs", 5),
    ("create_cancel", 5),
    ("invalid", 5),
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


def fan_outs(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "flexgate_fan_outs_total":
                return int(sample.value)
    raise RuntimeError("the gateway's /metrics has no flexgate_fan_outs_total")


class Recorder:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {}
        self.errors: list[str] = []

    async def call(
        self,
        session: aiohttp.ClientSession,
        kind: str,
        method: str,
        url: str,
        expect: int,
        *,
        parse: bool = False,
        **kw,
    ) -> dict | None:
        """One request, its latency to the whole body received; the body parsed only when the
        caller uses it (`parse`): the clients share this process's one core with each other,
        and a quote of 1,000 jobs is 1.3 MB of JSON (34 ms to parse)."""
        start = time.perf_counter()
        try:
            async with session.request(method, url, **kw) as answer:
                body = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return None
        self.latency.setdefault(kind, []).append(time.perf_counter() - start)
        if status != expect:
            self.errors.append(f"{kind}: HTTP {status} (expected {expect}): {body[:200]!r}")
            return None
        return json.loads(body) if parse and body and body[:1] in b"[{" else None


async def clients(url: str, event: dict, count: int, seconds: float, rec: Recorder) -> float:
    stop = time.perf_counter() + seconds
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    reads = {
        "health": "/health",
        "events": "/v1/events?limit=50",
        "event": f"/v1/events/{event['id']}",
        "plan": f"/v1/plans/{event['plan_id']}",
        "metrics": "/metrics",
        "jobs": "/v1/jobs",
    }

    async def client(seed: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(seed)
        while time.perf_counter() < stop:
            kind = rng.choices(kinds, weights)[0]
            if kind == "quote":
                body = {"reduction_kw": rng.choice([10.0, 50.0, 100.0, 250.0]), "window_s": 3600}
                await rec.call(session, kind, "POST", f"{url}/v1/quotes", 200, json=body)
            elif kind in reads:
                await rec.call(session, kind, "GET", f"{url}{reads[kind]}", 200)
            elif kind == "create_cancel":
                body = {"reduction_kw": 20.0, "start": later, "duration_s": 600}
                made = await rec.call(
                    session,
                    "create",
                    "POST",
                    f"{url}/v1/events",
                    201,
                    json=body,
                    headers=AUTH,
                    parse=True,
                )
                if made is not None:
                    made_url = f"{url}/v1/events/{made['id']}"
                    await rec.call(session, "cancel", "DELETE", made_url, 200, headers=AUTH)
            else:
                body = {"reduction_kw": -1, "start": "yesterday", "duration_s": 0}
                await rec.call(
                    session, kind, "POST", f"{url}/v1/events", 422, json=body, headers=AUTH
                )

    async def dashboard(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop:
            await rec.call(session, "site", "GET", f"{url}/v1/site", 200)
            await rec.call(session, "sync", "GET", f"{url}/v1/sync", 200)
            await asyncio.sleep(1.0)

    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=count + 1)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        begin = time.perf_counter()
        await asyncio.gather(dashboard(session), *(client(i, session) for i in range(count)))
        return time.perf_counter() - begin


def percentiles(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "p50_ms": 1000 * float(np.percentile(values, 50)),
        "p99_ms": 1000 * float(np.percentile(values, 99)),
    }


def counted(samples: list[tuple[float, float, int]]) -> int:
    """The fan-outs between the first sample and the last."""
    return samples[-1][2] - samples[0][2] if samples else 0


def memory_report(samples: list[tuple[float, float, int]]) -> dict[str, object]:
    """RSS [MB] against fan-outs: growth from the second quarter to the last, and the slope."""
    rss = np.array([s[1] for s in samples])
    count = np.array([s[2] for s in samples], dtype=float)
    quarter = max(len(samples) // 4, 1)
    second, last = rss[quarter : 2 * quarter], rss[-quarter:]
    warm = slice(quarter, None)  # the first quarter warms up (caches, connections)
    slope = float(np.polyfit(count[warm], rss[warm], 1)[0]) if np.ptp(count[warm]) > 0 else 0.0
    return {
        "samples": len(samples),
        "fan_outs": counted(samples),
        "rss_start_mb": float(rss[0]),
        "rss_second_quarter_median_mb": float(np.median(second)),
        "rss_last_quarter_median_mb": float(np.median(last)),
        "growth_mb": float(np.median(last) - np.median(second)),
        "slope_mb_per_100_fan_outs": 100 * slope,
        "rss_max_mb": float(rss.max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--reconcile-s", type=float, default=0.5)
    parser.add_argument("--fan-out-s", type=float, default=90.0)
    parser.add_argument("--fan-outs-alone", type=int, default=2)
    parser.add_argument("--transport", choices=["http", "nats"], default="http")
    parser.add_argument("--out", type=Path, default=None, help="default results/soak[_nats].json")
    args = parser.parse_args()
    out_path = args.out or RESULTS / ("soak.json" if args.transport == "http" else "soak_nats.json")
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    mix = big_mix(args.nodes, args.nodes)
    with nodes_for_gateway(args.transport, tmp, mix, args.nodes) as reach:
        return soak(args, tmp, mix, reach, out_path)


@contextlib.contextmanager
def nodes_for_gateway(transport: str, tmp: Path, mix: dict, count: int) -> Iterator[dict[str, str]]:
    """The simulated nodes, running; yields the gateway's settings that reach them."""
    if transport == "http":
        (tmp / "mix.json").write_text(json.dumps(mix))
        port = free_port()
        args = ["bench/servers.py", "farm", str(port), str(count), TOKEN, str(tmp / "mix.json")]
        farm = serve(args, f"http://127.0.0.1:{port}/nodes/n0000/health")
        try:
            nodes = ",".join(f"http://127.0.0.1:{port}/nodes/n{i:04d}" for i in range(count))
            yield {"agents": nodes}
        finally:
            farm.terminate()
            farm.wait()
        return
    for i, job in enumerate(mix["jobs"][:count]):  # bench/farm.py's node names
        job["placement"][0]["node"] = node_name(i)
    (tmp / "mix.json").write_text(json.dumps(mix))
    broker, url = start_nats(tmp / "nats")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
        "FLEXGATE_AGENT_TOKEN": TOKEN,
        "FLEXGATE_AGENT_NATS_URL": url,
        "FLEXGATE_AGENT_NATS_TOKEN": NATS_TOKEN,
    }
    try:
        with Farm(count, 2, env, mix_path=str(tmp / "mix.json")):
            yield {
                "transport": "nats",
                "nats_url": url,
                "nats_token": NATS_TOKEN,
                "agents": ",".join(node_name(i) for i in range(count)),
            }
    finally:
        broker.terminate()
        broker.wait()


def soak(args: argparse.Namespace, tmp: Path, mix: dict, reach: dict, out_path: Path) -> int:
    env = gateway_env(
        tmp / "gateway.db",
        reconcile_period_s=str(args.reconcile_s),
        lease_s=str(max(30.0, 10 * args.reconcile_s)),
        dispatch_timeout_s="20",
        **reach,
    )
    gateway, url = serve_gateway(env)
    try:
        with httpx.Client(base_url=url, timeout=60, headers=AUTH) as api:
            api.put("/v1/jobs", json=mix).raise_for_status()
            start = datetime.now(UTC).isoformat()
            body = {"reduction_kw": 100.0, "start": start, "duration_s": args.seconds + 600}
            event = api.post("/v1/events", json=body).json()
            while not (event := api.get(f"/v1/events/{event['id']}").json())["plan_id"]:
                time.sleep(0.05)
        samples: list[tuple[float, float, int]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                samples.append((time.monotonic(), rss_mb(gateway.pid), fan_outs(url)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rec = Recorder()
        elapsed = asyncio.run(clients(url, event, args.clients, args.seconds, rec))
        under_load = len(samples)
        time.sleep(args.fan_out_s)  # the fan-outs alone
        deadline = time.monotonic() + 9 * args.fan_out_s
        while counted(samples[under_load:]) < args.fan_outs_alone and time.monotonic() < deadline:
            time.sleep(0.5)
        done.set()
        sampler.join()
    finally:
        gateway.terminate()
        gateway.wait()
    everything = [v for values in rec.latency.values() for v in values]
    out = {
        "benchmark": "soak",
        "transport": args.transport,
        "load_average_after": os.getloadavg(),
        "seconds": elapsed,
        "clients": args.clients,
        "nodes": args.nodes,
        "reconcile_period_s": args.reconcile_s,
        "requests": len(everything) + len(rec.errors),
        "requests_per_s": (len(everything) + len(rec.errors)) / elapsed,
        "errors": len(rec.errors),
        "first_errors": rec.errors[:10],
        "latency": percentiles(everything),
        "by_kind": {kind: percentiles(values) for kind, values in sorted(rec.latency.items())},
        "memory_under_load": memory_report(samples[:under_load]),
        "memory_fan_outs_alone": memory_report(samples[under_load:]),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    shown = ("requests", "errors", "latency", "memory_under_load", "memory_fan_outs_alone")
    print(json.dumps({k: out[k] for k in shown}, indent=2))
    return 1 if rec.errors else 0


if __name__ == "__main__":
    sys.exit(main())
