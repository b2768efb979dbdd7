"""OpenTelemetry traces and metrics for both services (SPEC.md 1, "Observability").

Configured only by the SPEC.md 1.3 variables, read into :class:`~common.settings.Settings`:

``OTEL_EXPORTER``
    ``stdout`` (default): one compact JSON object per span, one per line, on standard output
    (:class:`StdoutSpanExporter`). ``otlp``: OTLP/HTTP (protobuf) to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces`` with the ``OTEL_EXPORTER_OTLP_HEADERS``.
    ``none``: nothing is set up; the API's no-op tracer is all that runs.
``OTEL_SERVICE_NAME``
    overrides the per-process default (``authio-engine``, ``authio-control-plane``, and
    ``authio`` for ``authio serve`` hosting both).
``OTEL_SAMPLER_RATIO``
    share of root traces kept; parent-based, so an incoming sampled ``traceparent`` is always
    followed and an unsampled one never (SPEC.md 1.4).

What is traced: HTTP server spans of both apps (:func:`server_middleware`, tagged with the
project and API key by ``common.auth`` and with the request id here), HTTP client spans with
``traceparent`` injected on every ``aiohttp.ClientSession`` (AioHttpClientInstrumentor),
PostgreSQL client spans (AsyncPGInstrumentor, parameters never captured) and Redis spans
(RedisInstrumentor, arguments already reduced to ``?`` by the instrumentation). A database span
without a parent (a background poll, not a request) is not kept. ``/healthz`` and ``/readyz`` are
not traced.

Redaction: before any span leaves the process, :class:`RedactingExporter` rewrites the statement
of every database span with :func:`redact_sql` (string, dollar-quoted and numeric literals and
comments become ``?``), drops any captured parameters, and keeps only the exception type of
database errors (PostgreSQL error messages quote the offending value).

Metrics (:func:`setup_metrics`): counters and histograms the code records through the API's
global meter (``opentelemetry.metrics.get_meter``), e.g. ``engine.edge``'s validations, denials
by reason and revocation lag. They are exported only with ``OTEL_EXPORTER=otlp``, to
``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/metrics`` every :data:`METRIC_INTERVAL_MS` (standard
output is one JSON line per *span*, SPEC.md 1.3, so ``stdout`` exports no metrics; the same
facts ride on the server span as attributes). With ``none`` (and ``stdout``) no meter provider is
installed and recording one is the API's no-op proxy: an attribute test and a return.

A slow or absent collector never touches a request (SPEC.md 1.7): spans go through a
BatchSpanProcessor (bounded queue of 2048; when full, spans are dropped), exports run on its own
thread with a 2 s timeout, failures are only logged (throttled by ``common.logging``), and
:func:`shutdown_tracing` gives the final flush at most a few seconds.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TextIO

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from opentelemetry import context, metrics, trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.sdk.version import __version__ as _sdk_version
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from common.http import REQUEST_ID
from common.settings import Settings

__all__ = [
    "RedactingExporter",
    "StdoutSpanExporter",
    "redact_span",
    "redact_sql",
    "sampler",
    "server_middleware",
    "server_middlewares",
    "setup_metrics",
    "setup_tracing",
    "shutdown_metrics",
    "shutdown_tracing",
    "span_json",
    "traces_requests",
]

EXPORT_TIMEOUT_S: Final = 2.0
"""Longest one export to the collector may take (on the exporter's thread, never a request's)."""
MAX_QUEUE_SIZE: Final = 2048
"""Ended spans waiting for export; beyond this the oldest are dropped."""
SCHEDULE_DELAY_MS: Final = 1000
MAX_EXPORT_BATCH: Final = 128  # smaller batches: shorter GIL holds while encoding (p99)
SHUTDOWN_TIMEOUT_S: Final = 5.0
"""Longest the final flush at exit may take."""
METRIC_INTERVAL_MS: Final = 60_000
"""How often metrics are exported (OTLP only)."""

_UNTRACED_PATHS: Final = frozenset({"/healthz", "/readyz"})  # probes: every few seconds, no value
_STATEMENT_KEYS: Final = ("db.statement", "db.query.text")
_PARAMETER_KEYS: Final = frozenset({"db.statement.parameters", "db.query.parameters"})
_DB_SYSTEM_KEYS: Final = ("db.system", "db.system.name")
_EXCEPTION_KEPT: Final = frozenset({"exception.type", "exception.escaped"})
_CLASS_NAME: Final = re.compile(r"[A-Za-z_][\w.]*")

_provider: TracerProvider | None = None  # the process's one provider (OpenTelemetry's is global)
_meter_provider: MeterProvider | None = None
_middlewares: tuple[Middleware, ...] = ()
_traces_requests = False  # a server-span middleware exists in this process


# -- redaction ---------------------------------------------------------------------------------

_SQL_TOKEN: Final = re.compile(
    r"""
      (?P<ident>"(?:[^"]|"")*")                                       # quoted identifier: kept
    | (?P<comment>--[^\n]*|/\*.*?\*/)                                 # comments: dropped
    | (?<![\w$])[Ee]'(?:[^'\\]|\\.|'')*'                              # E'...' escape string
    | (?:(?<![\w$])(?:[BbXxNn]|[Uu]&))?'(?:[^']|'')*'                 # '...', B'', X'', U&''
    | \$(?P<tag>[A-Za-z_][A-Za-z0-9_]*|)\$.*?\$(?P=tag)\$             # $$...$$, $tag$...$tag$
    | '.*                                                             # unterminated: to the end
    | (?<![\w$.])(?:0[xXoObB][0-9A-Fa-f_]+|(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])
    """,
    re.VERBOSE | re.DOTALL,
)


def _literal_to_placeholder(match: re.Match[str]) -> str:
    if match.group("ident") is not None:
        return match.group(0)
    if match.group("comment") is not None:
        return ""
    return "?"


def redact_sql(statement: str) -> str:
    """``statement`` with every literal value replaced by ``?`` and comments removed.

    String constants (``'...'``, ``E'...'``, ``B'...'``, ``X'...'``, ``U&'...'``, dollar-quoted
    bodies, an unterminated quote to the end) and numeric constants become ``?``; identifiers
    (also quoted ones), keywords and ``$n`` parameter placeholders stay, so the shape of the
    query remains readable: ``WHERE id = 'doc:1' LIMIT 5`` gives ``WHERE id = ? LIMIT ?``.
    """
    return _SQL_TOKEN.sub(_literal_to_placeholder, statement)


def _is_db_span(attributes: Mapping[str, Any]) -> bool:
    return any(key in attributes for key in _DB_SYSTEM_KEYS)


def redact_span(span: ReadableSpan) -> ReadableSpan:
    """``span`` itself, or for a database span a copy that holds no literal value: statement and
    name through :func:`redact_sql`, parameters dropped, exception events reduced to the type,
    the status description to the exception class (PostgreSQL messages quote values)."""
    attributes = span.attributes or {}
    if not _is_db_span(attributes) and not any(k in attributes for k in _STATEMENT_KEYS):
        return span
    clean: dict[str, Any] = {}
    for key, value in attributes.items():
        if key in _PARAMETER_KEYS:
            continue
        clean[key] = redact_sql(value) if key in _STATEMENT_KEYS and isinstance(value, str) else value
    events = [
        Event(event.name, {k: v for k, v in (event.attributes or {}).items() if k in _EXCEPTION_KEPT},
              event.timestamp)
        for event in span.events
    ]
    status = span.status
    if status.description:  # "<ExceptionClass>: <message>" from the instrumentation
        kind = status.description.split(":", 1)[0]
        status = Status(status.status_code, kind if _CLASS_NAME.fullmatch(kind) else None)
    return ReadableSpan(
        name=redact_sql(span.name), context=span.context, parent=span.parent,
        resource=span.resource, attributes=clean, events=events, links=span.links,
        kind=span.kind, status=status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class RedactingExporter(SpanExporter):
    """Passes spans to ``inner`` after :func:`redact_span` (on the export thread, off requests)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([redact_span(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


# -- the stdout exporter -----------------------------------------------------------------------


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _time(ns: int | None) -> datetime | None:
    """Nanoseconds since the epoch as a datetime (orjson writes RFC 3339 with microseconds)."""
    return None if ns is None else _EPOCH + timedelta(microseconds=ns // 1000)


def span_json(span: ReadableSpan) -> bytes:
    """One span as a compact JSON object: name, trace_id, span_id, parent_span_id, kind,
    start_time and end_time (RFC 3339 UTC, microseconds), duration_ms (nanosecond clock), status
    (and status_description), attributes, events (when any), resource ``service.name``."""
    ctx = span.context
    parent = span.parent
    out: dict[str, Any] = {
        "name": span.name,
        "trace_id": format(ctx.trace_id, "032x") if ctx else None,
        "span_id": format(ctx.span_id, "016x") if ctx else None,
        "parent_span_id": format(parent.span_id, "016x") if parent else None,
        "kind": span.kind.name,
        "start_time": _time(span.start_time),
        "end_time": _time(span.end_time),
        "duration_ms": (span.end_time - span.start_time) / 1e6
        if span.start_time is not None and span.end_time is not None else None,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "resource": {"service.name": span.resource.attributes.get("service.name")},
    }
    if span.status.description:
        out["status_description"] = span.status.description
    if span.events:
        out["events"] = [{"name": e.name, "time": _time(e.timestamp),
                          "attributes": dict(e.attributes or {})} for e in span.events]
    return orjson.dumps(out, default=str, option=orjson.OPT_UTC_Z)


class StdoutSpanExporter(SpanExporter):
    """One JSON line per span (:func:`span_json`) on ``stream`` (standard output by default).

    A closed or broken stream fails the export (the spans are dropped), never the caller.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        stream = self._stream if self._stream is not None else sys.stdout
        try:
            stream.write(b"".join(span_json(span) + b"\n" for span in spans).decode())
            stream.flush()
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


# -- sampling ----------------------------------------------------------------------------------


class _RequestRoots(Sampler):
    """Root sampler: a database span with no parent is dropped (the engine's change-log poll and
    other background queries, one trace per second of noise); any other root follows ``ratio``."""

    def __init__(self, ratio: float) -> None:
        self._ratio = TraceIdRatioBased(ratio)

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if kind is SpanKind.CLIENT and attributes and _is_db_span(attributes):
            return SamplingResult(Decision.DROP)
        return self._ratio.should_sample(parent_context, trace_id, name, kind, attributes, links,
                                         trace_state)

    def get_description(self) -> str:
        return f"RequestRoots{{{self._ratio.get_description()}}}"


def sampler(ratio: float) -> Sampler:
    """SPEC.md 1.4: follow the parent's decision; for roots, keep ``ratio`` of the traces."""
    return ParentBased(root=_RequestRoots(ratio))


# -- the server middleware ---------------------------------------------------------------------


def server_middleware(provider: trace.TracerProvider) -> Middleware:
    """The SERVER span of each request, from ``provider``: the maintained aiohttp-server
    instrumentation's span name (``METHOD /route/{canonical}``), request attributes, W3C context
    extraction and status mapping (5xx is an error), plus ``authio.request_id``.

    It belongs before the envelope middleware, so the span covers error responses too.
    (``opentelemetry-instrumentation-aiohttp-server``'s own middleware only works once
    ``AioHttpServerInstrumentor().instrument()`` has swapped ``aiohttp.web.Application`` for a
    subclass process-wide, which aiohttp deprecates; its building blocks are used here instead.)
    Request attributes are collected only for spans that are recorded.
    """
    global _traces_requests
    _traces_requests = True
    from opentelemetry.instrumentation._semconv import (
        _get_schema_url,
        _OpenTelemetrySemanticConventionStability,
        _OpenTelemetryStabilitySignalType,
    )
    from opentelemetry.instrumentation.aiohttp_server import (
        collect_request_attributes,
        get_default_span_name,
        getter,
        set_status_code,
    )
    from opentelemetry.instrumentation.aiohttp_server.version import __version__ as version

    _OpenTelemetrySemanticConventionStability._initialize()  # type: ignore[no-untyped-call]
    mode = _OpenTelemetrySemanticConventionStability._get_opentelemetry_stability_opt_in_mode(
        _OpenTelemetryStabilitySignalType.HTTP)
    tracer = provider.get_tracer("opentelemetry.instrumentation.aiohttp_server", version,
                                 schema_url=_get_schema_url(mode))

    @web.middleware
    async def tracing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in _UNTRACED_PATHS:
            return await handler(request)
        # start_span and attach by hand: start_as_current_span's two nested context managers
        # cost every request (sampled or not) about 2.5 us more.
        span = tracer.start_span(get_default_span_name(request),
                                 context=extract(request, getter=getter), kind=SpanKind.SERVER)
        token = context.attach(trace.set_span_in_context(span))
        recording = span.is_recording()
        try:
            if recording:
                span.set_attributes(collect_request_attributes(request, mode))
            response = await handler(request)
            if recording:
                set_status_code(span, response.status, None, mode)
            return response
        except web.HTTPException as exc:  # redirects; the envelope answers every error
            if recording:
                set_status_code(span, exc.status, None, mode)
            raise
        except Exception as exc:  # only without the envelope middleware behind this one
            if recording:
                span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
                span.record_exception(exc)
            raise
        finally:
            if recording and REQUEST_ID in request:
                span.set_attribute("authio.request_id", request[REQUEST_ID])
            context.detach(token)
            span.end()

    return tracing_middleware


def traces_requests() -> bool:
    """Whether a request of this process may have a server span (a :func:`server_middleware`
    was made): tagging the span of a request is skipped otherwise, without the context lookup
    (API keys and edge validations tag theirs on every request)."""
    return _traces_requests


def server_middlewares() -> tuple[Middleware, ...]:
    """The middlewares ``common.runtime.base_app`` puts first: the server-span middleware once
    :func:`setup_tracing` has run in this process, none otherwise (``OTEL_EXPORTER=none``, tests
    that build apps in-process)."""
    return _middlewares


# -- setup -------------------------------------------------------------------------------------


_instance: tuple[int, str] | None = None


def _instance_id() -> str:
    """This process's ``service.instance.id`` (a UUIDv4, as the semantic conventions advise):
    the engine's workers share a service name and a host, and a collector tells their counters
    apart by it. Drawn again in a forked child."""
    global _instance
    pid = os.getpid()
    if _instance is None or _instance[0] != pid:
        _instance = (pid, str(uuid.uuid4()))
    return _instance[1]


def _resource(service_name: str) -> Resource:
    try:
        version = importlib.metadata.version("authio")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    # Not Resource.create(): it would read OTEL_RESOURCE_ATTRIBUTES; SPEC.md 1.3 lists our knobs.
    return Resource({
        "service.name": service_name, "service.version": version,
        "service.instance.id": _instance_id(),
        "telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": _sdk_version,
    })


def _exporter(settings: Settings) -> SpanExporter:
    if settings.otel_exporter == "stdout":
        return StdoutSpanExporter()
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    assert settings.otel_exporter_otlp_endpoint is not None  # Settings guarantees it for otlp
    return OTLPSpanExporter(
        endpoint=settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces",
        headers=settings.otlp_headers, timeout=EXPORT_TIMEOUT_S,
        compression=Compression.NoCompression,
    )


def setup_tracing(settings: Settings, *, service_name_default: str) -> TracerProvider | None:
    """Set up tracing for this process from ``settings`` (once, before the apps are built).

    Returns the provider (give it to :func:`shutdown_tracing` at exit), or None for
    ``OTEL_EXPORTER=none``, which installs nothing: no provider, no instrumentation, no middleware.
    Raises RuntimeError when called a second time in one process.
    """
    global _provider, _middlewares
    if settings.otel_exporter == "none":
        return None
    if _provider is not None:
        raise RuntimeError("tracing is already set up in this process")
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    provider = TracerProvider(
        sampler=sampler(settings.otel_sampler_ratio),
        resource=_resource(settings.otel_service_name or service_name_default),
        shutdown_on_exit=False,  # shutdown_tracing bounds the final flush; atexit would not
    )
    provider.add_span_processor(BatchSpanProcessor(
        RedactingExporter(_exporter(settings)), max_queue_size=MAX_QUEUE_SIZE,
        schedule_delay_millis=SCHEDULE_DELAY_MS, max_export_batch_size=MAX_EXPORT_BATCH,
        export_timeout_millis=EXPORT_TIMEOUT_S * 1000,
    ))
    trace.set_tracer_provider(provider)
    AioHttpClientInstrumentor().instrument(tracer_provider=provider)
    AsyncPGInstrumentor(capture_parameters=False).instrument(  # type: ignore[no-untyped-call]
        tracer_provider=provider)
    RedisInstrumentor().instrument(tracer_provider=provider)
    _provider, _middlewares = provider, (server_middleware(provider),)
    return provider


def shutdown_tracing(provider: TracerProvider, *, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """Flush the spans still queued and stop exporting, waiting at most ``timeout_s`` (a hung
    collector must not hold up the exit). Returns False when the flush did not finish in time."""
    worker = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()


def setup_metrics(settings: Settings, *, service_name_default: str) -> MeterProvider | None:
    """Install the process's meter provider from ``settings`` (once; see the module docstring):
    with ``OTEL_EXPORTER=otlp`` a periodic OTLP/HTTP export to ``/v1/metrics``, on its own
    thread with a 2 s timeout. Returns it (give it to :func:`shutdown_metrics` at exit), or None
    for ``stdout`` and ``none``, which install nothing. Raises RuntimeError when called a second
    time in one process."""
    global _meter_provider
    if settings.otel_exporter != "otlp":
        return None
    if _meter_provider is not None:
        raise RuntimeError("metrics are already set up in this process")
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    assert settings.otel_exporter_otlp_endpoint is not None  # Settings guarantees it for otlp
    exporter = OTLPMetricExporter(
        endpoint=settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/metrics",
        headers=settings.otlp_headers, timeout=EXPORT_TIMEOUT_S,
        compression=Compression.NoCompression,
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=METRIC_INTERVAL_MS,
                                           export_timeout_millis=EXPORT_TIMEOUT_S * 1000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False,
                             resource=_resource(settings.otel_service_name or service_name_default))
    metrics.set_meter_provider(provider)
    _meter_provider = provider
    return provider


def shutdown_metrics(provider: MeterProvider, *, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """Export the last metrics and stop, waiting at most ``timeout_s``. Returns False when the
    export did not finish in time."""
    worker = threading.Thread(target=provider.shutdown, name="otel-metrics-shutdown",
                              daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()
