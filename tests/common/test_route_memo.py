"""``common.http.RouteMemo``: aiohttp's routing remembered by (method, path), with the answers
aiohttp's own router gives.

A small app with the route shapes both services use (plain, dynamic, a ``{tail:...}`` pattern,
any-method routes, several routes on one resource) is served by ``EnvelopeRunner`` (which puts
the memo in front of an app without middlewares) and asked every request twice: the first
answer comes from aiohttp's router, the second from the memo, and both must be the same. Misses
(404, 405) keep aiohttp's envelope, ``Expect: 100-continue`` keeps aiohttp's expect handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession, web

from common import http as common_http
from common.http import EnvelopeRunner, RouteMemo, envelope_middleware


async def _echo(request: web.Request) -> web.Response:
    if await request.read() == b"fail":
        raise RuntimeError("the handler failed")
    return web.json_response({"route": request.match_info.route.resource.canonical,  # type: ignore[union-attr]
                              "method": request.method, "values": dict(request.match_info),
                              "body": (await request.text()) or None})


def _app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/stores/{store_id}/check", _echo)
    app.router.add_post("/v1/stores/{store_id}/batch-check", _echo)
    app.router.add_get("/v1/stores", _echo)
    resource = app.router.add_resource("/v1/edge/auth")
    resource.add_route("GET", _echo)
    resource.add_route("*", _echo)
    app.router.add_route("*", r"/v1/edge/auth/{tail:[\s\S]*}", _echo)
    app.router.add_get("/v1/users/{user_id}", _echo)
    app.router.add_delete("/v1/users/{user_id}", _echo)
    return app


@dataclass
class Served:
    base: str
    app: web.Application
    memo: RouteMemo
    resolved: list[str]  # the paths aiohttp's router resolved


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    app = _app()
    resolved: list[str] = []
    resolve = app.router.resolve

    async def counting(request: web.Request) -> web.UrlMappingMatchInfo:
        resolved.append(request.path)
        return await resolve(request)

    app.router.resolve = counting  # type: ignore[method-assign]
    runner = EnvelopeRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        memo = runner.server.request_handler.keywords["handler"]  # type: ignore[union-attr]
        assert isinstance(memo, RouteMemo)
        yield Served(f"http://127.0.0.1:{port}", app, memo, resolved)
    finally:
        await runner.cleanup()


REQUESTS = [
    ("POST", "/v1/stores/store_01abc/check"),
    ("POST", "/v1/stores/store_01abc/batch-check"),
    ("POST", "/v1/stores/store%5F01abc/check"),  # percent-encoded: decoded as aiohttp decodes
    ("POST", "/v1/stores/a%2Fb/check"),  # an encoded slash stays in the value
    ("GET", "/v1/stores"),
    ("GET", "/v1/edge/auth"),
    ("PROPFIND", "/v1/edge/auth"),
    ("GET", "/v1/edge/auth/app/settings%20page"),
    ("DELETE", "/v1/users/user_1"),
    ("GET", "/v1/users/user_1"),
]


@pytest.mark.parametrize(("method", "path"), REQUESTS)
async def test_remembered_routes_answer_as_aiohttp_does(
        served: Served, http: ClientSession, method: str, path: str) -> None:
    base = served.base
    answers = []
    for _ in range(2):
        async with http.request(method, base + path, data=b"x") as r:
            assert r.status == 200, await r.text()
            answers.append(orjson.loads(await r.read()))
            assert r.headers["X-Request-Id"]
    assert answers[0] == answers[1]
    assert len(served.resolved) == 1  # the second came from the memo


async def test_a_remembered_route_shares_one_frozen_match_info(served: Served,
                                                               http: ClientSession) -> None:
    """The requests of one (method, path) share one match_info, made as aiohttp makes it (the
    app added, frozen, so nothing can change it for the others); another path gets its own."""
    seen: list[web.UrlMappingMatchInfo] = []

    async def spy(request: web.Request) -> web.Response:
        seen.append(request.match_info)  # type: ignore[arg-type]
        assert request.app is served.app
        return await _echo(request)

    for route in served.app.router.routes():
        if route.handler is _echo:
            route._handler = spy  # type: ignore[attr-defined]
    for path in ("/v1/users/user_1", "/v1/users/user_1", "/v1/users/user_1", "/v1/users/user_2"):
        async with http.get(served.base + path) as r:
            assert r.status == 200
            assert orjson.loads(await r.read())["values"] == {"user_id": path.rsplit("/", 1)[1]}
    assert seen[1] is seen[2] and seen[0] is not seen[1] and seen[3] is not seen[1]
    assert seen[1] == {"user_id": "user_1"} and seen[1].apps == (served.app,)
    with pytest.raises(RuntimeError):
        seen[1].add_app(served.app)


async def test_misses_are_aiohttps_every_time(served: Served,
                                              http: ClientSession) -> None:
    base = served.base
    for _ in range(2):
        async with http.get(base + "/v1/stores/store_1/check") as r:  # wrong method
            assert r.status == 405
            assert r.headers["Allow"] == "POST"
            assert (await r.json())["error"]["code"] == "method_not_allowed"
        async with http.post(base + "/v1/stores/store_1/nothing") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "not_found"
        async with http.post(base + "/v1/stores//check") as r:  # an empty segment matches no route
            assert r.status == 404


async def test_expect_continue_on_a_remembered_route(served: Served,
                                                     http: ClientSession) -> None:
    base = served.base
    path = base + "/v1/stores/store_1/check"
    async with http.post(path, data=b"first") as r:
        assert r.status == 200
    async with http.post(path, data=b"second", expect100=True) as r:
        assert r.status == 200
        assert (await r.json())["body"] == "second"


async def test_methods_of_one_path_are_told_apart(served: Served, http: ClientSession) -> None:
    path = served.base + "/v1/users/user_1"
    for _ in range(2):
        for method in ("GET", "DELETE", "HEAD"):
            async with http.request(method, path) as r:
                assert r.status == 200
                if method != "HEAD":
                    assert (await r.json())["method"] == method
        async with http.post(path) as r:
            assert r.status == 405
            assert r.headers["Allow"] == "DELETE,GET,HEAD"
    assert len(served.resolved) == 3 + 2  # GET, DELETE, HEAD once; the 405 every time


async def test_a_handler_that_raises_is_remembered_later(served: Served,
                                                         http: ClientSession) -> None:
    path = served.base + "/v1/stores/store_1/check"
    async with http.post(path, data=b"fail") as r:
        assert r.status == 500
        assert (await r.json())["error"]["code"] == "internal_error"
    for _ in range(2):
        async with http.post(path, data=b"ok") as r:
            assert r.status == 200
    assert len(served.resolved) == 2  # the failed call is not remembered; then one miss


async def test_the_memo_is_bounded(served: Served, http: ClientSession,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common_http, "ROUTE_MEMO_ENTRIES", 4)
    base = served.base
    for i in range(10):
        async with http.post(f"{base}/v1/stores/store_{i}/check") as r:
            assert r.status == 200
            assert (await r.json())["values"] == {"store_id": f"store_{i}"}
        assert len(served.memo._routes) <= 4
    long = "/v1/edge/auth/" + "x" * common_http.ROUTE_MEMO_PATH  # longer than the memo keeps
    for _ in range(2):
        async with http.get(base + long) as r:
            assert r.status == 200
            assert (await r.json())["values"] == {"tail": "x" * common_http.ROUTE_MEMO_PATH}
    assert not any(path == long for _, path in served.memo._routes)
    assert served.resolved[-2:] == [long, long]


def test_apps_the_memo_cannot_serve_are_refused() -> None:
    with pytest.raises(ValueError, match="middlewares"):
        RouteMemo(web.Application(middlewares=[envelope_middleware]))
    app = web.Application()
    app.add_domain("example.com", web.Application())
    with pytest.raises(ValueError, match="host"):
        RouteMemo(app)
