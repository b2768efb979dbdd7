"""Webhooks and audit streams end to end (issue 20's figures): events per second through a stream to
a local receiver and to JetStream with the order verified, webhook deliveries per second, the
latency from commit to receipt at light load (p50/p99), and audit writes with ten streams and ten
endpoints subscribed against none.

    python bench/bench_outbound.py [--events 100000] [--deliveries 5000] [--writes 2000]
                                   [--nats] [--json PATH]

One ``authio serve control-plane`` (receivers on loopback allowed, batches of 500) on a recreated
database ``authio_bench_outbound``; receivers are aiohttp servers in this process answering 200
and noting when each event arrived. Events for the throughput runs are written straight into
``audit_events`` (one transaction per 1,000: the service's own writes are not what is measured
there, the streams paused meanwhile and timed from their resumption); the latency and write
runs go through the API (``POST /v1/users``: one audit event
each). ``--nats`` also streams to a private ``nats-server -js`` (the machine's package).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from aiohttp import web

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_identity import (  # noqa: E402  (the bench's own helpers, beside this file)
    ensure_database,
    log,
    migrate,
    server_env,
    start_servers,
    with_db,
)

from common.ids import new_id  # noqa: E402

DB = "authio_bench_outbound"
TOKEN = "bench-outbound-" + secrets.token_hex(16)


class Receiver:
    """Notes the arrival time of every event id (stream batches and webhook deliveries)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.order: list[str] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        now = time.monotonic()
        events = body["events"] if "events" in body else [body]
        for e in events:
            self.arrived.setdefault(e["id"], now)
            self.order.append(e["id"])
        return web.Response(status=200)

    async def start(self) -> web.AppRunner:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/in"  # type: ignore[union-attr]
        return runner


async def bootstrap(url: str) -> tuple[str, str]:
    async with aiohttp.ClientSession() as http, http.post(
            url + "/v1/bootstrap", headers={"X-Service-Bootstrap-Token": TOKEN},
            json={"tenant_name": "bench outbound", "project_name": "outbound",
                  "environment": "bench"}) as r:
        doc = await r.json()
        return doc["project"]["id"], doc["api_key"]["secret"]


async def write_events(db_url: str, project_id: str, n: int, action: str) -> tuple[list[str], float]:
    """``n`` events written straight into the log, 1,000 per transaction, then analyzed; their
    ids and when the last one committed."""
    conn = await asyncpg.connect(db_url)
    ids = [new_id("evt") for _ in range(n)]
    try:
        for i in range(0, n, 1000):
            chunk = ids[i:i + 1000]
            await conn.execute(
                """INSERT INTO audit_events (id, action, actor_type, actor_id, project_id,
                                             description, metadata)
                   SELECT id, $2, 'system', 'bench', $3, 'bench event', '{"n": 1}'::jsonb
                   FROM unnest($1::text[]) AS id""", chunk, action, project_id)
        committed = time.monotonic()
        # What autovacuum does after a bulk load; without statistics the planner sorts every
        # event after a stream's position instead of merging the partitions' index order.
        await conn.execute("ANALYZE audit_events")
        return ids, committed
    finally:
        await conn.close()


async def wait_all(receiver: Receiver, ids: list[str], within: float) -> float:
    deadline = time.monotonic() + within
    wanted = set(ids)
    while not wanted <= receiver.arrived.keys():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(wanted - receiver.arrived.keys())} events never arrived")
        await asyncio.sleep(0.05)
    return max(receiver.arrived[i] for i in ids)


async def api(http: aiohttp.ClientSession, url: str, key: str, method: str, path: str,
              body: Any = None) -> Any:
    async with http.request(method, url + path, json=body,
                            headers={"Authorization": f"Bearer {key}"}) as r:
        doc = await r.json()
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {doc}")
        return doc


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def run(args: argparse.Namespace, url: str, db_url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    project_id, key = await bootstrap(url)
    async with aiohttp.ClientSession() as http:
        # 1. Stream throughput, order verified.
        rx = Receiver()
        runner = await rx.start()
        stream = await api(http, url, key, "POST", "/v1/audit/streams", {
            "destination": {"type": "webhook", "url": rx.url}, "actions": ["bench.stream"]})
        # Paused while the events are written (the writer is slower than the stream), then
        # resumed: the time is the stream's alone.
        await api(http, url, key, "PATCH", f"/v1/audit/streams/{stream['id']}",
                  {"status": "paused"})
        ids, _ = await write_events(db_url, project_id, args.events, "bench.stream")
        started = time.monotonic()
        await api(http, url, key, "PATCH", f"/v1/audit/streams/{stream['id']}",
                  {"status": "active"})
        last = await wait_all(rx, ids, within=600)
        wanted = set(ids)
        in_order = [i for i in dict.fromkeys(rx.order) if i in wanted] == ids
        out["stream_events_per_s"] = round(len(ids) / (last - started))
        out["stream_in_order"] = in_order
        log(f"stream: {len(ids)} events in {last - started:.1f} s = {out['stream_events_per_s']}/s, "
            f"in order: {in_order}, duplicates: {len(rx.order) - len(set(rx.order))}")
        await runner.cleanup()

        # 2. Webhook deliveries per second.
        rx = Receiver()
        runner = await rx.start()
        await api(http, url, key, "POST", "/v1/webhook-endpoints",
                  {"url": rx.url, "events": ["bench.webhook"]})
        ids, _ = await write_events(db_url, project_id, args.deliveries, "bench.webhook")
        last = await wait_all(rx, ids, within=600)
        first = min(rx.arrived[i] for i in ids)
        out["webhook_deliveries_per_s"] = round(len(ids) / (last - first))
        log(f"webhooks: {len(ids)} deliveries in {last - first:.1f} s (first to last) = "
            f"{out['webhook_deliveries_per_s']}/s")
        await runner.cleanup()

        # 3. Latency at light load: a user every 50 ms, a stream and an endpoint subscribed.
        rs, rw = Receiver(), Receiver()
        runners = [await rs.start(), await rw.start()]
        await api(http, url, key, "POST", "/v1/audit/streams",
                  {"destination": {"type": "webhook", "url": rs.url}, "actions": ["user.created"]})
        await api(http, url, key, "POST", "/v1/webhook-endpoints",
                  {"url": rw.url, "events": ["user.created"]})
        committed: dict[str, float] = {}
        for _ in range(args.latency_events):
            doc = await api(http, url, key, "POST", "/v1/users",
                            {"email": f"lat-{secrets.token_hex(6)}@example.com"})
            committed[doc["id"]] = time.monotonic()
            await asyncio.sleep(0.05)
        conn = await asyncpg.connect(db_url)
        by_user = {r["target_id"]: r["id"] for r in await conn.fetch(
            "SELECT id, target_id FROM audit_events WHERE project_id = $1 AND action = 'user.created'",
            project_id)}
        await conn.close()
        event_ids = [by_user[u] for u in committed]
        await wait_all(rs, event_ids, 60)
        await wait_all(rw, event_ids, 60)
        for name, rx_ in (("stream", rs), ("webhook", rw)):
            lat = [(rx_.arrived[by_user[u]] - t) * 1000 for u, t in committed.items()]
            out[f"{name}_latency_ms"] = {"p50": round(statistics.median(lat)),
                                         "p99": round(pct(lat, 99))}
            log(f"{name} latency at light load: p50 {out[f'{name}_latency_ms']['p50']} ms, "
                f"p99 {out[f'{name}_latency_ms']['p99']} ms")
        for r in runners:
            await r.cleanup()

        # 4. Audit writes: none subscribed against ten streams and ten endpoints.
        async def writes(label: str) -> float:
            sem = asyncio.Semaphore(8)

            async def one() -> None:
                async with sem:
                    await api(http, url, key, "POST", "/v1/users",
                              {"email": f"w-{secrets.token_hex(8)}@example.com"})
            t = time.monotonic()
            await asyncio.gather(*(one() for _ in range(args.writes)))
            rate = args.writes / (time.monotonic() - t)
            log(f"audit writes ({label}): {rate:.0f}/s")
            return rate

        project_id, key = await bootstrap(url)  # a project with nothing subscribed
        base = await writes("nothing subscribed")
        sinks = [Receiver() for _ in range(20)]
        runners = [await s.start() for s in sinks]
        made = []
        for s in sinks[:10]:
            made.append(("/v1/audit/streams", await api(
                http, url, key, "POST", "/v1/audit/streams",
                {"destination": {"type": "webhook", "url": s.url}, "actions": ["bench.other"]})))
        for s in sinks[10:]:
            made.append(("/v1/webhook-endpoints", await api(
                http, url, key, "POST", "/v1/webhook-endpoints",
                {"url": s.url, "events": ["bench.other"]})))
        idle = await writes("10 streams, 10 endpoints, subscribed to other actions")
        for path, doc in made:  # now to everything: every write is delivered 20 times
            await api(http, url, key, "PATCH", f"{path}/{doc['id']}",
                      {"actions": None} if "streams" in path else {"events": ["*"]})
        loaded = await writes("10 streams, 10 endpoints, every event")
        out["audit_writes_per_s"] = {
            "none": round(base), "subscribed_elsewhere": round(idle),
            "every_event": round(loaded),
            "subscribed_elsewhere_change_pct": round(100 * (idle - base) / base, 1),
            "every_event_change_pct": round(100 * (loaded - base) / base, 1)}
        for r in runners:
            await r.cleanup()

        if args.nats:
            out["nats"] = await nats_run(args, http, url, db_url)
    return out


async def nats_run(args: argparse.Namespace, http: aiohttp.ClientSession, url: str,
                   db_url: str) -> dict[str, Any]:
    import nats

    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = 14222 + secrets.randbelow(1000)
    store = tempfile.mkdtemp(prefix="bench-nats-")
    proc = await asyncio.create_subprocess_exec(
        binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(1.0)
        nc = await nats.connect(servers=[f"nats://127.0.0.1:{port}"])
        js = nc.jetstream()
        await js.add_stream(name="AUDIT", subjects=["audit.>"])
        project_id, key = await bootstrap(url)
        stream = await api(http, url, key, "POST", "/v1/audit/streams", {
            "destination": {"type": "nats", "servers": [f"nats://127.0.0.1:{port}"],
                            "subject": "audit.bench"}, "actions": ["bench.nats"]})
        await api(http, url, key, "PATCH", f"/v1/audit/streams/{stream['id']}",
                  {"status": "paused"})
        ids, _ = await write_events(db_url, project_id, args.events, "bench.nats")
        started = time.monotonic()
        await api(http, url, key, "PATCH", f"/v1/audit/streams/{stream['id']}",
                  {"status": "active"})
        while (await js.stream_info("AUDIT")).state.messages < len(ids):
            if time.monotonic() - started > 600:
                raise RuntimeError("JetStream did not get every event")
            await asyncio.sleep(0.1)
        took = time.monotonic() - started
        got = []
        sub = await js.pull_subscribe("audit.bench", "check")
        while len(got) < len(ids):
            for m in await sub.fetch(1000, timeout=10):
                got.append(m.headers["Nats-Msg-Id"] if m.headers else "")
                await m.ack()
        await nc.close()
        result = {"events_per_s": round(len(ids) / took), "in_order": got == ids}
        log(f"nats: {len(ids)} events in {took:.1f} s = {result['events_per_s']}/s, "
            f"in order: {result['in_order']}")
        return result
    finally:
        proc.kill()
        await proc.wait()
        shutil.rmtree(store, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--deliveries", type=int, default=5_000)
    ap.add_argument("--latency-events", type=int, default=200)
    ap.add_argument("--writes", type=int, default=2_000)
    ap.add_argument("--nats", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    asyncio.run(ensure_database(args.database_url, DB, recreate=True))
    db_url = with_db(args.database_url, DB)
    migrate(db_url)
    env = server_env(db_url, args.redis_url, "bench-outbound", TOKEN, None)
    env.update(SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS="true", SERVICE_STREAM_BATCH_SIZE="500")
    [server] = start_servers(1, env, "bench-outbound")
    try:
        out = asyncio.run(run(args, server.url, db_url))
    finally:
        server.stop()
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
