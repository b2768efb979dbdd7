"""The HTTP envelope every endpoint of both services shares.

* ``envelope_middleware``: assigns the request id (an incoming valid ``X-Request-Id`` is reused,
  else ``req_<ulid>``; also in ``common.logging.CURRENT_REQUEST_ID`` for the request's log lines),
  refuses a header value that is not UTF-8 text, sets ``X-Request-Id`` on every response, and is
  the one translation point from exceptions to ``{"error": {"code", "message", "details"},
  "request_id"}`` (DESIGN.md). Unknown routes, wrong methods and oversized bodies get the same
  envelope. A middleware behind the tracing one when tracing is on; otherwise the app has no
  middleware and ``EnvelopeRunner`` calls the same function around the whole app.
* ``json_response``: orjson body (a mapping or a dataclass) with ``request_id`` added at top
  level.
* ``read_json``: body decoding into ``invalid_request`` (models: ``common.schemas``).
* ``EnvelopeRunner``: ``web.AppRunner`` for both services, whose connections answer what aiohttp
  itself refuses before any middleware runs (HTTP its parser rejects) in the same envelope, and
  which remembers where each path was routed (:class:`RouteMemo`).
* ``OneWriteResponse``: the response every JSON answer is, written in one piece.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, cast

import orjson
from aiohttp import hdrs, http_exceptions, web, web_protocol, web_request, web_urldispatcher
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11

from common.db import is_connection_error
from common.errors import (
    DbUnavailable,
    Forbidden,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceError,
)
from common.ids import new_request_id
from common.logging import CURRENT_REQUEST_ID

log = logging.getLogger("authio.http")

REQUEST_ID: Final = web.RequestKey("request_id", str)
_INCOMING_ID_RE: Final = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
_JSON: Final = "application/json"
NO_ROUTE: Final = "No route matches this path."
"""The message of the 404 for a path no route of the server matches."""
NUL_MESSAGE: Final = "must not contain the NUL character (\\u0000)"
"""Why a value holding NUL is refused: PostgreSQL can store it in no text or jsonb column, so it
is refused where it is parsed (JSON bodies in ``read_json``, query strings in
``common.schemas.parse_query``)."""
_NUL_ESCAPE: Final = b"\\u0000"  # the only way JSON text can hold NUL (raw control bytes are malformed)
_MAX_NUL_FIELDS: Final = 20
# aiohttp decodes header bytes as UTF-8 with surrogateescape: a byte that is not UTF-8 becomes a
# lone surrogate, which no encoder (asyncpg's, orjson's) will take.
_UNDECODED_RE: Final = re.compile("[\udc80-\udcff]")
NOT_UTF8: Final = "must be UTF-8 text"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


OMIT_IF_NONE: Final = "omit_if_none"
"""Dataclass field metadata key: a field marked ``field(metadata={OMIT_IF_NONE: True})`` is left
out of the JSON body while its value is None (rather than written as ``null``)."""


_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _fields_of(cls: type) -> tuple[tuple[str, bool], ...]:
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = tuple((f.name, bool(f.metadata.get(OMIT_IF_NONE)))
                                      for f in dataclasses.fields(cls))
    return fields


def body_of(data: Any) -> dict[str, Any]:
    """``data`` as the top level of a JSON body: a mapping copied, a dataclass instance's fields
    (shallow: nested dataclasses are serialized by orjson itself, and a field marked
    ``OMIT_IF_NONE`` is left out while None)."""
    if isinstance(data, Mapping):
        return dict(data)
    body: dict[str, Any] = {}
    for name, omit in _fields_of(type(data)):
        value = getattr(data, name)
        if not (omit and value is None):
            body[name] = value
    return body


_NO_BODY_METHODS: Final = frozenset({hdrs.METH_HEAD, hdrs.METH_CONNECT})
"""Requests whose answer aiohttp writes without a body (``must_be_empty_body``; a 2xx to
CONNECT too)."""
_CONTROL_BUT_LINE_BREAKS: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters but TAB, CR and LF. aiohttp refuses all but TAB in a status line or header
(RFC 9110 5.5); CR and LF are counted instead (``OneWriteResponse``)."""


class OneWriteResponse(web.Response):
    """A ``web.Response`` with a ``bytes`` body whose status line, headers and body go out in one
    write, built in one step: the bytes aiohttp would send, without the six coroutine layers of
    its ``prepare``/``write_eof`` (a quarter of a single check's CPU on the hot path, issue 12).

    The short path is taken for the common case only: HTTP/1.1 with keep-alive, a status that
    has a body, a ``Content-Type``, no cookie, compression or chunking, no ``Content-Length``,
    ``Date`` or ``Server`` set by hand and no ``on_response_prepare`` signal on the request's
    apps. Anything else is aiohttp's own ``prepare``. As with aiohttp, ``prepare`` writes
    nothing and ``write_eof`` sends it all (a handler that prepares a response and then fails
    still gets aiohttp's 500). The headers written are those aiohttp writes, in its order (the
    handler's, then ``Content-Length``, ``Date``, ``Server``); the last three are not added to
    :attr:`headers` (nothing reads them after: the services run without aiohttp's access log).
    ``tests/common/test_one_write_response.py`` holds the bytes equal to aiohttp's for each
    case, so an aiohttp upgrade that changes them fails there. Raises ValueError for a header
    holding a control character, as aiohttp's serializer does (no header injection). Return it
    from a handler; it is not written to in parts (``write`` raises RuntimeError once the short
    path is taken)."""

    _head: bytes | None = None  # the status line and headers, once the short path is taken

    async def prepare(self, request: web_request.BaseRequest) -> Any:
        body = self._body
        headers = self._headers
        if (self._payload_writer is not None or self._eof_sent or type(body) is not bytes
                or request.version != HttpVersion11 or self._keep_alive is not None
                or not request.keep_alive or self._chunked or self._compression
                or self._cookies or request.method in _NO_BODY_METHODS
                or self._status < 200 or self._status in (204, 304)
                or hdrs.CONTENT_LENGTH in headers or hdrs.DATE in headers
                or hdrs.SERVER in headers or hdrs.CONTENT_TYPE not in headers):
            return await super().prepare(request)
        # As aiohttp's own hook reads it: None before routing (a refusal of the envelope) and
        # on a low-level server's request.
        match_info = getattr(request, "_match_info", None)
        if match_info is not None:
            for app in match_info.apps:
                if app.on_response_prepare:
                    return await super().prepare(request)
        head = (f"HTTP/1.1 {self._status} {self._reason}\r\n"
                + "\r\n".join(map(": ".join, headers.items()))  # no bytecode per header
                + f"\r\nContent-Length: {len(body)}\r\nDate: {rfc822_formatted_time()}\r\n"
                  f"Server: {SERVER_SOFTWARE}\r\n\r\n")
        # Exactly the line breaks written above, and no other control character: what aiohttp
        # refuses (a name, value or reason holding one), refused here too.
        breaks = len(headers) + 5
        if (head.count("\n") != breaks or head.count("\r") != breaks
                or _CONTROL_BUT_LINE_BREAKS.search(head) is not None):
            raise ValueError("Forbidden control character detected in headers. "
                             "Potential header injection attack.")
        try:
            self._head = head.encode()
        except UnicodeEncodeError:  # a lone surrogate: aiohttp's serializer drops it
            return await super().prepare(request)
        writer = self._payload_writer = request.writer
        self._req, self._keep_alive, self._must_be_empty_body = request, True, False
        return writer

    async def write_eof(self, data: bytes = b"") -> None:
        head = self._head
        if head is None or self._eof_sent:
            return await super().write_eof(data)
        writer = self._payload_writer
        assert writer is not None and not data
        await writer.write_eof(head + self._body)  # type: ignore[operator]  # bytes: prepare
        self._eof_sent, self._body_length = True, writer.output_size
        self._req = self._payload_writer = None

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._head is not None:
            raise RuntimeError("a OneWriteResponse is written whole by write_eof")
        await super().write(data)


def json_response(
    request: web.Request,
    data: Any,
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """Serialize ``data`` (a mapping or a dataclass instance, ``body_of``) plus ``request_id``
    with orjson (datetimes as RFC 3339 UTC with ``Z``)."""
    body = body_of(data)
    body["request_id"] = request[REQUEST_ID]
    return OneWriteResponse(
        body=orjson.dumps(body, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC),
        status=status,
        content_type=_JSON,
        headers=headers,
    )


def error_response(err: ServiceError, rid: str) -> web.Response:
    """A complete error response for ``err`` (status, headers, envelope)."""
    err, body = _written(err, rid)
    headers = {"X-Request-Id": rid, **err.headers}
    return OneWriteResponse(body=body, status=err.status, content_type=_JSON, headers=headers)


def _written(err: ServiceError, rid: str) -> tuple[ServiceError, bytes]:
    """``err`` and its envelope as JSON; ``internal_error`` and its envelope instead when ``err``
    cannot be written as JSON (a message or detail holding text that is not Unicode: a bug)."""
    try:
        return err, orjson.dumps(
            {"error": {"code": err.code, "message": err.message, "details": err.details},
             "request_id": rid})
    except orjson.JSONEncodeError:
        log.exception("the %s error could not be written as JSON", err.code,
                      extra={"request_id": rid})
        fallback = InternalError()
        return fallback, orjson.dumps(
            {"error": {"code": fallback.code, "message": fallback.message, "details": {}},
             "request_id": rid})


def undecodable_header(request: web.Request) -> str | None:
    """The name of the first header whose value is not UTF-8 text, or None."""
    for _, raw in request.raw_headers:  # the usual case, all ASCII, decided on the bytes
        if not raw.isascii():
            break
    else:
        return None
    for name, value in request.headers.items():
        if not value.isascii() and _UNDECODED_RE.search(value):
            return name
    return None


async def _body(request: web.Request) -> bytes:
    """The request's body, as ``request.read()`` gives it (decoded, limited to
    ``client_max_size``), taken at once when all of it has arrived, which for a small body is
    the usual case: ``read()`` awaits ``readany()`` twice (the body, then the end) and copies it
    twice. Kept where ``read()`` keeps it, so either may read the body again after the other."""
    if request._read_bytes is not None:
        return request._read_bytes
    payload = request.content
    if not payload.is_eof():
        return await request.read()
    raw = payload.read_nowait()
    limit = request.client_max_size
    if limit and len(raw) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(raw))
    request._read_bytes = raw
    return raw


async def read_json(request: web.Request, *, allow_nul: bool = False) -> dict[str, Any]:
    """Decode the body as a JSON object.

    Raises InvalidRequest for an empty, malformed or non-object body, one whose encoding cannot
    be decoded (``details.reason`` ``bad_body_encoding``), and for a NUL character in
    any string or key (naming each by its dotted path: ``metadata.a.b``, ``writes.3.object``;
    for a key, the object holding it) unless ``allow_nul``; PayloadTooLarge past the server's
    ``client_max_size``.
    """
    try:
        raw = await _body(request)
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(details={"max_bytes": request.client_max_size}) from None
    except web_protocol.RequestPayloadError as exc:
        # aiohttp decodes Content-Encoding and chunking as the body is read: what it cannot
        # decode surfaces here, in the handler, not in its parser.
        raise malformed_http(exc.__cause__) from None
    if not raw:
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"Malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if not allow_nul and _NUL_ESCAPE in raw:  # a byte search; the walk only when it may be there
        fields = _nul_fields(data)
        if fields:
            raise InvalidRequest(f"{fields[0]['field']}: {NUL_MESSAGE}", details={"fields": fields})
    return data


def _nul_fields(data: dict[str, Any]) -> list[dict[str, str]]:
    """Where ``data`` holds NUL: a string value by its dotted path, a key by the path of the
    object holding it (``body`` at the top); depth first in document order, at most
    ``_MAX_NUL_FIELDS``. Iterative: JSON nests deeper than Python's recursion limit."""
    fields: list[dict[str, str]] = []
    stack: list[tuple[str, Any]] = [("", data)]
    while stack and len(fields) < _MAX_NUL_FIELDS:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                fields.append({"field": path, "message": NUL_MESSAGE})
        elif isinstance(value, dict):
            if any("\x00" in key for key in value):
                fields.append({"field": path or "body", "message": f"a key {NUL_MESSAGE}"})
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}", v) for i, v in reversed(list(enumerate(value))))
    return fields


def _from_http_exception(exc: web.HTTPException) -> ServiceError:
    if exc.status == 404:
        return NotFound(NO_ROUTE)
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


_DENY_ONLY_PREFIXES: list[str] = []


def deny_only_under(prefix: str) -> None:
    """Answer every refusal of a path under ``prefix`` with 401 or 403 only: an error of
    another status (a header that is not text, a bad ``Expect``, ...) becomes 403 ``forbidden``
    with its code as ``details.reason``. For forward auth (``engine.edge``): nginx turns any
    other status of an ``auth_request`` into a 500, and Envoy lets only 200 through."""
    if prefix not in _DENY_ONLY_PREFIXES:
        _DENY_ONLY_PREFIXES.append(prefix)


ErrorRenderer = Callable[[ServiceError, str], web.Response]
"""Writes a complete error response for an error and a request id (status, ``X-Request-Id``,
the error's own headers, a body of its own shape)."""
_RENDERERS: dict[str, ErrorRenderer] = {}


def render_errors_under(prefix: str, render: ErrorRenderer) -> None:
    """Answer every refusal of a path under ``prefix`` (``prefix`` itself or ``prefix/...``) by
    ``render`` instead of the envelope: every error this middleware answers there, an unknown
    route's 404 and a 405 among them. For protocols whose clients expect their own error
    bodies (SCIM's, RFC 7644 3.12); the route table's ``ErrorBody`` documents it."""
    _RENDERERS[prefix.rstrip("/")] = render


def _renderer(path: str) -> ErrorRenderer | None:
    for prefix, render in _RENDERERS.items():
        if path == prefix or path.startswith(prefix + "/"):
            return render
    return None


REFUSAL_HEADERS: Final = web.RequestKey("refusal_headers", Mapping[str, str])
"""Headers a route's own layer puts on the request for the envelope to set on its refusal too
(the CORS headers of a public route, ``control_plane.tenancy.cors``); read on refusals only."""

ALLOWED_ORIGIN: Final = web.RequestKey("allowed_origin", str)
"""The request's ``Origin`` when the project it names allows it (``control_plane.tenancy.cors``,
which also made sure a session token it presents is that project's): the session cookie's CSRF
check (``control_plane.web.auth.check_same_origin``) trusts it as it trusts this origin."""


def _refusal(request: web.Request, err: ServiceError, rid: str) -> web.Response:
    response = _refusal_of(request, err, rid)
    extra = request.get(REFUSAL_HEADERS)
    if extra:
        response.headers.update(extra)
    return response


def _refusal_of(request: web.Request, err: ServiceError, rid: str) -> web.Response:
    if err.status not in (401, 403) and _DENY_ONLY_PREFIXES and request.path.startswith(
            tuple(_DENY_ONLY_PREFIXES)):
        err = Forbidden(err.message, details={"reason": err.code})
    render = _renderer(request.path) if _RENDERERS else None
    if render is not None:
        return render(err, rid)
    return error_response(err, rid)


@web.middleware
async def envelope_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id in, ``X-Request-Id`` out, every exception as the error envelope."""
    incoming = request.headers.get("X-Request-Id")
    rid = incoming if incoming and _INCOMING_ID_RE.match(incoming) else new_request_id()
    request[REQUEST_ID] = rid
    token = CURRENT_REQUEST_ID.set(rid)  # every log line of this request carries it
    try:
        # Headers are read by rules, stored (User-Agent in the audit log) and echoed in errors:
        # one that is not text is refused here, once, rather than failing wherever it lands.
        bad_header = undecodable_header(request)
        if bad_header is not None:
            return _refusal(request, InvalidRequest.field(bad_header, NOT_UTF8), rid)
        response = await handler(request)
    except ServiceError as err:
        return _refusal(request, err, rid)
    except web.HTTPException as exc:
        if exc.status < 400:
            exc.headers["X-Request-Id"] = rid
            raise
        return _refusal(request, _from_http_exception(exc), rid)
    except Exception as exc:
        if is_connection_error(exc):
            log.warning("database unavailable", extra={"request_id": rid}, exc_info=exc)
            return _refusal(request, DbUnavailable(), rid)
        log.exception("unhandled error", extra={"request_id": rid})
        return _refusal(request, InternalError(), rid)
    finally:
        CURRENT_REQUEST_ID.reset(token)
    if not response.prepared:
        response.headers["X-Request-Id"] = rid
    return response


# --- what aiohttp answers before the app runs -----------------------------------------------------

_MALFORMED: Final = (
    # (parser error, details.reason, message): the most specific first. Never the parser's own
    # text, which quotes the offending bytes (the request line, the path, a header).
    (http_exceptions.LineTooLong, "line_too_long",
     "A request line or header is longer than the server accepts (8190 bytes)."),
    (http_exceptions.BadHttpMethod, "bad_method", "The request method is not valid."),
    (http_exceptions.BadStatusLine, "bad_request_line", "The request line is not valid HTTP/1.1."),
    (http_exceptions.InvalidURLError, "bad_target", "The request target is not a valid URL."),
    (http_exceptions.InvalidHeader, "bad_header", "A header is not valid HTTP."),
    (http_exceptions.PayloadEncodingError, "bad_body_encoding",
     "The body's framing or content encoding is not valid."),
)


def malformed_http(exc: BaseException | None) -> InvalidRequest:
    """``invalid_request`` for a request aiohttp's parser refused (``exc``), with
    ``details.reason``; the request's own bytes are never repeated."""
    for kind, reason, message in _MALFORMED:
        if isinstance(exc, kind):
            return InvalidRequest(message, details={"reason": reason})
    return InvalidRequest("The request is not valid HTTP.", details={"reason": "malformed"})


class _EnvelopeRequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection protocol, answering its own errors in the envelope.

    ``handle_error`` is what aiohttp calls for every error it answers itself, outside any
    middleware: 400 for a request its parser refused (a request line over 8 KiB, a bare LF, a NUL
    in a header, ...), 500 (or 504) for an exception that escaped the middleware chain. Its
    default is a ``text/plain`` page quoting the parser's message, which repeats the offending
    bytes. The connection is closed after it, as aiohttp does: the parser's state is lost."""

    def handle_error(self, request: web_request.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: the status line is out already
            raise ConnectionError("Response is sent already, cannot send another response "
                                  "with the error message")
        rid = new_request_id()  # the headers were never parsed: no incoming id to reuse
        err: ServiceError
        if status == 400:
            err = malformed_http(exc)
            log.info("malformed HTTP refused (%s) from %s", err.details["reason"], request.remote,
                     extra={"request_id": rid})
        else:
            err = InternalError()
            log.error("error outside the middleware (aiohttp status %s)", status,
                      exc_info=exc, extra={"request_id": rid})
        # A request the parser refused has no path of its own (aiohttp's placeholder is "/").
        render = _renderer(request.path) if _RENDERERS else None
        response = render(err, rid) if render is not None else error_response(err, rid)
        response.headers.update(cast(_EnvelopeServer, self._manager).response_headers)
        response.force_close()
        return response


class _EnvelopeServer(web.Server):
    """``web.Server`` whose connections are :class:`_EnvelopeRequestHandler`; its
    ``response_headers`` go on the errors they answer themselves too."""

    response_headers: Mapping[str, str] = {}

    def __call__(self) -> web_protocol.RequestHandler:
        return _EnvelopeRequestHandler(self, loop=self._loop, **self._kwargs)


ROUTE_MEMO_ENTRIES: Final = 16_384
"""How many (method, path) pairs :class:`RouteMemo` remembers; it starts over when full."""
ROUTE_MEMO_PATH: Final = 256
"""Longest path :class:`RouteMemo` remembers (a forward-auth tail may be 8 KiB long: 16,384 of
those would be 270 MB); longer ones go through aiohttp's routing every time."""


class RouteMemo:
    """``app``'s request handler with aiohttp's routing remembered by (method, path).

    aiohttp resolves every request by walking the path's prefixes and trying each candidate
    resource's pattern in turn (a tenth of a single check's CPU, issue 12). What it finds is a
    function of the method and the path alone for the resources these apps register (plain and
    dynamic paths, no domain-matched sub-apps, which this refuses at construction), so a pair
    seen once is answered from a dict: the same route and ``match_info`` values, in one
    ``UrlMappingMatchInfo`` made as ``Application._handle`` makes it (the app added, frozen) and
    shared by the requests of that pair. Nothing writes to a frozen one once routing is done
    (aiohttp's own writer, the ``current_app`` switch of ``_fix_request_current_app``, runs only
    in an app with middlewares, which this refuses). A handler must not write to
    ``request.match_info`` (a dict: no handler does); it would write to every later request of
    that pair. Only found routes of the app itself
    are remembered (a 404 or 405 goes through aiohttp every time), and a request with
    ``Expect`` goes through aiohttp too (its expect handler). For an app without middlewares
    only: a remembered route calls its handler directly. Bounded by :data:`ROUTE_MEMO_ENTRIES`
    and :data:`ROUTE_MEMO_PATH` (paths carry ids: a flood of new ones costs what aiohttp's
    routing costs)."""

    __slots__ = ("_app", "_handle", "_routes")

    def __init__(self, app: web.Application) -> None:
        if app.middlewares:
            raise ValueError("RouteMemo serves apps without middlewares")
        if any(isinstance(r, web_urldispatcher.MatchedSubAppResource) for r in app.router.resources()):
            raise ValueError("RouteMemo cannot remember routes that depend on the host")
        self._app = app
        self._handle = app._handle
        self._routes: dict[tuple[str, str], tuple[web.UrlMappingMatchInfo, Handler]] = {}

    async def __call__(self, request: web_request.BaseRequest) -> web.StreamResponse:
        request = cast(web.Request, request)  # the app's request factory makes them
        key = (request.method, request.rel_url.path_safe)
        hit = self._routes.get(key)
        if hit is None or hdrs.EXPECT in request.headers:
            response = await self._handle(request)
            match_info = request.match_info
            if (hit is None and type(match_info) is web.UrlMappingMatchInfo
                    and match_info.apps == (self._app,) and len(key[1]) <= ROUTE_MEMO_PATH):
                if len(self._routes) >= ROUTE_MEMO_ENTRIES:
                    self._routes.clear()
                shared = web.UrlMappingMatchInfo(dict(match_info), match_info.route)
                shared.add_app(self._app)
                shared.freeze()
                self._routes[key] = (shared, match_info.route.handler)
            return response
        request._match_info, handler = hit  # as Application._handle does
        return await handler(request)


class EnvelopeRunner(web.AppRunner):
    """``web.AppRunner`` serving through :class:`_EnvelopeServer`: what aiohttp refuses before
    the app runs is answered in the envelope too. Serve both services with it
    (``common.runtime.run_app``, and the tests' servers).

    aiohttp 3 has no public hook for this: a parser error never reaches the middleware or
    ``on_response_prepare`` (aiohttp 4 routes it through the middleware chain, aio-libs/aiohttp
    #3287). Runners exist to be subclassed through ``_make_server`` (``ServerRunner`` and
    ``AppRunner`` are such subclasses); this one makes the app's server as ``AppRunner`` does
    and builds the same server with the envelope's protocol.

    An app without ``envelope_middleware`` among its middlewares (``base_app`` leaves it out when
    tracing is off) gets the envelope here, around the whole app: the same function, on every
    request, at the same place (outermost), without the per-request layers aiohttp adds to any
    app that has a middleware, and with aiohttp's routing remembered (:class:`RouteMemo`). Such
    an app must be served by this runner.

    ``response_headers`` (``Strict-Transport-Security`` on a TLS listener, ``common.tls``) are
    set on every response: those the handlers return, the ``HTTPException`` s they raise, the
    errors answered here, and a response a handler prepares itself when it takes them from
    :func:`response_headers` (``control_plane.web.streaming``). Without them the request path
    is unchanged."""

    def __init__(self, app: web.Application, *, response_headers: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._response_headers = dict(response_headers or {})

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        handler: Callable[[web_request.BaseRequest], Awaitable[web.StreamResponse]]
        handler = server.request_handler
        if envelope_middleware not in self.app.middlewares:
            # The app has no middleware (``common.runtime.base_app`` without tracing): the
            # envelope wraps the whole app here, which is the same function at the same place
            # for every request, minus the layer aiohttp adds per request to an app that has
            # any middleware (``_fix_request_current_app``) and the middleware chain's lookup.
            if not self.app.middlewares:
                handler = RouteMemo(self.app)
            handler = functools.partial(envelope_middleware, handler=handler)
        if self._response_headers:
            handler = functools.partial(_with_headers, handler=handler,
                                        headers=self._response_headers)
        made = _EnvelopeServer(handler, request_factory=server.request_factory,
                               handler_cancellation=server.handler_cancellation,
                               loop=server._loop, **server._kwargs)
        made.response_headers = self._response_headers
        return made


RESPONSE_HEADERS: Final = web.RequestKey("response_headers", Mapping[str, str])


def response_headers(request: web.Request) -> Mapping[str, str]:
    """The headers every response of ``request``'s listener carries (``EnvelopeRunner``'s
    ``response_headers``; none by default): for a handler that prepares its response itself."""
    headers: Mapping[str, str] = request.get(RESPONSE_HEADERS, {})
    return headers


async def _with_headers(request: web_request.BaseRequest, *, handler: Callable[
        [web_request.BaseRequest], Awaitable[web.StreamResponse]],
        headers: Mapping[str, str]) -> web.StreamResponse:
    """``handler``'s response with ``headers`` set (on the exception when it raises one)."""
    request[RESPONSE_HEADERS] = headers
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(headers)
        raise
    if not response.prepared:
        response.headers.update(headers)
    return response
