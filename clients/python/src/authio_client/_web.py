"""What the Starlette and aiohttp middleware share (no framework imported here): finding the
access token of a request, judging it, the ``require`` rule, and the error envelope they answer.

The token: ``Authorization: Bearer <token>`` wins, else the ``service_session`` cookie (as the
engine's edge validation reads it). No token leaves the request anonymous (the session is None);
a token that does not verify leaves it anonymous too, with the error kept for ``require``.

``require(relation, object)`` answers the way the engine's ``/v1/edge/validate`` does: 401
``no_session`` (no token) or ``invalid_session`` (``details.reason``: ``signature``,
``expired``, ``project``, ``revoked``) before anything else, then, with a permission, 403
``forbidden`` when ``user:<sub>`` lacks ``relation`` on ``object`` in the store. A check that
cannot be answered fails closed with the check's own error (503 ``db_unavailable``...). Bodies
are the envelope ``{"error": {"code", "message", "details"}, "request_id"}`` with the
``X-Request-Id`` header (the request's own when it sent a well-formed one, else a new
``req_`` id).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from authio_client._async import AsyncAuthioClient
from authio_client.errors import AuthioError, NoSession
from authio_client.models import Session

__all__ = ["COOKIE", "Denied", "Guard", "ObjectSpec", "bearer_token", "judge", "new_request_id", "permit"]

COOKIE: Final = "service_session"
_CROCKFORD: Final = "0123456789abcdefghjkmnpqrstvwxyz"
_REQUEST_ID: Final = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

ObjectSpec = str | Callable[[Any], str]
"""The object of a permission: a template filled with the route's path parameters
(``"doc:{doc_id}"``), or a function of the request answering ``type:id``."""


def new_request_id(incoming: str | None = None) -> str:
    """``incoming`` when it is a well-formed request id, else a new ``req_`` id."""
    if incoming and _REQUEST_ID.match(incoming):
        return incoming
    return "req_" + "".join(secrets.choice(_CROCKFORD) for _ in range(26))


def bearer_token(authorization: str | None, cookie: str | None) -> str | None:
    """The access token of a request: the Bearer token, else the cookie's value."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return cookie or None


class Denied(Exception):
    """Raised by ``require`` (or by your code) to answer ``status`` with the error envelope of
    ``code``, ``message`` and ``details``; the middleware turns it into the response."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details = dict(details or {})

    @classmethod
    def of(cls, err: AuthioError) -> Denied:
        return cls(err.status or 503, err.code, err.message, err.details)

    def body(self, request_id: str) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details},
                "request_id": request_id}


@dataclass(frozen=True, slots=True)
class Guard:
    """A middleware's settings: its client, the default store of ``require``, and whether
    sessions are also checked for revocation at the engine."""

    client: AsyncAuthioClient
    store_id: str | None
    check_revocation: bool | None


async def judge(client: AsyncAuthioClient, token: str | None,
                check_revocation: bool | None) -> tuple[Session | None, AuthioError | None]:
    """The session of ``token`` and None, or None and why there is none."""
    if token is None:
        return None, NoSession("No active session.", status=401)
    try:
        return await client.verify_session(token, check_revocation=check_revocation), None
    except AuthioError as err:  # 401, or the JWKS/engine unreachable: require() answers it
        return None, err


def object_of(spec: ObjectSpec, request: Any, params: Mapping[str, Any]) -> str:
    if callable(spec):
        return spec(request)
    return spec.format_map(params)


async def permit(guard: Guard, session: Session | None, error: AuthioError | None, *,
                 relation: str | None, obj: str | None, store_id: str | None) -> Session:
    """``session`` when it exists and (with ``relation``) may ``relation`` ``obj``; else raises
    :class:`Denied` as the module docstring says."""
    if session is None:
        raise Denied.of(error or NoSession("No active session.", status=401))
    if relation is None or obj is None:
        return session
    store = store_id or guard.store_id
    if store is None:
        raise RuntimeError("require() with a permission needs a store_id (here or on the middleware)")
    try:
        result = await guard.client.check(store, obj, relation, session.subject)
    except AuthioError as err:
        raise Denied.of(err) from err
    if not result.allowed:
        raise Denied(403, "forbidden", f"{session.subject} may not {relation} {obj}.",
                     {"relation": relation, "object": obj})
    return session
