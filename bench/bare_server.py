"""Bare aiohttp server used to measure the HTTP stack's ceiling.

    python bench/bare_server.py [--host 127.0.0.1] [--port 8090] [--cpus 0] [--parse-json]

Two routes, ``POST /v1/stores/{store_id}/check`` and ``/v1/edge/auth`` (any method, the
forward-auth twin), answering a fixed small JSON body through ``web.Response`` (no JSON
encoding, no auth, no engine), on uvloop with access logging off, as ``authio serve`` runs
(same aiohttp, same uvloop, same access-log setting: keep them equal, or the ceiling lies).
``bench/bench_http.py --mode ceiling`` and ``bench/bench_ceiling.py`` drive it with exactly the
same client as the real service, so the difference between the two is the cost of authio
itself (auth, validation, engine, serialization).

The request body is read in full (as the real service has to); ``--parse-json``
additionally decodes it with orjson, to include request parsing in the ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import orjson
import uvloop
from aiohttp import web

BODY = orjson.dumps(
    {
        "allowed": True,
        "resolution": "direct",
        "resolution_path": [],
        "revision": 1,
        "request_id": "req_bare",
    }
)


def make_app(parse_json: bool = False) -> web.Application:
    async def check(request: web.Request) -> web.Response:
        raw = await request.read()
        if parse_json:
            orjson.loads(raw)
        return web.Response(body=BODY, content_type="application/json")

    async def auth(request: web.Request) -> web.Response:
        return web.Response(body=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/stores/{store_id}/check", check)
    app.router.add_route("*", "/v1/edge/auth", auth)  # forward auth's twin: any method, no body
    return app


async def serve(host: str, port: int, parse_json: bool) -> None:
    runner = web.AppRunner(make_app(parse_json), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    print(f"bare server listening on http://{host}:{port} (pid {os.getpid()})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bare aiohttp ceiling server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--cpus", default=None,
                        help="pin the server to these CPUs, e.g. '0' or '0,1'")
    parser.add_argument("--parse-json", action="store_true",
                        help="also decode the request body with orjson")
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    uvloop.run(serve(args.host, args.port, args.parse_json))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
