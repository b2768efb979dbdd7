"""Server CPU per HTTP request without the network: A/B figures that a busy machine cannot blur.

    python bench/bench_inproc_http.py --dataset bench/data/medium [--requests 50000]
        [--connections 16] [--rounds 3] [--targets bare-check,check,bare-auth,auth]

Each target's app is served by the same runner the service uses (``common.http.EnvelopeRunner``
for the engine, ``web.AppRunner`` for ``bench/bare_server.py``'s app, both without access log) on
uvloop, but its connections are in-memory transports: raw HTTP/1.1 request bytes go into aiohttp's
protocol (``data_received``) and each response (one ``write`` per response, as aiohttp sends it)
triggers the connection's next request. Everything of aiohttp (parser, request, routing,
middlewares, response, writer) and of authio runs as under wrk; the socket system calls and the
client do not, so the figure is the Python work per request, measured as process CPU time
(``time.process_time``) over ``--requests`` requests after a warm-up, rounds alternated.

The engine app is ``engine.app.create_engine_app`` with the settings of the environment
(``DATABASE_URL``, ``OTEL_EXPORTER``: ``none`` unless set), so its store registry loads the
dataset's store from PostgreSQL first; the key is ``$AUTHIO_API_KEY`` and the forward-auth token
``$EDGE_TOKEN`` (``bench/edge_token.py``). Every answer's status is checked (200 expected).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


class MemoryTransport(asyncio.Transport):
    """Takes aiohttp's writes; each one is a complete response, which starts the next request."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self.conn = conn
        self._closing = False

    def write(self, data: Any) -> None:
        self.conn.answered(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.conn.answered(b"".join(chunks))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class Connection:
    def __init__(self, run: Run, protocol: Any, offset: int) -> None:
        self.run, self.protocol, self.i = run, protocol, offset
        self.loop = asyncio.get_running_loop()
        protocol.connection_made(MemoryTransport(self))

    def send(self) -> None:
        reqs = self.run.requests
        self.i = (self.i + 1) % len(reqs)
        self.protocol.data_received(reqs[self.i])

    def answered(self, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 200"):
            self.run.errors += 1
            if self.run.errors == 1:
                print("unexpected answer:", data[:300], file=sys.stderr)
        self.run.done += 1
        if self.run.sent < self.run.target:
            self.run.sent += 1
            self.loop.call_soon(self.send)
        elif self.run.done >= self.run.target:
            self.run.finished.set()


class Run:
    def __init__(self, requests: list[bytes], target: int) -> None:
        self.requests, self.target = requests, target
        self.sent = self.done = self.errors = 0
        self.finished = asyncio.Event()


async def drive(server: Any, requests: list[bytes], n: int, conns: int) -> tuple[float, int]:
    run = Run(requests, n)
    connections = [Connection(run, server(), k * 997) for k in range(conns)]
    gc.collect()
    t0 = time.process_time()
    for c in connections:
        run.sent += 1
        c.send()
    await run.finished.wait()
    cpu = time.process_time() - t0
    for c in connections:
        c.protocol.connection_lost(None)
    await asyncio.sleep(0)
    return cpu / n * 1e6, run.errors


def build_requests(method: str, path: str, headers: dict[str, str], bodies: list[bytes] | None,
                   ) -> list[bytes]:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if not bodies:
        return [f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode()]
    return [f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Type: "
            f"application/json\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b for b in bodies]


def read_dataset(dataset: Path, limit: int) -> tuple[str, list[bytes]]:
    """The store id of ``store.json`` and the first ``limit`` checks as request bodies."""
    store_id = json.loads((dataset / "store.json").read_text())["store_id"]
    bodies = []
    with open(dataset / "checks.jsonl", "rb") as fh:
        for k, line in enumerate(fh):
            if k >= limit:
                break
            c = json.loads(line)
            bodies.append(json.dumps({"tuple_key": {x: c[x] for x in ("object", "relation",
                                                                       "user")}},
                                     separators=(",", ":")).encode())
    return store_id, bodies


def target_requests(dataset: Path, limit: int) -> tuple[str, list[bytes], list[bytes]]:
    """The store id, the single-check requests (``$AUTHIO_API_KEY``, the dataset's first
    ``limit`` checks) and the forward-auth request (``$EDGE_TOKEN``, the headers a proxy sends)."""
    store_id, bodies = read_dataset(dataset, limit)
    key = {"Authorization": f"Bearer {os.environ.get('AUTHIO_API_KEY', '')}"}
    auth = {"Authorization": f"Bearer {os.environ.get('EDGE_TOKEN', '')}",
            "X-Forwarded-Method": "GET", "X-Forwarded-Proto": "https",
            "X-Forwarded-Host": "app.example", "X-Forwarded-Uri": "/projects/42/settings"}
    return (store_id, build_requests("POST", f"/v1/stores/{store_id}/check", key, bodies),
            build_requests("GET", "/v1/edge/auth", auth, None))


async def main_async(args: argparse.Namespace) -> int:
    from aiohttp import web
    from bare_server import make_app

    from common.http import EnvelopeRunner
    from common.settings import Settings
    from engine.app import create_engine_app

    store_id, check_reqs, auth_reqs = target_requests(args.dataset, args.limit)

    os.environ.setdefault("OTEL_EXPORTER", "none")
    settings = Settings()
    if settings.otel_exporter != "none":
        from common.telemetry import setup_tracing
        setup_tracing(settings, service_name_default="authio-engine")
    engine_runner = EnvelopeRunner(create_engine_app(settings), access_log=None)
    bare_runner = web.AppRunner(make_app(), access_log=None)
    await engine_runner.setup()
    await bare_runner.setup()
    engine_app = engine_runner.app
    from engine.appkeys import STORES
    registry = engine_app[STORES]
    for _ in range(600):
        if registry.ready:
            break
        await asyncio.sleep(0.1)
    await registry.get(store_id)
    plan = {"bare-check": (bare_runner, check_reqs), "check": (engine_runner, check_reqs),
            "bare-auth": (bare_runner, auth_reqs), "auth": (engine_runner, auth_reqs)}
    targets = args.targets.split(",")
    results: dict[str, list[float]] = {t: [] for t in targets}
    errors = 0
    try:
        for rnd in range(1, args.rounds + 1):
            for target in targets:
                runner, reqs = plan[target]
                assert runner.server is not None
                await drive(runner.server, reqs, args.warmup, args.connections)
                us, errs = await drive(runner.server, reqs, args.requests, args.connections)
                errors += errs
                results[target].append(us)
                print(f"round {rnd} {target:<10} {us:7.2f} µs/request  errors {errs}",
                      flush=True)
    finally:
        await engine_runner.cleanup()
        await bare_runner.cleanup()
    print("\nbest of rounds (µs per request), and the ratio to the bare twin (bare / path):")
    best = {t: min(v) for t, v in results.items()}
    for t in targets:
        twin = {"check": "bare-check", "auth": "bare-auth"}.get(t)
        ratio = f"  {best[twin] / best[t]:6.1%} of bare" if twin in best else ""
        print(f"  {t:<10} {best[t]:7.2f}{ratio}")
    if args.json:
        with open(args.json, "w") as out:  # noqa: ASYNC230 - once, after the measurement
            json.dump({"rounds": results, "best": best}, out, indent=2)
    return 1 if errors else 0


def main() -> int:
    ap = argparse.ArgumentParser(description="server CPU per request, in-memory transports")
    ap.add_argument("--dataset", type=Path, default=HERE / "data" / "medium")
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--warmup", type=int, default=5_000)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=20_000)
    ap.add_argument("--targets", default="bare-check,check,bare-auth,auth")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    return uvloop.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
