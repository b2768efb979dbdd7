"""``common.http.read_json`` reads the body as ``request.read()`` would: decoded, limited, and
kept, so that either may read it after the other (the body taken at once when it has all
arrived, ``common.http._body``)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import orjson
import pytest_asyncio
from aiohttp import ClientSession, web

from common.http import read_json
from tests.fixtures.service import start_app


async def _read_then_json(request: web.Request) -> web.Response:
    raw = await request.read()
    return web.json_response({"raw": raw.decode(), "json": await read_json(request)})


async def _json_then_read(request: web.Request) -> web.Response:
    data = await read_json(request)
    return web.json_response({"json": data, "raw": (await request.read()).decode(),
                              "text": await request.text()})


@pytest_asyncio.fixture
async def base() -> AsyncIterator[str]:
    app = web.Application(client_max_size=1024)
    app.router.add_post("/read-then-json", _read_then_json)
    app.router.add_post("/json-then-read", _json_then_read)
    running = await start_app(app)
    try:
        yield running.base_url
    finally:
        await running.stop()


async def test_either_reader_may_come_first(base: str, http: ClientSession) -> None:
    body = b'{"a": 1}'
    async with http.post(base + "/read-then-json", data=body) as r:
        assert r.status == 200
        assert await r.json() == {"raw": body.decode(), "json": {"a": 1}}
    async with http.post(base + "/json-then-read", data=body) as r:
        assert r.status == 200
        assert await r.json() == {"json": {"a": 1}, "raw": body.decode(), "text": body.decode()}


async def test_compressed_body_is_decoded(base: str, http: ClientSession) -> None:
    body = orjson.dumps({"name": "x" * 300})
    async with http.post(base + "/json-then-read", data=zlib.compress(body),
                         headers={"Content-Encoding": "deflate"}) as r:
        assert r.status == 200
        assert (await r.json())["json"] == {"name": "x" * 300}


async def test_body_over_the_limit_is_payload_too_large(base: str, http: ClientSession) -> None:
    """Whole in one segment (the path that takes the body at once) and in chunks alike."""
    body = orjson.dumps({"name": "x" * 2000})

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 256):
            yield body[i:i + 256]

    for data in (body, chunks()):
        async with http.post(base + "/json-then-read", data=data) as r:
            assert r.status == 413
            answer = await r.json()
            assert answer["error"]["code"] == "payload_too_large"
            assert answer["error"]["details"] == {"max_bytes": 1024}
