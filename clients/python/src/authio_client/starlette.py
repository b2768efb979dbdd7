"""Starlette and FastAPI: a pure ASGI middleware that verifies the session of every request, and
``require`` (a FastAPI dependency) / ``requires`` (a Starlette endpoint decorator) that answer
401/403 the way the engine does (``authio_client._web`` has the rules).

    from authio_client import AsyncAuthioClient
    from authio_client.starlette import AuthioMiddleware, require, requires, session_of

    authio = AsyncAuthioClient(BASE_URL, API_KEY)
    app = Starlette(routes=[...], middleware=[Middleware(AuthioMiddleware, client=authio, store_id=STORE)])

    @requires("viewer", "doc:{doc_id}")          # Starlette: path parameters fill the template
    async def show(request): return JSONResponse({"user": session_of(request).user_id})

    @api.get("/docs/{doc_id}")                   # FastAPI
    async def show(doc_id: str, session: Session = Depends(require("viewer", "doc:{doc_id}"))): ...

The session is ``request.state.authio_session`` (None when the request has none), the reason
there is none ``request.state.authio_error``. Needs ``starlette`` (the ``[starlette]`` extra).
"""

# No "from __future__ import annotations": FastAPI reads Requirement.__call__'s annotations at
# run time, and cannot resolve strings on an instance's method.

import functools
from collections.abc import Awaitable, Callable

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from authio_client._async import AsyncAuthioClient
from authio_client._web import COOKIE, Denied, Guard, ObjectSpec, bearer_token, judge, new_request_id, object_of, permit
from authio_client.models import Session

__all__ = ["AuthioMiddleware", "Denied", "Requirement", "require", "requires", "session_of"]

_GUARD = "authio.guard"
_ERROR = "authio.error"


class AuthioMiddleware:
    """Verifies the request's access token (Bearer, else the ``service_session`` cookie) with
    ``client`` (an :class:`~authio_client.AsyncAuthioClient`; ``check_revocation`` as its
    ``verify_session`` option), puts the :class:`~authio_client.models.Session` (or None) on
    ``request.state.authio_session``, and answers a :class:`Denied` raised below it (by
    ``require``) with the error envelope. ``store_id`` is the default store of ``require``."""

    def __init__(self, app: ASGIApp, client: AsyncAuthioClient, *, store_id: str | None = None,
                 check_revocation: bool | None = None) -> None:
        self.app = app
        self.guard = Guard(client, store_id, check_revocation)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        request_id = new_request_id(conn.headers.get("x-request-id"))
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            token = bearer_token(conn.headers.get("authorization"), conn.cookies.get(COOKIE))
            session, error = await judge(self.guard.client, token, self.guard.check_revocation)
            state = scope.setdefault("state", {})
            state["authio_session"], state["authio_error"] = session, error
            scope[_GUARD], scope[_ERROR] = self.guard, error
            await self.app(scope, receive, sending)
        except Denied as denied:
            if started or scope["type"] != "http":
                raise
            await _answer(denied, request_id)(scope, receive, send)


def _answer(denied: Denied, request_id: str) -> Response:
    return JSONResponse(denied.body(request_id), status_code=denied.status,
                        headers={"X-Request-Id": request_id})


def session_of(request: HTTPConnection) -> Session | None:
    """The request's verified session, or None."""
    session: Session | None = request.scope.get("state", {}).get("authio_session")
    return session


class Requirement:
    """What :func:`require` makes: awaited with a request it answers the session, or raises
    :class:`Denied` (turned into 401/403 by the middleware)."""

    def __init__(self, relation: str | None, object: ObjectSpec | None, store_id: str | None) -> None:
        self.relation, self.object, self.store_id = relation, object, store_id

    async def __call__(self, request: Request) -> Session:
        guard = request.scope.get(_GUARD)
        if not isinstance(guard, Guard):
            raise RuntimeError("authio_client.starlette.AuthioMiddleware is not installed")
        obj = None if self.object is None else object_of(self.object, request, request.path_params)
        return await permit(guard, session_of(request), request.scope.get(_ERROR),
                            relation=self.relation, obj=obj, store_id=self.store_id)


def require(relation: str | None = None, object: ObjectSpec | None = None, *,
            store_id: str | None = None) -> Requirement:
    """A FastAPI dependency (``Depends(require(...))``) answering the session: 401 without a
    valid one; with ``relation`` and ``object`` (a template of the path parameters, or a
    function of the request) 403 unless ``user:<sub>`` has it in ``store_id`` (default: the
    middleware's). In a plain Starlette endpoint: ``session = await require(...)(request)``."""
    return Requirement(relation, object, store_id)


Endpoint = Callable[[Request], Awaitable[Response]]


def requires(relation: str | None = None, object: ObjectSpec | None = None, *,
             store_id: str | None = None) -> Callable[[Endpoint], Endpoint]:
    """The decorator form of :func:`require` for Starlette endpoints ``async def f(request)``."""
    need = require(relation, object, store_id=store_id)

    def decorate(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def guarded(request: Request) -> Response:
            await need(request)
            return await endpoint(request)
        return guarded
    return decorate
