"""Checks per second through the Python client (``clients/python``, issue 25): the async client
with check coalescing on (concurrent ``check`` calls of one event-loop tick sent as one
``batch-check``) against off (one ``POST /v1/stores/{id}/check`` per call), at 1, 16 and 256
concurrent callers, against a running service.

    # terminal 1: the service (prints SERVICE_BOOTSTRAP_TOKEN for this run ...)
    make run
    # terminal 2: a new project, a store of --tuples tuples, then the runs (~1 min)
    .venv/bin/python bench/bench_client.py --base-url http://127.0.0.1:8080 --bootstrap-token <token>
    # or with a key of an existing project (full access, or authz:check + authz:write):
    .venv/bin/python bench/bench_client.py --base-url ... --api-key sk_live_...
    # options: --callers 1,16,256 --seconds 5 --warmup 1 --rounds 1 --max-connections N --json out.json
    #          --reference: also single checks through a bare aiohttp client (the HTTP client's share)

What it measures: ``--callers`` tasks on one event loop (one client, one ``httpx.AsyncClient``
whose pool allows as many connections as callers, or ``--max-connections``), each awaiting ``client.check(...)`` in a
closed loop over a fixed list of checks (half allowed: ``doc:<i>#viewer@user:<j>`` written
directly, half not), for ``--seconds`` after ``--warmup``; coalescing on and off alternate in
each round. Reported per (mode, callers): checks/s, HTTP requests/s, mean checks per request,
p50 and p99 of one ``check`` call (ms). The client and the service share the machine (on the
2-core dev VM: one core each, more or less), so the figures are the client's and the server's
costs together, which is what an application sees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients" / "python" / "src"))

from authio_client import AsyncAuthioClient, AuthioClient


@dataclass
class Figure:
    mode: str
    callers: int
    checks_per_s: float
    requests_per_s: float
    checks_per_request: float
    p50_ms: float
    p99_ms: float


def project_key(base_url: str, api_key: str | None, bootstrap_token: str | None) -> str:
    if api_key:
        return api_key
    if not bootstrap_token:
        raise SystemExit("give --api-key or --bootstrap-token (the one `make run` printed)")
    r = httpx.post(base_url.rstrip("/") + "/v1/bootstrap", headers={"x-service-bootstrap-token": bootstrap_token},
                   json={"tenant_name": "bench", "project_name": "bench-client", "environment": "test"})
    r.raise_for_status()
    return str(r.json()["api_key"]["secret"])


def prepare(base_url: str, key: str, tuples: int) -> tuple[str, list[tuple[str, str, str]]]:
    """A new store with ``tuples`` direct grants, and the checks to cycle over (half allowed)."""
    with AuthioClient(base_url, key) as c:
        store = c.create_store("bench-client")
        grants = [(f"doc:{i}", "viewer", f"user:{i % 97}") for i in range(tuples)]
        revision = None
        for i in range(0, len(grants), 1000):
            revision = c.write_tuples(store.id, writes=grants[i:i + 1000]).revision
        checks = [g for g in grants[:500]] + [(f"doc:{i}", "viewer", f"user:{i % 97 + 1}") for i in range(500)]
        assert revision is not None
        assert c.check(store.id, *checks[0], at_least_revision=revision).allowed
    return store.id, checks


async def run(base_url: str, key: str, store: str, checks: list[tuple[str, str, str]], *, coalesce: bool,
              callers: int, seconds: float, warmup: float, max_connections: int | None) -> Figure:
    sent = 0

    async def count(_: httpx.Request) -> None:
        nonlocal sent
        sent += 1

    http = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=max_connections or callers,
                                                                 max_keepalive_connections=max_connections or callers),
                             event_hooks={"request": [count]})
    client = AsyncAuthioClient(base_url, key, http=http, coalesce=coalesce)
    done = 0
    latencies: list[float] = []
    measuring = False
    stop = False

    async def caller(n: int) -> None:
        nonlocal done
        i = n
        while not stop:
            o, r, u = checks[i % len(checks)]
            i += callers
            t0 = time.perf_counter()
            result = await client.check(store, o, r, u)
            if measuring:
                done += 1
                latencies.append(time.perf_counter() - t0)
            assert result.allowed == (u == f"user:{int(o[4:]) % 97}"), (o, u, result)

    tasks = [asyncio.create_task(caller(n)) for n in range(callers)]
    await asyncio.sleep(warmup)
    measuring, sent_before, started = True, sent, time.perf_counter()
    await asyncio.sleep(seconds)
    measuring, elapsed, requests = False, time.perf_counter() - started, sent - sent_before
    stop = True
    await asyncio.gather(*tasks)
    await client.aclose()
    await http.aclose()
    lat = sorted(latencies)
    return Figure("on" if coalesce else "off", callers, done / elapsed, requests / elapsed,
                  done / max(requests, 1), statistics.median(lat) * 1000,
                  lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000)


async def run_raw(base_url: str, key: str, store: str, checks: list[tuple[str, str, str]], *, callers: int,
                  seconds: float, warmup: float) -> Figure:
    """The reference: single checks sent with a bare aiohttp client (no authio client at all), to
    tell the HTTP client's cost per request from the service's."""
    import aiohttp

    url = f"{base_url.rstrip('/')}/v1/stores/{store}/check"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    done, latencies, measuring, stop = 0, [], False, False
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers)) as http:
        async def caller(n: int) -> None:
            nonlocal done
            i = n
            while not stop:
                o, r, u = checks[i % len(checks)]
                i += callers
                t0 = time.perf_counter()
                body = json.dumps({"tuple_key": {"object": o, "relation": r, "user": u}})
                async with http.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
                if measuring:
                    done += 1
                    latencies.append(time.perf_counter() - t0)

        tasks = [asyncio.create_task(caller(n)) for n in range(callers)]
        await asyncio.sleep(warmup)
        measuring, started = True, time.perf_counter()
        await asyncio.sleep(seconds)
        measuring, elapsed = False, time.perf_counter() - started
        stop = True
        await asyncio.gather(*tasks)
    lat = sorted(latencies)
    return Figure("raw", callers, done / elapsed, done / elapsed, 1.0, statistics.median(lat) * 1000,
                  lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key")
    parser.add_argument("--bootstrap-token")
    parser.add_argument("--callers", default="1,16,256")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tuples", type=int, default=5000)
    parser.add_argument("--max-connections", type=int, help="httpx pool size (default: one per caller)")
    parser.add_argument("--reference", action="store_true",
                        help="also single checks through a bare aiohttp client (mode 'raw')")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    key = project_key(args.base_url, args.api_key, args.bootstrap_token)
    store, checks = prepare(args.base_url, key, args.tuples)
    figures: list[Figure] = []
    for _ in range(args.rounds):
        for callers in (int(c) for c in args.callers.split(",")):
            for mode in ("raw", "off", "on") if args.reference else ("off", "on"):
                if mode == "raw":
                    f = asyncio.run(run_raw(args.base_url, key, store, checks, callers=callers,
                                            seconds=args.seconds, warmup=args.warmup))
                else:
                    f = asyncio.run(run(args.base_url, key, store, checks, coalesce=mode == "on", callers=callers,
                                        seconds=args.seconds, warmup=args.warmup,
                                        max_connections=args.max_connections))
                figures.append(f)
                print(f"coalesce {f.mode:>3}  callers {f.callers:>4}  {f.checks_per_s:>9,.0f} checks/s  "
                      f"{f.requests_per_s:>7,.0f} req/s  {f.checks_per_request:>6.1f} checks/req  "
                      f"p50 {f.p50_ms:>7.2f} ms  p99 {f.p99_ms:>7.2f} ms", flush=True)
    print()
    for callers in sorted({f.callers for f in figures}):
        on = statistics.median(f.checks_per_s for f in figures if f.callers == callers and f.mode == "on")
        off = statistics.median(f.checks_per_s for f in figures if f.callers == callers and f.mode == "off")
        line = f"callers {callers:>4}: coalescing on / off = {on / off:.2f}x ({on:,.0f} / {off:,.0f} checks/s)"
        raw = [f.checks_per_s for f in figures if f.callers == callers and f.mode == "raw"]
        if raw:
            line += f"; on / raw aiohttp singles = {on / statistics.median(raw):.2f}x"
        print(line)
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")


if __name__ == "__main__":
    main()
