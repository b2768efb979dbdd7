"""The client's middleware in real applications: a Starlette app and a FastAPI app (served in
process through httpx's ASGI transport) and an aiohttp app (on a loopback port), each putting
the verified session on the request and guarding routes with ``require``, which answers 401/403
exactly as the engine's ``/v1/edge/validate`` does for the same token and permission."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest_asyncio
from aiohttp import ClientSession, web
from authio_client import AsyncAuthioClient, Session
from authio_client import aiohttp as authio_aiohttp
from authio_client import starlette as authio_starlette
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.client.helpers import Sent, async_client, signed_in
from tests.fixtures.identity import SignedIn
from tests.fixtures.service import Project, eventually, loopback_app

Get = Callable[..., Awaitable[tuple[int, dict[str, str], Any]]]


class World:
    def __init__(self, client: AsyncAuthioClient, store: str, anne: SignedIn) -> None:
        self.client, self.store, self.anne = client, store, anne


@pytest_asyncio.fixture
async def world(project: Project) -> AsyncIterator[World]:
    """A project whose store lets anne view doc:handbook (and nothing else), and anne signed in."""
    client = async_client(project.api.base_url, project.key, Sent())
    store = await client.create_store("app")
    anne = await signed_in(project)
    await client.write_tuples(store.id, writes=[("doc:handbook", "viewer", f"user:{anne.user_id}")])
    yield World(client, store.id, anne)
    await client.aclose()


async def engine_says(world: World, token: str | None, obj: str | None = None) -> tuple[int, Any]:
    """What the engine's edge validation answers for ``token`` (and viewer on ``obj``)."""
    params = {"store_id": world.store, "object": obj, "relation": "viewer"} if obj else {}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = await world.client.http.get(world.client.config.base_url + "/v1/edge/validate",
                                    params=params, headers=headers)
    return r.status_code, r.json()


async def assert_like_the_engine(world: World, get: Get) -> None:
    """The guarded app's answers, route by route, against the engine's for the same inputs."""
    token = world.anne.access_token
    bearer = {"Authorization": f"Bearer {token}"}

    status, _, body = await get("/whoami")
    assert (status, body) == (200, {"user": None})
    status, _, body = await get("/whoami", headers=bearer)
    assert (status, body) == (200, {"user": world.anne.user_id})

    for headers, tok in (({}, None), ({"Authorization": "Bearer not-a-jwt"}, "not-a-jwt")):
        status, hdrs, body = await get("/me", headers=headers)
        engine_status, engine_body = await engine_says(world, tok)
        assert status == engine_status == 401
        assert body["error"]["code"] == engine_body["error"]["code"]
        assert body["error"]["details"] == engine_body["error"]["details"]
        assert set(body) == set(engine_body) == {"error", "request_id"}
        assert hdrs["x-request-id"] == body["request_id"] and body["request_id"].startswith("req_")

    status, _, body = await get("/me", headers=bearer)
    assert (status, body) == (200, {"user": world.anne.user_id, "session": world.anne.session_id})
    # The cookie works as the Bearer header does.
    status, _, body = await get("/docs/handbook", cookies={"service_session": token})
    assert (status, body) == (200, {"doc": "handbook", "user": world.anne.user_id})

    status, _, body = await get("/docs/secret", headers=bearer)
    engine_status, engine_body = await engine_says(world, token, "doc:secret")
    assert status == engine_status == 403
    assert body["error"]["code"] == engine_body["error"]["code"] == "forbidden"
    # 401 before 403: no session is never a permission question.
    status, _, body = await get("/docs/handbook")
    assert (status, body["error"]["code"]) == (401, "no_session")
    # An incoming request id is kept.
    status, hdrs, body = await get("/me", headers={"X-Request-Id": "req-from-the-app"})
    assert hdrs["x-request-id"] == body["request_id"] == "req-from-the-app"


def starlette_app(world: World) -> Starlette:
    session_of, requires = authio_starlette.session_of, authio_starlette.requires

    async def whoami(request: Request) -> JSONResponse:
        session = session_of(request)
        return JSONResponse({"user": session.user_id if session else None})

    @requires()
    async def me(request: Request) -> JSONResponse:
        s = session_of(request)
        assert s is not None
        return JSONResponse({"user": s.user_id, "session": s.session_id})

    @requires("viewer", "doc:{doc_id}")
    async def doc(request: Request) -> JSONResponse:
        s = session_of(request)
        assert s is not None
        return JSONResponse({"doc": request.path_params["doc_id"], "user": s.user_id})

    return Starlette(routes=[Route("/whoami", whoami), Route("/me", me), Route("/docs/{doc_id}", doc)],
                     middleware=[Middleware(authio_starlette.AuthioMiddleware, client=world.client,
                                            store_id=world.store)])


def fastapi_app(world: World) -> FastAPI:
    require = authio_starlette.require
    api = FastAPI()
    api.add_middleware(authio_starlette.AuthioMiddleware, client=world.client, store_id=world.store)

    @api.get("/whoami")
    async def whoami(request: Request) -> dict[str, Any]:
        session = authio_starlette.session_of(request)
        return {"user": session.user_id if session else None}

    @api.get("/me")
    async def me(session: Session = Depends(require())) -> dict[str, Any]:  # noqa: B008
        return {"user": session.user_id, "session": session.session_id}

    @api.get("/docs/{doc_id}")
    async def doc(doc_id: str, session: Session = Depends(require("viewer", "doc:{doc_id}"))) -> dict[str, Any]:  # noqa: B008
        return {"doc": doc_id, "user": session.user_id}

    return api


def asgi_get(app: Any) -> tuple[httpx.AsyncClient, Get]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app.test")

    async def get(path: str, *, headers: dict[str, str] | None = None,
                  cookies: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        hdrs = dict(headers or {})
        if cookies:
            hdrs["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        r = await http.get(path, headers=hdrs)
        return r.status_code, dict(r.headers), r.json()
    return http, get


async def test_starlette_middleware(world: World) -> None:
    http, get = asgi_get(starlette_app(world))
    async with http:
        await assert_like_the_engine(world, get)


async def test_fastapi_dependency(world: World) -> None:
    http, get = asgi_get(fastapi_app(world))
    async with http:
        await assert_like_the_engine(world, get)


async def test_aiohttp_middleware(world: World, http: ClientSession) -> None:
    require, session_of = authio_aiohttp.require, authio_aiohttp.session_of

    async def whoami(request: web.Request) -> web.Response:
        session = session_of(request)
        return web.json_response({"user": session.user_id if session else None})

    @require()
    async def me(request: web.Request) -> web.Response:
        s = session_of(request)
        assert s is not None and request[authio_aiohttp.SESSION] is s
        return web.json_response({"user": s.user_id, "session": s.session_id})

    @require("viewer", "doc:{doc_id}")
    async def doc(request: web.Request) -> web.Response:
        s = session_of(request)
        assert s is not None
        return web.json_response({"doc": request.match_info["doc_id"], "user": s.user_id})

    app = web.Application(middlewares=[authio_aiohttp.authio_middleware(world.client, store_id=world.store)])
    app.router.add_get("/whoami", whoami)
    app.router.add_get("/me", me)
    app.router.add_get("/docs/{doc_id}", doc)
    async with loopback_app(app) as port:

        async def get(path: str, *, headers: dict[str, str] | None = None,
                      cookies: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
            hdrs = dict(headers or {})
            if cookies:
                hdrs["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
            async with http.get(f"http://127.0.0.1:{port}{path}", headers=hdrs) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.json()

        await assert_like_the_engine(world, get)


async def test_revoked_sessions_are_refused_by_the_middleware_when_asked(project: Project) -> None:
    client = async_client(project.api.base_url, project.key, Sent())
    anne = await signed_in(project)

    @authio_starlette.requires()
    async def me(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/me", me)],
                    middleware=[Middleware(authio_starlette.AuthioMiddleware, client=client,
                                           check_revocation=True)])
    http, get = asgi_get(app)
    async with http:
        bearer = {"Authorization": f"Bearer {anne.access_token}"}
        assert (await get("/me", headers=bearer))[0] == 200
        await client.revoke_session(anne.access_token)

        async def refused() -> Any:
            status, _, body = await get("/me", headers=bearer)
            return body if status == 401 else None
        body = await eventually(refused, within=5, what="the revoked session refused")
        assert body["error"] == {"code": "invalid_session", "message": body["error"]["message"],
                                 "details": {"reason": "revoked"}}
    await client.aclose()
