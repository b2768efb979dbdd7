"""The typed endpoint: a handler of about a dozen lines that receives its input already parsed.

A domain's ``endpoints.py`` declares each route with :func:`endpoint`::

    routes = RouteTable("users")

    @endpoint(routes, "POST", "/v1/users", auth=ApiKey("users:write"),
              replies=[Reply(201, "Created", User), Reply(200, "Already existed", User)])
    async def post_users(call: Call, body: CreateUser) -> web.Response:
        \"\"\"Create a user (idempotent on the email).\"\"\"
        async with call.connection() as conn:
            user, created = await service.create_user(conn, call.actor, body=body, ...)
        return call.reply(user, status=201 if created else 200)

The decorator reads the handler's annotations: a ``body`` parameter is the JSON body parsed into
its model (``common.schemas.RequestModel``), a ``query`` parameter the query string parsed into
its model (``common.schemas.QueryModel``). Path parameters are ids (``common.ids.PATH_IDS``: a
route with another is refused when declared) or carry their own pattern (``{name:regex}``, with
no braces in the regex). The aiohttp handler it registers runs, in order: the route's
authentication (``control_plane.web.auth``: 401/403 before anything is read), the path
parameters (``common.schemas.parse_path_param``), the query, the content type when ``json_only``,
then the body; so every refusal is the envelope's, and the same table gives the
OpenAPI document (``common.routing``).

Naming: handlers are named for their method and resource (``get_users``, ``post_users``,
``delete_user``); rules in ``service.py`` never begin with an HTTP method's name.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from aiohttp import web

from common.errors import InvalidRequest, ServiceError
from common.ids import PATH_IDS
from common.routing import ErrorBody, Operation, Reply, RequestHeader, RouteTable, summary_of
from common.schemas import parse_body, parse_path_param, parse_query
from control_plane.web.auth import Auth

__all__ = ["TypedHandler", "endpoint", "require_json"]

TypedHandler = Callable[..., Awaitable[web.StreamResponse]]
_JSON: Final = "application/json"
_PATH_PARAM_RE: Final = re.compile(r"\{([^}:]+)(:)?")


def require_json(request: web.Request) -> None:
    """Refuse a body that is not ``application/json``. Endpoints that set the session cookie
    take JSON only (login CSRF): a form on another site can post text/plain, urlencoded or
    multipart bodies without a CORS preflight, and the SameSite=Lax cookie would then be set by a
    top-level navigation; a JSON post from another origin needs a preflight, which is never
    granted. Raises InvalidRequest naming ``Content-Type``."""
    if request.content_type != _JSON:
        raise InvalidRequest(
            "Content-Type must be application/json.",
            details={"fields": [{"field": "Content-Type", "message": "must be application/json"}]},
        )


def endpoint(
    routes: RouteTable, method: str, path: str, *, auth: Auth, replies: Iterable[Reply],
    errors: Iterable[type[ServiceError]] = (), json_only: bool = False,
    headers: Mapping[str, str | RequestHeader] | None = None, allow_head: bool = True,
    body: type[Any] | None = None, error_body: ErrorBody | None = None,
    operation_id: str | None = None,
) -> Callable[[TypedHandler], TypedHandler]:
    """Register a typed handler ``(call, [query], [body])`` as ``method path`` in ``routes``.

    ``body`` documents a JSON body the handler reads itself (when it must decide what to do
    before parsing it); otherwise the handler's own ``body`` parameter both parses and documents
    it. ``headers`` documents request headers the handler reads. ``error_body`` documents errors
    written in a shape of their own (``common.http.render_errors_under``). ``operation_id``
    names the generated client's method where the one derived from the handler's name
    (``common.openapi.method_name``) would not read well. Returns the handler unchanged.
    """
    replies = tuple(replies)
    path_params = [name for name, _ in _PATH_PARAM_RE.findall(path)]
    # A parameter with its own pattern ({name:regex}) is matched by the router and documented
    # with that pattern; any other is an id.
    unknown = [name for name, regex in _PATH_PARAM_RE.findall(path)
               if not regex and name not in PATH_IDS]
    if unknown:
        raise ValueError(f"{method} {path}: path parameters {unknown} are not ids of "
                         "common.ids.PATH_IDS")

    def register(handler: TypedHandler) -> TypedHandler:
        hints = typing.get_type_hints(handler)
        body_model = hints.get("body")
        query_model = hints.get("query")

        async def handle(request: web.Request) -> web.StreamResponse:
            call = await auth(request)
            for name in path_params:
                parse_path_param(name, request.match_info[name])
            kwargs: dict[str, Any] = {}
            if query_model is not None:
                kwargs["query"] = parse_query(request.query, query_model)
            if json_only:
                require_json(request)
            if body_model is not None:
                kwargs["body"] = await parse_body(request, body_model)
            return await handler(call, **kwargs)

        handle.__name__ = handle.__qualname__ = handler.__name__
        handle.__doc__ = handler.__doc__
        summary, description = summary_of(handler)
        routes.add(Operation(
            method=method, path=path, handler=handle, operation_id=operation_id or handler.__name__,
            tag=routes.tag, summary=summary, description=description, security=auth.security,
            scopes=auth.scopes, project=auth.names_project, body=body_model or body,
            query=query_model, headers=dict(headers or {}), replies=replies,
            errors=tuple(errors), allow_head=allow_head, error_body=error_body,
        ))
        return handler

    return register
