"""Load a generated dataset into authio through the public API.

    python bench/load.py --base-url http://127.0.0.1:8080 --api-key $AUTHIO_API_KEY \
        --dataset bench/data/medium [--store-id store_... | (creates a store)] [--concurrency 4]

Reads ``tuples.jsonl``, sends ``POST /v1/stores/{id}/write`` in batches of up to 1,000
writes with ``--concurrency`` requests in flight, retries 429/5xx/connection errors with
back-off, reports tuples/s and the final revision, prints the store id and writes
``store.json`` (``{"store_id","base_url","revision"}``) into the dataset directory for
``bench_http.py`` and the locust scenarios.

Without ``--api-key``/``$AUTHIO_API_KEY`` but with ``--bootstrap-token`` (or
``$AUTHIO_BOOTSTRAP_TOKEN``) it first calls ``POST /v1/bootstrap`` to create a tenant,
project and API key, and prints the key (it is not written to store.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

RETRY_STATUSES = {429, 500, 502, 503, 504}


class ApiError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:500].decode(errors='replace')}")
        self.status = status


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any,
               headers: dict[str, str], retries: int) -> dict[str, Any]:
    delay = 0.2
    for attempt in range(retries + 1):
        try:
            async with session.request(method, url, data=orjson.dumps(body),
                                       headers=headers) as resp:
                raw = await resp.read()
                if resp.status < 300:
                    return orjson.loads(raw) if raw else {}
                if resp.status not in RETRY_STATUSES or attempt == retries:
                    raise ApiError(resp.status, raw)
                retry_after = resp.headers.get("Retry-After")
                wait = float(retry_after) if retry_after and retry_after.isdigit() else delay
        except (TimeoutError, aiohttp.ClientConnectionError):
            if attempt == retries:
                raise
            wait = delay
        await asyncio.sleep(wait)
        delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


def read_tuples(path: Path, limit: int | None) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            t = orjson.loads(line)
            rows.append({"object": t["object"], "relation": t["relation"], "user": t["user"]})
            if limit and len(rows) >= limit:
                break
    return rows


async def run(args: argparse.Namespace) -> int:
    base = args.base_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=max(args.concurrency, 1) + 1)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        api_key = args.api_key
        if not api_key:
            if not args.bootstrap_token:
                print("need --api-key/AUTHIO_API_KEY or --bootstrap-token", file=sys.stderr)
                return 2
            boot = await call(
                session, "POST", f"{base}/v1/bootstrap",
                {"tenant_name": args.tenant_name, "project_name": "bench",
                 "environment": "development"},
                {"x-service-bootstrap-token": args.bootstrap_token,
                 "Content-Type": "application/json"},
                args.retries,
            )
            api_key = boot["api_key"]["secret"]
            print(f"bootstrapped api key {boot['api_key']['id']}: export "
                  f"AUTHIO_API_KEY={api_key}", file=sys.stderr)
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

        store_id = args.store_id
        if not store_id:
            name = args.store_name or f"bench-{args.dataset.name}-{int(time.time())}"
            store = await call(session, "POST", f"{base}/v1/stores", {"name": name},
                               headers, args.retries)
            store_id = store["id"]
            print(f"created store {store_id} ({name})", file=sys.stderr)

        tuples = read_tuples(args.dataset / "tuples.jsonl", args.limit)
        if args.skip:
            tuples = tuples[args.skip:]
        batches = [tuples[i:i + args.batch_size]
                   for i in range(0, len(tuples), args.batch_size)]
        url = f"{base}/v1/stores/{store_id}/write"
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(batches)):
            queue.put_nowait(i)
        state = {"written": 0, "revision": 0, "done": 0}
        completed: set[int] = set()
        latencies: list[float] = []
        failures: list[str] = []
        t0 = time.perf_counter()

        async def writer() -> None:
            while not failures:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                s = time.perf_counter()
                try:
                    res = await call(session, "POST", url, {"writes": batches[i], "deletes": []},
                                     headers, args.retries)
                except (TimeoutError, ApiError, aiohttp.ClientError) as exc:
                    first = args.skip + i * args.batch_size
                    failures.append(f"batch {i} (tuples {first}..{first + len(batches[i]) - 1})"
                                    f": {exc}")
                    return
                latencies.append(time.perf_counter() - s)
                state["written"] += int(res.get("written", len(batches[i])))
                state["revision"] = max(state["revision"], int(res.get("revision", 0)))
                state["done"] += 1
                completed.add(i)

        async def progress() -> None:
            while True:
                await asyncio.sleep(5)
                el = time.perf_counter() - t0
                print(f"  {state['done']}/{len(batches)} batches, {state['written']:,} tuples, "
                      f"{state['written'] / el:,.0f} tuples/s", file=sys.stderr)

        prog = asyncio.ensure_future(progress())
        await asyncio.gather(*(writer() for _ in range(args.concurrency)))
        prog.cancel()
        elapsed = time.perf_counter() - t0

    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000 if latencies else float("nan")
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000 \
        if latencies else float("nan")
    print(f"wrote {state['written']:,} tuples in {state['done']} batches in {elapsed:.1f}s: "
          f"{state['written'] / elapsed:,.0f} tuples/s (batch p50 {p50:.0f} ms, p99 {p99:.0f} ms), "
          f"concurrency {args.concurrency}; final revision {state['revision']}", file=sys.stderr)
    if failures:
        for f in failures:
            print(f"FAILED {f}", file=sys.stderr)
        first_missing = next(i for i in range(len(batches)) if i not in completed)
        print(f"resume with --store-id {store_id} --skip "
              f"{args.skip + first_missing * args.batch_size} (later batches may already be "
              "written: the service may reject re-written tuples)", file=sys.stderr)
    out = {"store_id": store_id, "base_url": base, "revision": state["revision"]}
    (args.dataset / "store.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2)
                                              + b"\n")
    print(store_id)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="load a bench dataset through the authio API")
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default=os.environ.get("AUTHIO_API_KEY"))
    ap.add_argument("--bootstrap-token", default=os.environ.get("AUTHIO_BOOTSTRAP_TOKEN"),
                    help="create a tenant/project/key via POST /v1/bootstrap if no API key")
    ap.add_argument("--tenant-name", default="authio-bench")
    ap.add_argument("--dataset", type=Path,
                    default=Path(os.environ.get("AUTHIO_DATASET", "bench/data/medium")))
    ap.add_argument("--store-id", default=None, help="write into this store (default: create)")
    ap.add_argument("--store-name", default=None)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1000, help="writes per call (max 1,000)")
    ap.add_argument("--retries", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--limit", type=int, default=None, help="only the first N tuples")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N tuples (resume)")
    args = ap.parse_args(argv)
    if not 1 <= args.batch_size <= 1000:
        ap.error("--batch-size must be within 1..1000")
    if not (args.dataset / "tuples.jsonl").exists():
        ap.error(f"{args.dataset}/tuples.jsonl not found; run bench/dataset.py first")
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run(args))
    return uvloop.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
