"""Write-to-visible latency: how soon after a write returns does the engine answer with it?

    python bench/bench_follow.py --base-url http://127.0.0.1:8080 --api-key sk_... [--writes 300]
    # with separate deployments: --engine-url http://127.0.0.1:8081

Creates a store, then repeatedly writes one new tuple through the control plane and polls the
engine's /check for it WITHOUT a consistency token (that path is what LISTEN and the change log
serve; with ``at_least_revision`` a check waits by design). Latency is from the write's response
to the first allowed answer. Reports p50, p99 and max in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--engine-url", default=None, help="defaults to --base-url")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    engine = (args.engine_url or args.base_url).rstrip("/")
    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"}

    latencies: list[float] = []
    polls: list[int] = []
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(f"{base}/v1/stores", json={"name": "bench-follow"}) as r:
            assert r.status == 201, await r.text()
            store = (await r.json())["id"]
        for i in range(args.writes):
            key = {"object": f"doc:{i}", "relation": "viewer", "user": f"user:{i}"}
            async with http.post(f"{base}/v1/stores/{store}/write", json={"writes": [key]}) as r:
                assert r.status == 200, await r.text()
            t0 = time.perf_counter()
            n = 0
            while True:
                n += 1
                async with http.post(f"{engine}/v1/stores/{store}/check",
                                     json={"tuple_key": key}) as r:
                    body = await r.json()
                assert r.status == 200, body
                if body["allowed"]:
                    break
            latencies.append((time.perf_counter() - t0) * 1000)
            polls.append(n)
    latencies.sort()
    result = {
        "writes": args.writes,
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 3),
        "max_ms": round(latencies[-1], 3),
        "visible_on_first_check": sum(1 for n in polls if n == 1),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k:24} {v}" for k, v in result.items()))


if __name__ == "__main__":
    asyncio.run(main())
