"""Route tables that describe themselves: what an app mounts and what its OpenAPI document says.

Each domain declares one :class:`RouteTable`; every route in it is an :class:`Operation`, the
aiohttp handler together with what a client needs to call it (its security, body and query
models, documented replies and error codes). The app mounts the tables
(:meth:`RouteTable.mount`) and :mod:`common.openapi` turns the same tables into the OpenAPI 3.1
document, so the document cannot drift from the routes that are served.

Models are pydantic models (request bodies and query strings, :class:`common.http.RequestModel`)
and dataclasses or pydantic models (response bodies); anything ``pydantic.TypeAdapter`` gives a
JSON Schema for will do. Plain data, no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from aiohttp import web

from common.errors import ServiceError

__all__ = ["ErrorBody", "Handler", "Operation", "Reply", "RouteTable", "Security"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

Security = Literal["api_key", "session", "bootstrap_token", "scim_token", "console_session",
                   "portal_session"]
"""How a caller proves who it is: an ``sk_live_``/``sk_test_`` API key (``Authorization:
Bearer``), a session's access token (``Authorization: Bearer`` or the ``service_session``
cookie), the deployment's bootstrap token (``x-service-bootstrap-token``), an organization's
SCIM token (``Authorization: Bearer scim_...``), the operator console's session (the
``authio_console`` cookie; an unsafe call also carries the page's ``X-CSRF-Token``), or the
admin portal's session (the ``service_portal_session`` cookie)."""

METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class Reply:
    """One documented response of an operation.

    ``schema`` is the type of the JSON body (a dataclass or pydantic model; ``request_id`` is
    added to every JSON body by the envelope and need not be part of it), or None for a body
    that is not JSON (``content_type`` says what it is) or no body at all (``content_type``
    None). ``envelope`` False marks a JSON body the envelope does not touch (no
    ``request_id``: a document the service serves as it is). ``headers`` names response headers
    worth documenting, with their meaning.
    """

    status: int
    description: str
    schema: Any = None
    content_type: str | None = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    envelope: bool = True


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """How a route's errors are written when not in the envelope (the SCIM routes answer RFC
    7644's error shape): the ``content_type``, and the JSON Schema of the body as the OpenAPI
    component ``name``. The middleware writes them (``common.http.render_errors_under``); this
    says so in the document."""

    name: str
    content_type: str
    schema: Mapping[str, Any]
    description: str = ""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A documented request header whose value has a form: ``meaning``, and the ``pattern`` (a
    JSON Schema regular expression, anchored) every accepted value matches."""

    meaning: str
    pattern: str


@dataclass(frozen=True, slots=True)
class Operation:
    """One route: ``method`` and ``path`` (aiohttp's template, ``{name}`` for path parameters)
    served by ``handler``, and what the document says of it.

    * ``operation_id``: unique across the service: the handler's name (which is unique), from
      which the document derives the method name a client calls (``common.openapi.method_name``:
      ``post_users`` is ``create_user``), or a method name declared on the route, kept as it is.
    * ``security``: the ways to authenticate, any one of which is enough; empty for a public
      route. ``scopes``: the API-key scopes of which the key needs one (empty: any key).
    * ``project``: a public route that names its project (``project_id`` query parameter,
      ``Service-Project`` header, or the host; DESIGN.md "project of public endpoints").
    * ``body``: the JSON request body's model; ``query``: a model whose fields are the query
      parameters. ``headers``: request headers worth documenting, with their meaning (or a
      :class:`RequestHeader` when their form is checked).
    * ``replies``: the success responses; ``errors``: the error classes this route may raise
      beyond those every route shares (the builder adds authentication, validation and outage
      errors from the other fields).
    * ``allow_head``: a GET route also answers HEAD (aiohttp's default; exports turn it off).
    * ``error_body``: the shape of its errors when not the envelope (None: the envelope).
    """

    method: str
    path: str
    handler: Handler
    operation_id: str
    tag: str
    summary: str
    description: str = ""
    security: tuple[Security, ...] = ()
    scopes: tuple[str, ...] = ()
    project: bool = False
    body: type[Any] | None = None
    query: type[Any] | None = None
    headers: Mapping[str, str | RequestHeader] = field(default_factory=dict)
    replies: tuple[Reply, ...] = ()
    errors: tuple[type[ServiceError], ...] = ()
    allow_head: bool = True
    error_body: ErrorBody | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"{self.operation_id}: unsupported method {self.method!r}")
        if not self.replies:
            raise ValueError(f"{self.operation_id}: document at least one reply")


def summary_of(handler: Handler) -> tuple[str, str]:
    """The first line of ``handler``'s docstring (the summary) and the rest (the description)."""
    doc = (handler.__doc__ or "").strip()
    first, _, rest = doc.partition("\n\n")
    return " ".join(first.split()), rest.strip()


class RouteTable:
    """The routes of one domain (``tag`` names it in the document)."""

    def __init__(self, tag: str, description: str = "") -> None:
        self.tag = tag
        self.description = description
        self._operations: list[Operation] = []

    def __iter__(self) -> Iterator[Operation]:
        return iter(self._operations)

    def __len__(self) -> int:
        return len(self._operations)

    def add(self, operation: Operation) -> Operation:
        """Add ``operation``; raises ValueError when its method and path are taken."""
        for other in self._operations:
            if (other.method, other.path) == (operation.method, operation.path):
                raise ValueError(f"{operation.method} {operation.path} is declared twice")
        self._operations.append(operation)
        return operation

    def route(
        self, method: str, path: str, *, replies: Iterable[Reply], **doc: Any,
    ) -> Callable[[Handler], Handler]:
        """Decorator adding a plain aiohttp handler as an :class:`Operation` (summary and
        description from its docstring unless given; ``operation_id`` the handler's name unless
        given); returns the handler unchanged."""

        def register(handler: Handler) -> Handler:
            summary, description = summary_of(handler)
            doc.setdefault("summary", summary)
            doc.setdefault("description", description)
            doc.setdefault("operation_id", handler.__name__)
            self.add(Operation(method=method, path=path, handler=handler, tag=self.tag,
                               replies=tuple(replies), **doc))
            return handler

        return register

    def mount(self, router: web.UrlDispatcher, *,
              wrap: Callable[[Operation], Handler] | None = None) -> dict[str, web.Resource]:
        """Register every operation with ``router`` (a GET route also as HEAD unless its
        ``allow_head`` is off), one resource per path: aiohttp tries a request's candidate
        resources one by one, so a path registered as several resources (one per method,
        interleaved with others) costs a match attempt per resource on every request. ``wrap``
        gives the handler to serve an operation with (default: its own). Returns the resources
        by their path as declared."""
        resources: dict[str, web.Resource] = {}
        for op in self._operations:
            resource = resources.get(op.path)
            if resource is None:
                resource = resources[op.path] = router.add_resource(op.path)
            handler = op.handler if wrap is None else wrap(op)
            if op.method == "GET" and op.allow_head:
                resource.add_route("HEAD", handler)
            resource.add_route(op.method, handler)
        return resources


def operations(tables: Iterable[RouteTable]) -> list[Operation]:
    """Every operation of ``tables``, in order; raises ValueError when two share a method and
    path or an operation id."""
    seen: dict[tuple[str, str], str] = {}
    ids: set[str] = set()
    out: list[Operation] = []
    for table in tables:
        for op in table:
            key = (op.method, op.path)
            if key in seen:
                raise ValueError(f"{op.method} {op.path}: declared by {seen[key]} and {op.tag}")
            if op.operation_id in ids:
                raise ValueError(f"operation id {op.operation_id!r} is not unique")
            seen[key] = op.tag
            ids.add(op.operation_id)
            out.append(op)
    return out
