"""The HTTP envelope every endpoint of both services shares.

* ``envelope_middleware``: assigns the request id (an incoming valid ``X-Request-Id`` is reused,
  else ``req_<ulid>``; also in ``common.logging.CURRENT_REQUEST_ID`` for the request's log lines),
  sets ``X-Request-Id`` on every response, and is the one translation point
  from exceptions to ``{"error": {"code", "message", "details"}, "request_id"}`` (DESIGN.md).
  Unknown routes, wrong methods and oversized bodies get the same envelope.
* ``json_response``: orjson body with ``request_id`` added at top level.
* ``read_json`` / ``parse_body``: body decoding and validation into ``invalid_request``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, ClassVar, Final, Self, TypeVar

import orjson
from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    StringConstraints,
    ValidationError,
    model_validator,
)

from common.errors import (
    DbUnavailable,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceError,
)
from common.ids import new_id
from common.logging import CURRENT_REQUEST_ID

log = logging.getLogger("authio.http")

REQUEST_ID: Final = web.RequestKey("request_id", str)
_INCOMING_ID_RE: Final = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
_JSON: Final = "application/json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)


CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters (and DEL): never allowed in a human-readable text field."""


def printable(value: str) -> str:
    """``value`` unchanged; a pydantic ``AfterValidator`` raising ValueError when it holds a
    control character (``CONTROL_RE``)."""
    if CONTROL_RE.search(value):
        raise ValueError("must not contain control characters")
    return value


DisplayName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
    AfterValidator(printable),
]
"""A human-readable name field: 1 to 200 characters after trimming, no control characters."""


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields rejected, no type coercion (DESIGN.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PatchModel(RequestModel):
    """Base of ``PATCH`` bodies, where only the fields present change: at least one field must be
    given, and ``null`` is refused except for the fields named in ``nullable_fields`` (where
    ``null`` clears the value). Both rules are ``invalid_request`` through ``parse_body``."""

    nullable_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="after")
    def _not_empty_and_no_null(self) -> Self:
        fields = type(self).model_fields
        if not self.model_fields_set:
            raise ValueError(f"give at least one of {', '.join(fields)}")
        for name in fields:
            if (name in self.model_fields_set and name not in self.nullable_fields
                    and getattr(self, name) is None):
                raise ValueError(f"{name} cannot be null")
        return self


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def client_ip(request: web.Request, trusted: Networks) -> str | None:
    """The client's address: the peer, unless the peer is a trusted proxy, in which case the
    right-most ``X-Forwarded-For`` entry that is not itself a trusted proxy (entries further left
    are the client's own claims and cannot be believed)."""
    peer = request.remote
    if not trusted or peer is None or not _in(peer, trusted):
        return peer
    hops = [h.strip() for h in ",".join(request.headers.getall("X-Forwarded-For", [])).split(",")]
    for hop in reversed([h for h in hops if h]):
        if not _in(hop, trusted):
            return hop
    return peer


def _in(address: str, networks: Networks) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def request_id(request: web.Request) -> str:
    """The id the envelope middleware assigned to ``request``."""
    return request[REQUEST_ID]


def json_response(
    request: web.Request,
    data: Mapping[str, Any],
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """Serialize ``data`` plus ``request_id`` with orjson."""
    body = dict(data)
    body["request_id"] = request[REQUEST_ID]
    return web.Response(
        body=orjson.dumps(body, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC),
        status=status,
        content_type=_JSON,
        headers=headers,
    )


def error_body(err: ServiceError, rid: str) -> bytes:
    """The envelope of ``err`` as JSON bytes."""
    return orjson.dumps(
        {"error": {"code": err.code, "message": err.message, "details": err.details},
         "request_id": rid}
    )


def error_response(err: ServiceError, rid: str) -> web.Response:
    """A complete error response for ``err`` (status, headers, envelope)."""
    headers = {"X-Request-Id": rid, **err.headers}
    return web.Response(body=error_body(err, rid), status=err.status, content_type=_JSON,
                        headers=headers)


async def read_json(request: web.Request) -> dict[str, Any]:
    """Decode the body as a JSON object.

    Raises InvalidRequest for an empty, malformed or non-object body; PayloadTooLarge past the
    server's ``client_max_size``.
    """
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(details={"max_bytes": request.client_max_size}) from None
    if not raw:
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"Malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


def validation_error(exc: ValidationError) -> InvalidRequest:
    """Turn a pydantic error into ``invalid_request`` with ``details.fields`` (dotted paths)."""
    fields = []
    for err in exc.errors(include_url=False):
        path = ".".join(str(p) for p in err["loc"]) or "body"
        cause = err.get("ctx", {}).get("error")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif isinstance(cause, ValueError):
            msg = getattr(cause, "message", None) or str(cause)  # our own rule's words
        else:
            msg = err["msg"]
        fields.append({"field": path, "message": msg})
    first = fields[0] if fields else {"field": "body", "message": "invalid"}
    return InvalidRequest(f"{first['field']}: {first['message']}", details={"fields": fields})


def parse_model(model: type[M], data: Mapping[str, Any]) -> M:
    """Validate ``data`` into ``model``; raises InvalidRequest naming each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """``read_json`` then ``parse_model``; models forbid unknown fields (DESIGN.md)."""
    return parse_model(model, await read_json(request))


def _is_db_outage(exc: BaseException) -> bool:
    # asyncpg raises OSError subclasses and its own connection errors when PostgreSQL is down.
    import asyncpg

    return isinstance(
        exc,
        ConnectionError
        | asyncpg.exceptions.PostgresConnectionError
        | asyncpg.exceptions.CannotConnectNowError
        | asyncpg.exceptions.TooManyConnectionsError
        | asyncpg.exceptions.ConnectionDoesNotExistError
        # AdminShutdownError, CrashShutdownError: in-flight queries when the server stops.
        | asyncpg.exceptions.OperatorInterventionError,
    ) or (isinstance(exc, asyncpg.exceptions.InterfaceError) and "connection is closed" in str(exc)) or (
        isinstance(exc, OSError) and exc.errno is not None
    )


def _from_http_exception(exc: web.HTTPException) -> ServiceError:
    if exc.status == 404:
        return NotFound("No route matches this path.")
    if exc.status == 405:
        allowed = sorted(getattr(exc, "allowed_methods", ()) or ())
        return MethodNotAllowed(
            "Method not allowed on this path.",
            details={"allowed_methods": allowed},
            headers={"Allow": ",".join(allowed)} if allowed else None,
        )
    if exc.status == 413:
        return PayloadTooLarge()
    err = InvalidRequest(exc.text or exc.reason)
    return err


@web.middleware
async def envelope_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id in, ``X-Request-Id`` out, every exception as the error envelope."""
    incoming = request.headers.get("X-Request-Id")
    rid = incoming if incoming and _INCOMING_ID_RE.match(incoming) else new_id("req")
    request[REQUEST_ID] = rid
    token = CURRENT_REQUEST_ID.set(rid)  # every log line of this request carries it
    try:
        response = await handler(request)
    except ServiceError as err:
        return error_response(err, rid)
    except web.HTTPException as exc:
        if exc.status < 400:
            exc.headers["X-Request-Id"] = rid
            raise
        return error_response(_from_http_exception(exc), rid)
    except Exception as exc:
        if _is_db_outage(exc):
            log.warning("database unavailable", extra={"request_id": rid}, exc_info=exc)
            return error_response(DbUnavailable(), rid)
        log.exception("unhandled error", extra={"request_id": rid})
        return error_response(InternalError(), rid)
    finally:
        CURRENT_REQUEST_ID.reset(token)
    if not response.prepared:
        response.headers["X-Request-Id"] = rid
    return response
