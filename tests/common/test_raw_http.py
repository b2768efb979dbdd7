"""Requests no HTTP client library would send, written to a socket byte for byte: header values
that are not UTF-8, and malformed HTTP that aiohttp's parser refuses before any handler runs.
Each still gets the envelope (``invalid_request`` with a fresh ``req_`` id in the body and in
``X-Request-Id``), never a 500 and never an echo of the request line."""

from __future__ import annotations

import asyncio
import gzip
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
import pytest
from aiohttp import ClientSession, ClientTimeout

from tests.fixtures import conformance
from tests.fixtures.service import Api, Project, serve_process, stop_gracefully

REQ_ID = re.compile(r"^req_[0-9a-hjkmnp-tv-z]{26}$")


@dataclass
class Raw:
    """One answer as it came off the socket."""

    version: str
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        value = orjson.loads(self.body)
        assert isinstance(value, dict), self.body
        return value


async def send(api: Api, data: bytes) -> Raw:
    """Write ``data`` to a new connection to ``api``'s server and read the first answer."""
    url = urlsplit(api.base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, _ = status_line.split(" ", 2)
        headers = {}
        for line in filter(None, lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(reader.readexactly(length), 10)
        return Raw(version, int(status), headers, body)
    finally:
        writer.close()


def request(method: str, target: str, *headers: bytes, body: bytes = b"") -> bytes:
    """A request with ``Host`` and ``Connection: close`` and ``headers`` (each a raw line)."""
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: authio.test", b"Connection: close",
             *headers]
    if body:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def assert_envelope(answer: Raw, status: int = 400, code: str = "invalid_request") -> dict[str, object]:
    """The envelope with a fresh request id in the body and the header alike; the error."""
    assert answer.status == status, (answer.status, answer.body)
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    body = answer.json()
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == code, body
    assert isinstance(error["message"], str) and error["message"], body
    assert REQ_ID.match(str(body["request_id"])), body
    assert answer.headers.get("x-request-id") == body["request_id"], (answer.headers, body)
    return error


def fields(error: dict[str, object]) -> list[object]:
    details = error["details"]
    assert isinstance(details, dict)
    return [f["field"] for f in details.get("fields", [])]


def assert_documented(method: str, path: str, answer: Raw) -> None:
    problems = conformance.document().problems(method, path, answer.status,
                                               answer.headers.get("content-type", ""),
                                               {k.title(): v for k, v in answer.headers.items()},
                                               answer.body)
    assert not problems, problems


def bearer(key: str) -> bytes:
    return b"Authorization: Bearer " + key.encode()


JSON = b"Content-Type: application/json"


# --- header values that are not UTF-8 ---------------------------------------------------------


@pytest.mark.parametrize("value", [b"caf\xe9", b"\xed\xa0\x80", b"\xff\xfe"])
async def test_a_user_agent_that_is_not_utf8_is_invalid_request(service: Api, project: Project,
                                                                value: bytes) -> None:
    """It went into the audit event of the change and asyncpg could not encode it (a 500)."""
    body = orjson.dumps({"email": "ua@example.com"})
    answer = await send(service, request("POST", "/v1/users", bearer(project.key), JSON,
                                         b"User-Agent: " + value, body=body))
    assert fields(assert_envelope(answer)) == ["User-Agent"]
    assert_documented("POST", "/v1/users", answer)
    listing = await project.api.get("/v1/users")
    assert listing.body["data"] == []


@pytest.mark.parametrize(("method", "target", "header"), [
    ("GET", "/v1/projects/me", b"Authorization: Bearer sk_live_\xff\xfe"),
    ("GET", "/v1/auth/.well-known/jwks.json", b"Service-Project: proj_\xff"),
    ("POST", "/v1/auth/magic-link/verify", b"Service-Project: \xff"),
    ("GET", "/healthz", b"X-Anything: \xc3"),
])
async def test_any_header_that_is_not_utf8_is_invalid_request(service: Api, method: str,
                                                              target: str, header: bytes) -> None:
    """Each of these answered 500, one of them aiohttp's own plain text (the envelope failed to
    serialize the undecodable project id it echoed)."""
    answer = await send(service, request(method, target, header, JSON,
                                         body=b'{"token": "abc"}' if method == "POST" else b""))
    error = assert_envelope(answer)
    assert fields(error) == [header.split(b":")[0].decode()]
    assert_documented(method, target, answer)


async def test_a_utf8_header_value_is_fine(service: Api, project: Project) -> None:
    answer = await send(service, request("GET", "/v1/projects/me", bearer(project.key),
                                         "User-Agent: café/1.0 ✓".encode()))
    assert answer.status == 200, answer.body


# --- bodies that cannot be decoded -----------------------------------------------------------


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
async def test_a_body_that_does_not_decompress_is_invalid_request(service: Api, project: Project,
                                                                  encoding: bytes) -> None:
    """aiohttp decompresses as the handler reads; the error it raised then was a 500."""
    answer = await send(service, request("POST", "/v1/stores", bearer(project.key), JSON,
                                         b"Content-Encoding: " + encoding, body=b"not compressed"))
    assert assert_envelope(answer)["details"] == {"reason": "bad_body_encoding"}
    assert_documented("POST", "/v1/stores", answer)
    assert (await project.api.get("/v1/stores")).body["data"] == []


async def test_a_gzip_body_is_read(service: Api, project: Project) -> None:
    body = gzip.compress(orjson.dumps({"name": "zipped"}))
    answer = await send(service, request("POST", "/v1/stores", bearer(project.key), JSON,
                                         b"Content-Encoding: gzip", body=body))
    assert answer.status == 201, answer.body


# --- HTTP that aiohttp's parser refuses -------------------------------------------------------

SECRET = b"/v1/users/secret-marker-7f3a"
"""A path that must never come back in an answer (an error page that echoes the request line
is a reflection vector and leaks what proxies logged)."""


MALFORMED = [
    ("request line over 8 KiB", b"GET " + SECRET + b"?q=" + b"a" * 9000
     + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("bare LF line endings", b"GET " + SECRET + b" HTTP/1.1\nHost: x\n\n"),
    ("NUL in a header", b"GET " + SECRET + b" HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    ("control character in a header", b"GET " + SECRET + b" HTTP/1.1\r\nHost: x\r\nX-A: \x01\r\n\r\n"),
    ("header over 8 KiB", b"GET " + SECRET + b" HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 9000
     + b"\r\n\r\n"),
    ("too many headers", b"GET " + SECRET + b" HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200
     + b"\r\n"),
    ("a method that is not a token", b"G(T " + SECRET + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("an asterisk target for GET", b"GET * HTTP/1.1\r\nHost: x\r\nX-Path: " + SECRET + b"\r\n\r\n"),
    ("no Host in HTTP/1.1", b"GET " + SECRET + b" HTTP/1.1\r\nAccept: */*\r\n\r\n"),
    ("two Host headers", b"GET " + SECRET + b" HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
    ("a bad chunk size", b"POST " + SECRET + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
     b"\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    ("Content-Length and chunked", b"POST " + SECRET + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2"
     b"\r\nTransfer-Encoding: chunked\r\n\r\n{}"),
    ("a Content-Length that is no number", b"POST " + SECRET + b" HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 1e3\r\n\r\n{}"),
]


async def read_all(api: Api, data: bytes) -> Raw:
    """Send ``data`` and read until the server closes the connection, as it does after refusing
    malformed HTTP; nothing of the request's path may be in what came back."""
    url = urlsplit(api.base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(data)
        await writer.drain()
        everything = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert b"secret-marker" not in everything, everything
    head, _, body = everything.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    version, status, _ = status_line.split(" ", 2)
    return Raw(version, int(status), headers, body)


@pytest.mark.parametrize("data", [pytest.param(data, id=name) for name, data in MALFORMED])
async def test_malformed_http_gets_the_envelope_and_no_echo(service: Api, data: bytes) -> None:
    """aiohttp answered each with its own text/plain 400 quoting the offending line (the path,
    the header), without X-Request-Id."""
    error = assert_envelope(await read_all(service, data))
    assert isinstance(error["details"], dict) and error["details"]["reason"], error



async def test_authio_serve_answers_malformed_http_in_the_envelope(
    database_url: str, redis_url: str, redis_prefix: str
) -> None:
    """The production entry point (its own serve loop, not web.run_app) uses the same runner,
    and still stops gracefully."""
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
           "SERVICE_REDIS_PREFIX": redis_prefix}
    async with ClientSession(timeout=ClientTimeout(total=20)) as http, \
            serve_process(http, env, "all") as served:
        for _, data in MALFORMED[:3]:
            assert_envelope(await read_all(served.api, data))
        assert await stop_gracefully(served) == 0
        assert "Traceback" not in served.logs(), served.logs()
