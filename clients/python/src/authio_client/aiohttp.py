"""aiohttp: a middleware that verifies the session of every request, and ``require``, a handler
decorator that answers 401/403 the way the engine does (``authio_client._web`` has the rules).

    from aiohttp import web
    from authio_client import AsyncAuthioClient
    from authio_client.aiohttp import authio_middleware, require, session_of

    authio = AsyncAuthioClient(BASE_URL, API_KEY)
    app = web.Application(middlewares=[authio_middleware(authio, store_id=STORE)])

    @require("viewer", "doc:{doc_id}")          # match_info fills the template
    async def show(request: web.Request) -> web.Response:
        return web.json_response({"user": session_of(request).user_id})

The session is ``request[SESSION]`` (None when the request has none; ``SESSION`` is a
``web.RequestKey`` on aiohttp versions that have them, else the string ``"authio_session"``).
Needs ``aiohttp`` (the ``[aiohttp]`` extra).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from authio_client._async import AsyncAuthioClient
from authio_client._web import COOKIE, Denied, Guard, ObjectSpec, bearer_token, judge, new_request_id, object_of, permit
from authio_client.errors import AuthioError
from authio_client.models import Session

__all__ = ["ERROR", "SESSION", "Denied", "authio_middleware", "require", "session_of"]

_RequestKey: Any = getattr(web, "RequestKey", None)
SESSION: Any = _RequestKey("authio_session", object) if _RequestKey else "authio_session"
"""The request key of the verified session (None when there is none)."""
ERROR: Any = _RequestKey("authio_error", object) if _RequestKey else "authio_error"
"""The request key of why there is no session (an AuthioError), or None."""
_GUARD: Any = _RequestKey("authio_guard", object) if _RequestKey else "authio_guard"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def authio_middleware(client: AsyncAuthioClient, *, store_id: str | None = None,
                      check_revocation: bool | None = None) -> Any:
    """The middleware: verifies the request's access token (Bearer, else the
    ``service_session`` cookie) with ``client``, puts the session on ``request[SESSION]``, and
    answers a :class:`Denied` raised by a handler (``require``) with the error envelope."""
    guard = Guard(client, store_id, check_revocation)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = bearer_token(request.headers.get("Authorization"), request.cookies.get(COOKIE))
        session, error = await judge(client, token, check_revocation)
        request[SESSION], request[ERROR], request[_GUARD] = session, error, guard
        try:
            return await handler(request)
        except Denied as denied:
            request_id = new_request_id(request.headers.get("X-Request-Id"))
            return web.json_response(denied.body(request_id), status=denied.status,
                                     headers={"X-Request-Id": request_id})
    return middleware


def session_of(request: web.Request) -> Session | None:
    """The request's verified session, or None."""
    session: Session | None = request.get(SESSION)
    return session


def require(relation: str | None = None, object: ObjectSpec | None = None, *,
            store_id: str | None = None) -> Callable[[Handler], Handler]:
    """A handler decorator: 401 without a valid session; with ``relation`` and ``object`` (a
    template of ``request.match_info``, or a function of the request) 403 unless
    ``user:<sub>`` has it in ``store_id`` (default: the middleware's)."""
    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def guarded(request: web.Request) -> web.StreamResponse:
            guard = request.get(_GUARD)
            if not isinstance(guard, Guard):
                raise RuntimeError("authio_client.aiohttp.authio_middleware is not installed")
            obj = None if object is None else object_of(object, request, request.match_info)
            error: AuthioError | None = request.get(ERROR)
            await permit(guard, session_of(request), error, relation=relation, obj=obj, store_id=store_id)
            return await handler(request)
        return guarded
    return decorate
