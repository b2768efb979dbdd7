"""``common.http.OneWriteResponse``: the bytes on the wire are aiohttp's own, byte for byte.

Each case serves the same answer twice on one real server, once as aiohttp's ``web.Response``
and once as ``OneWriteResponse``, reads both off a raw socket and compares them whole (the
``Date`` value aside, which may tick between the two). The cases cover the short path (HTTP/1.1
keep-alive, pipelined, statuses with a body, extra headers) and every case it hands back to
aiohttp (HTTP/1.0, ``Connection: close``, HEAD, 204, a cookie, an ``on_response_prepare``
signal), so an aiohttp upgrade that changes what aiohttp writes fails here, not in production.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.http import HttpVersion11

from common.http import EnvelopeRunner, OneWriteResponse

DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")


def _answer(cls: type[web.Response], request: web.Request) -> web.Response:
    kind = request.match_info["kind"]
    if kind == "json":
        return cls(body=b'{"allowed":true}', headers={"Content-Type": "application/json"})
    if kind == "created":
        return cls(body=b'{"id":"x"}', status=201, content_type="application/json",
                   headers={"Location": "/v1/x", "X-Authio-Stale": "true"})
    if kind == "error":
        return cls(body=b'{"error":{}}', status=404, content_type="application/json")
    if kind == "empty":
        return cls(status=204)
    if kind == "cookie":
        response = cls(body=b"{}", content_type="application/json")
        response.set_cookie("service_session", "abc", httponly=True)
        return response
    if kind == "tab":
        return cls(body=b"{}", content_type="application/json", headers={"X-Tab": "a\tb"})
    if kind == "untyped":  # aiohttp's default Content-Type
        return cls(body=b"{}", headers={"X-Name": "\u00e9t\u00e9"})
    if kind == "no-body":
        return cls(body=b"", content_type="application/json")
    if kind == "closing":
        response = cls(body=b"{}", content_type="application/json")
        response.force_close()
        return response
    if kind == "compressed":
        response = cls(body=b'{"a":"' + b"x" * 200 + b'"}', content_type="application/json")
        response.enable_compression()
        return response
    if kind == "chunked":
        response = cls(body=b"{}", content_type="application/json")
        response.enable_chunked_encoding()
        return response
    if kind == "dated":
        return cls(body=b"{}", content_type="application/json",
                   headers={"Date": "Thu, 01 Jan 2026 00:00:00 GMT", "Server": "authio"})
    if kind == "not-modified":
        return cls(body=b"{}", status=304, content_type="application/json")
    if kind == "bytearray":
        return cls(body=bytearray(b"{}"), content_type="application/json")
    if kind == "surrogate":  # aiohttp's serializer drops a lone surrogate
        return cls(body=b"{}", content_type="application/json", headers={"X-S": "a\ud800b"})
    raise web.HTTPNotFound()


def _app(*, signal: bool = False) -> web.Application:
    app = web.Application()

    async def prepared_then_failed(request: web.Request) -> web.Response:
        cls = OneWriteResponse if request.match_info["base"] == "one" else web.Response
        await cls(body=b"{}", content_type="application/json").prepare(request)
        raise RuntimeError("after prepare")

    app.router.add_get("/{base}/prepared-then-failed", prepared_then_failed)

    async def plain(request: web.Request) -> web.Response:
        return _answer(web.Response, request)

    async def one_write(request: web.Request) -> web.Response:
        return _answer(OneWriteResponse, request)

    app.router.add_get("/plain/{kind}", plain)
    app.router.add_get("/one/{kind}", one_write)
    if signal:
        async def stamp(request: web.Request, response: web.StreamResponse) -> None:
            response.headers["X-Stamped"] = "yes"
        app.on_response_prepare.append(stamp)
    return app


@pytest.fixture
def aiohttp_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths whose response went through aiohttp's own ``Response._start``."""
    started: list[str] = []
    start = web.Response._start

    async def spy(self: web.Response, request: web.BaseRequest) -> object:
        started.append(request.path)
        return await start(self, request)

    monkeypatch.setattr(web.Response, "_start", spy)
    return started


@pytest_asyncio.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    runner = web.AppRunner(_app(signal=getattr(request, "param", False)), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def _exchange(port: int, data: bytes) -> bytes:
    """Write ``data``, read until the server closes or is quiet for 0.3 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 0.3):
            out += chunk
    except TimeoutError:
        pass
    writer.close()
    return out


async def _both(port: int, template: bytes) -> tuple[bytes, bytes]:
    plain = await _exchange(port, template.replace(b"{path}", b"/plain"))
    one = await _exchange(port, template.replace(b"{path}", b"/one"))
    return DATE.sub(b"\r\nDate: -\r\n", plain), DATE.sub(b"\r\nDate: -\r\n", one)


SHORT = {  # the cases the short path writes
    "json keep-alive": b"GET {path}/json HTTP/1.1\r\nHost: a\r\n\r\n",
    "created with headers": b"GET {path}/created HTTP/1.1\r\nHost: a\r\n\r\n",
    "error status": b"GET {path}/error HTTP/1.1\r\nHost: a\r\n\r\n",
    "pipelined": b"GET {path}/json HTTP/1.1\r\nHost: a\r\n\r\nGET {path}/created HTTP/1.1\r\n"
                 b"Host: a\r\n\r\n",
    "empty body": b"GET {path}/no-body HTTP/1.1\r\nHost: a\r\n\r\n",
    "tab in a header": b"GET {path}/tab HTTP/1.1\r\nHost: a\r\n\r\n",
    "compression offered, not enabled": b"GET {path}/json HTTP/1.1\r\nHost: a\r\n"
                                        b"Accept-Encoding: gzip\r\n\r\n",
}
CASES = {  # the short path's, and those it hands back to aiohttp
    **SHORT,
    "HTTP/1.0": b"GET {path}/json HTTP/1.0\r\n\r\n",
    "HTTP/1.0 keep-alive": b"GET {path}/json HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "Connection: close": b"GET {path}/json HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    "HEAD": b"HEAD {path}/json HTTP/1.1\r\nHost: a\r\n\r\n",
    "204": b"GET {path}/empty HTTP/1.1\r\nHost: a\r\n\r\n",
    "cookie": b"GET {path}/cookie HTTP/1.1\r\nHost: a\r\n\r\n",
    "no Content-Type": b"GET {path}/untyped HTTP/1.1\r\nHost: a\r\n\r\n",
    "force_close": b"GET {path}/closing HTTP/1.1\r\nHost: a\r\n\r\n",
    "compression": b"GET {path}/compressed HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n\r\n",
    "chunked": b"GET {path}/chunked HTTP/1.1\r\nHost: a\r\n\r\n",
    "Date and Server by hand": b"GET {path}/dated HTTP/1.1\r\nHost: a\r\n\r\n",
    "304": b"GET {path}/not-modified HTTP/1.1\r\nHost: a\r\n\r\n",
    "bytearray body": b"GET {path}/bytearray HTTP/1.1\r\nHost: a\r\n\r\n",
    "lone surrogate in a header": b"GET {path}/surrogate HTTP/1.1\r\nHost: a\r\n\r\n",
    "prepared by hand, then failed": b"GET {path}/prepared-then-failed HTTP/1.1\r\nHost: a\r\n\r\n",
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bytes_are_aiohttps(served: int, aiohttp_starts: list[str], case: str) -> None:
    plain, one = await _both(served, CASES[case])
    assert plain.startswith(b"HTTP/1."), plain
    assert one == plain
    # ... and the short path wrote them where it should, aiohttp's prepare everywhere else.
    short = not any(path.startswith("/one/") for path in aiohttp_starts)
    assert short is (case in SHORT), aiohttp_starts


@pytest.mark.parametrize("served", [True], indirect=True)
async def test_on_response_prepare_signal_still_runs(served: int) -> None:
    plain, one = await _both(served, CASES["json keep-alive"])
    assert b"\r\nX-Stamped: yes\r\n" in one
    assert one == plain


@pytest.mark.parametrize("value", ["a\r\nSet-Cookie: x=1", "a\nb", "a\rb", "a\x00b", "a\x1bb", "a\x7fb"])
async def test_header_with_a_control_character_is_refused_as_by_aiohttp(value: str) -> None:
    """No header injection: both refuse to write it (aiohttp then drops the connection)."""

    class Request:  # what prepare reads before it refuses
        version = HttpVersion11
        keep_alive = True
        method = "GET"
        match_info = web.UrlMappingMatchInfo({}, None)  # type: ignore[arg-type]

    response = OneWriteResponse(body=b"{}", content_type="application/json", headers={"X-Evil": value})
    with pytest.raises(ValueError, match="Forbidden control character"):
        await response.prepare(Request())  # type: ignore[arg-type]
    assert not response.prepared


@pytest_asyncio.fixture
async def enveloped() -> AsyncIterator[tuple[int, list[web.StreamResponse]]]:
    """An app behind the envelope runner, as both services are served; the responses sent."""
    sent: list[web.StreamResponse] = []
    app = web.Application()

    async def handler(request: web.Request) -> web.Response:
        response = OneWriteResponse(body=b"{}", headers={"Content-Type": "application/json"})
        sent.append(response)
        return response

    app.router.add_get("/x", handler)
    runner = EnvelopeRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1], sent  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def test_short_path_headers_and_state(
        enveloped: tuple[int, list[web.StreamResponse]]) -> None:
    """The request id header is written, keep-alive is kept, the response says it was sent."""
    port, sent = enveloped
    out = await _exchange(port, b"GET /x HTTP/1.1\r\nHost: a\r\nX-Request-Id: req-abcdefgh\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert body == b"{}"
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    assert [line.split(b":")[0] for line in lines[1:]] == [
        b"Content-Type", b"X-Request-Id", b"Content-Length", b"Date", b"Server"]
    assert b"X-Request-Id: req-abcdefgh" in lines
    response = sent[0]
    assert response.prepared and response.keep_alive and response.body_length == len(out)


async def test_refusal_before_routing_on_a_kept_alive_connection(
        enveloped: tuple[int, list[web.StreamResponse]]) -> None:
    """The envelope refuses a header that is not UTF-8 before any route is resolved; its
    answer takes the short path too, and the connection serves the next request."""
    port, _ = enveloped
    out = await _exchange(port, b"GET /x HTTP/1.1\r\nHost: a\r\nX-Name: \xff\xfe\r\n\r\n"
                                b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
    first, second = out.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"400 Bad Request\r\n"), out
    assert b'"code":"invalid_request"' in first
    assert second.startswith(b"200 OK\r\n") and second.endswith(b"\r\n\r\n{}"), out
