"""OpenTelemetry (SPEC.md 1, issue 3 section 2) and structured logs.

A tracer provider and the instrumentation are global to a process, and the rest of the suite runs
untraced in this one. So every traced scenario runs ``authio serve`` (or a small traced client) as
a subprocess configured only by the ``OTEL_*`` variables, exporting real OTLP/HTTP to a receiver
in this process that decodes ``ExportTraceServiceRequest`` protobufs, or printing JSON lines on
standard output. What can be checked without a process (settings, redaction, the sampler, the
stdout format, the log/span/error join) runs in-process on local providers that never become
global.

Negative sampling checks ("nothing exported") end with a sentinel: a sampled request made after
the ones that must not be exported. A process exports its spans in the order they ended, so once
the sentinel's span has arrived, any span of the earlier requests would have arrived too.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession, web
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from common import telemetry
from common.http import envelope_middleware
from common.logging import ContextFilter, JsonFormatter
from common.settings import SettingsError, load_settings, parse_otlp_headers
from common.telemetry import (
    StdoutSpanExporter,
    redact_span,
    redact_sql,
    sampler,
    server_middleware,
    server_middlewares,
    setup_tracing,
)
from tests.fixtures.database import migrated_database
from tests.fixtures.peers import Receiver, closed_port, hanging_collector, receiving
from tests.fixtures.service import (
    BOOTSTRAP_TOKEN,
    KMS_KEY,
    ROOT,
    Api,
    Response,
    ServedProcess,
    bootstrap_project,
    loopback_app,
    serve_process,
    stop_gracefully,
)

# -- `authio serve` as a subprocess ------------------------------------------------------------


@pytest.fixture(scope="module")
def telemetry_db(database_url: str) -> Iterator[str]:
    """A database of this module's own: the services of other tests share the session's, and
    their revocation announcers would announce (and trace) this module's revocations."""
    with migrated_database(database_url, "telemetry") as url:
        yield url


@pytest.fixture(scope="module")
def base_env(telemetry_db: str, redis_url: str, redis_prefix: str) -> dict[str, str]:
    """This module's database, the test Redis, the bootstrap token, and no inherited OTEL_*
    variable."""
    database_url = telemetry_db
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN, SERVICE_ENGINE_POLL_SECONDS="0.5",
               SERVICE_PG_POOL_MAX="4", SERVICE_KMS_KEY=KMS_KEY)
    return env


def traceparent(*, sampled: bool) -> tuple[str, str, str]:
    """A fresh W3C ``traceparent`` and its trace and span ids (hex)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


async def sentinel(receiver: Receiver, api: Api) -> None:
    """A sampled request after the others; returns once its span was received (module doc)."""
    header, trace_id, _ = traceparent(sampled=True)
    await api.get("/v1/projects/me", headers={"traceparent": header}, key=None)
    await receiver.wait_for(lambda s: s.trace_id == trace_id)


def otlp_env(base_env: dict[str, str], receiver_url: str, **extra: str) -> dict[str, str]:
    return {**base_env, "OTEL_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url,
            **extra}


# -- settings (in-process) ---------------------------------------------------------------------


@pytest.fixture
def otel_clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OTEL_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS",
                 "OTEL_SERVICE_NAME", "OTEL_SAMPLER_RATIO"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_otel_defaults(otel_clean: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.otel_exporter == "stdout"  # SPEC.md 1.3: stdout in production
    assert s.otel_sampler_ratio == 1.0
    assert s.otel_exporter_otlp_endpoint is None and s.otlp_headers == {}
    assert s.otel_service_name is None


def test_otlp_needs_an_endpoint(otel_clean: pytest.MonkeyPatch) -> None:
    otel_clean.setenv("OTEL_EXPORTER", "otlp")
    with pytest.raises(SettingsError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        load_settings()
    otel_clean.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example:4318")
    assert load_settings().otel_exporter_otlp_endpoint == "https://collector.example:4318"


def test_otlp_headers_are_parsed_and_never_echoed(otel_clean: pytest.MonkeyPatch) -> None:
    assert parse_otlp_headers("Authorization=Bearer%20s3cret , x-tenant = t1,,") == {
        "authorization": "Bearer s3cret", "x-tenant": "t1"}
    assert parse_otlp_headers("a=b=c") == {"a": "b=c"}
    otel_clean.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-ok=1,api-key-s3cret")
    with pytest.raises(SettingsError) as exc:
        load_settings()
    assert "s3cret" not in str(exc.value) and "entry 2" in str(exc.value)
    otel_clean.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret")
    s = load_settings()
    assert s.otlp_headers == {"authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(s)


def test_none_sets_up_nothing(otel_clean: pytest.MonkeyPatch) -> None:
    otel_clean.setenv("OTEL_EXPORTER", "none")
    assert setup_tracing(load_settings(), service_name_default="authio") is None
    assert server_middlewares() == ()
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_each_process_is_its_own_instance() -> None:
    """The engine's workers share a service name and a host: their traces and metrics differ by
    ``service.instance.id``, one UUID per process, the same for its traces and its metrics."""
    ours = telemetry._resource("authio").attributes["service.instance.id"]
    assert telemetry._resource("authio-engine").attributes["service.instance.id"] == ours
    assert uuid.UUID(str(ours)).version == 4
    other = subprocess.run(
        [sys.executable, "-c", "from common.telemetry import _resource; "
                               "print(_resource('authio').attributes['service.instance.id'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert uuid.UUID(other) and other != ours


# -- redaction, sampler, stdout format (in-process) --------------------------------------------


@pytest.mark.parametrize(("statement", "redacted"), [
    ("SELECT * FROM t WHERE id = 'doc:1' AND n = 42 LIMIT 5",
     "SELECT * FROM t WHERE id = ? AND n = ? LIMIT ?"),
    ("SELECT 'it''s', E'a\\'b', $$x'y$$, $q$ body $q$, 1.5e3, .5, 0x1F FROM t1",
     "SELECT ?, ?, ?, ?, ?, ?, ? FROM t1"),
    ("SELECT \"col 1\", t2.c3 FROM t2 WHERE a = $1 AND b = $2::int4",
     "SELECT \"col 1\", t2.c3 FROM t2 WHERE a = $1 AND b = $2::int4"),
    ("SELECT 1 -- note 'x'\nFROM t /* secret 7 */ WHERE b = B'0101' OR x = X'ff' OR u = U&'d'",
     "SELECT ? \nFROM t  WHERE b = ? OR x = ? OR u = ?"),
    ("SELECT interval '1 day', ARRAY[1,2], -3", "SELECT interval ?, ARRAY[?,?], -?"),
    ("INSERT INTO t VALUES ('cut off mid-liter", "INSERT INTO t VALUES (?"),
])
def test_redact_sql(statement: str, redacted: str) -> None:
    assert redact_sql(statement) == redacted


def test_database_span_keeps_no_literal_value() -> None:
    marker = "zq" + secrets.token_hex(6)
    ctx = SpanContext(0xA1, 0xB2, is_remote=False, trace_flags=TraceFlags(1))
    span = ReadableSpan(
        name="SELECT", context=ctx, kind=SpanKind.CLIENT,
        attributes={"db.system": "postgresql", "db.statement": f"SELECT 1 FROM t WHERE o = '{marker}'",
                    "db.statement.parameters": f"('{marker}',)", "db.name": "authio"},
        events=[Event("exception", {"exception.type": "asyncpg.exceptions.DataError",
                                    "exception.message": f'invalid input: "{marker}"',
                                    "exception.stacktrace": f"Traceback ... {marker}"})],
        status=Status(StatusCode.ERROR, f'DataError: invalid input: "{marker}"'),
        resource=Resource({"service.name": "t"}),
    )
    clean = redact_span(span)
    assert marker not in span_text(clean)
    assert clean.attributes == {"db.system": "postgresql", "db.statement": "SELECT ? FROM t WHERE o = ?",
                                "db.name": "authio"}
    assert [dict(e.attributes or {}) for e in clean.events] == [
        {"exception.type": "asyncpg.exceptions.DataError"}]
    assert clean.status.status_code is StatusCode.ERROR and clean.status.description == "DataError"
    free_text = ReadableSpan(name="SELECT", context=ctx, attributes={"db.system": "postgresql"},
                             status=Status(StatusCode.ERROR, f"value {marker} is bad"))
    assert redact_span(free_text).status.description is None
    other = ReadableSpan(name="GET /x", context=ctx, attributes={"http.route": "/x"})
    assert redact_span(other) is other


def span_text(span: ReadableSpan) -> str:
    return orjson.dumps([span.name, dict(span.attributes or {}),
                         [dict(e.attributes or {}) for e in span.events],
                         span.status.description], default=str).decode()


def _parent(sampled: bool | None) -> Context | None:
    if sampled is None:
        return None
    ctx = SpanContext(0x1234, 0x5678, is_remote=True,
                      trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else 0))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


@pytest.mark.parametrize(("ratio", "parent", "kept"), [
    (0.0, None, False), (0.0, True, True), (0.0, False, False),
    (1.0, None, True), (1.0, True, True), (1.0, False, False),
])
def test_sampler_is_parent_based(ratio: float, parent: bool | None, kept: bool) -> None:
    result = sampler(ratio).should_sample(_parent(parent), 0xDEADBEEF, "GET /x", SpanKind.SERVER)
    assert (result.decision is Decision.RECORD_AND_SAMPLE) is kept


def test_sampler_drops_database_spans_without_a_request() -> None:
    attrs = {"db.system": "postgresql", "db.statement": "SELECT 1"}
    assert sampler(1.0).should_sample(None, 1, "SELECT", SpanKind.CLIENT, attrs).decision is Decision.DROP
    kept = sampler(1.0).should_sample(_parent(True), 1, "SELECT", SpanKind.CLIENT, attrs)
    assert kept.decision is Decision.RECORD_AND_SAMPLE  # a query inside a request is kept
    http = sampler(1.0).should_sample(None, 1, "POST", SpanKind.CLIENT, {"http.method": "POST"})
    assert http.decision is Decision.RECORD_AND_SAMPLE  # e.g. a webhook delivery from a worker


def test_stdout_exporter_writes_one_json_object_per_span() -> None:
    out = io.StringIO()
    provider = TracerProvider(resource=Resource({"service.name": "authio-test"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(StdoutSpanExporter(out)))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("parent", kind=SpanKind.SERVER) as parent:
        with tracer.start_as_current_span("child", attributes={"n": 1, "tags": ("a", "b")}):
            pass
        parent.set_status(Status(StatusCode.ERROR, "boom"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    child, parent_json = (orjson.loads(line) for line in lines)
    assert child["name"] == "child" and parent_json["name"] == "parent"
    assert child["parent_span_id"] == parent_json["span_id"] and parent_json["parent_span_id"] is None
    assert child["trace_id"] == parent_json["trace_id"] and len(child["trace_id"]) == 32
    assert len(child["span_id"]) == 16
    assert child["kind"] == "INTERNAL" and parent_json["kind"] == "SERVER"
    assert child["attributes"] == {"n": 1, "tags": ["a", "b"]}
    assert parent_json["status"] == "ERROR" and parent_json["status_description"] == "boom"
    assert child["resource"] == {"service.name": "authio-test"}
    assert child["start_time"].endswith("Z") and child["end_time"] >= child["start_time"]
    assert child["duration_ms"] >= 0


# -- logs, spans and a client's error join (in-process, local provider) ------------------------


async def test_log_line_span_and_client_error_share_request_and_trace_ids(http: ClientSession) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("kaboom")

    app = web.Application(middlewares=[server_middleware(provider), envelope_middleware])
    app.router.add_get("/boom", boom)
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    http_log = logging.getLogger("authio.http")
    http_log.addHandler(handler)
    try:
        async with loopback_app(app) as port, http.get(f"http://127.0.0.1:{port}/boom") as r:
            assert r.status == 500
            body = await r.json()
    finally:
        http_log.removeHandler(handler)
    assert body["error"]["code"] == "internal_error" and "kaboom" not in orjson.dumps(body).decode()
    request_id = body["request_id"]
    (span,) = exporter.get_finished_spans()
    assert span.kind is SpanKind.SERVER and span.name == "GET /boom"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["authio.request_id"] == request_id
    assert span.context is not None
    (line,) = [orjson.loads(x) for x in lines.getvalue().splitlines()]
    assert line["request_id"] == request_id
    assert line["trace_id"] == format(span.context.trace_id, "032x")
    assert line["span_id"] == format(span.context.span_id, "016x")
    assert line["level"] == "ERROR" and line["logger"] == "authio.http"
    assert line["message"] == "unhandled error"
    assert "RuntimeError: kaboom" in line["exception"] and "Traceback" in line["exception"]
    assert line["ts"].endswith("Z")


# -- engine and control plane as two processes, exporting OTLP ----------------------------------


@dataclass
class Pair:
    receiver: Receiver
    control_plane: ServedProcess
    engine: ServedProcess


@pytest_asyncio.fixture(scope="module")
async def pair(http: ClientSession, base_env: dict[str, str]) -> AsyncIterator[Pair]:
    """``authio serve control-plane`` and ``authio serve engine``, ratio 1.0, OTLP to a receiver
    given as a base URL with a trailing slash, with two headers (one percent-encoded)."""
    async with receiving() as receiver:
        env = otlp_env(base_env, receiver.base_url + "/", OTEL_SAMPLER_RATIO="1.0",
                       OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20collector-token, x-scope=authio")
        async with serve_process(http, env, "control-plane") as cp, serve_process(http, env, "engine") as engine:
            yield Pair(receiver, cp, engine)


async def test_server_spans_carry_project_key_and_status(pair: Pair) -> None:
    receiver, cp, engine = pair.receiver, pair.control_plane.api, pair.engine.api
    project = await bootstrap_project(cp, "telemetry")
    me = await project.api.get("/v1/projects/me")
    assert me.status == 200
    bad = await cp.get("/v1/projects/me", key="sk_live_" + "x" * 43)
    assert bad.status == 401
    missing = await engine.with_key(project.key).post(
        f"/v1/stores/store_{'0' * 26}/check",
        {"tuple_key": {"object": "doc:1", "relation": "viewer", "user": "user:1"}})
    assert missing.status == 404

    span = await receiver.server_span(me.body["request_id"])
    assert (span.service, span.kind, span.name) == ("authio-control-plane", "SERVER", "GET /v1/projects/me")
    assert span.attributes["authio.project_id"] == project.id
    assert span.attributes["authio.api_key_id"] == project.key_id
    assert span.http_status == 200 and span.status == "UNSET" and span.parent_span_id is None

    span = await receiver.server_span(bad.body["request_id"])
    assert span.http_status == 401 and "authio.project_id" not in span.attributes

    span = await receiver.server_span(missing.body["request_id"])
    assert (span.service, span.name) == ("authio-engine", "POST /v1/stores/{store_id}/check")
    assert span.http_status == 404
    assert span.attributes["authio.project_id"] == project.id
    assert span.attributes["authio.api_key_id"] == project.key_id

    # OTEL_EXPORTER_OTLP_HEADERS reached the collector, percent-decoded, on every export.
    assert receiver.exports
    for headers in receiver.exports:
        assert headers["authorization"] == "Bearer collector-token"
        assert headers["x-scope"] == "authio"
        assert headers["content-type"] == "application/x-protobuf"


async def test_database_spans_are_children_with_redacted_statements(pair: Pair) -> None:
    receiver, cp = pair.receiver, pair.control_plane.api
    project = await bootstrap_project(cp, "telemetry-db")
    store = await project.api.post("/v1/stores", {"name": "traced"})
    assert store.status == 201
    marker = "zq" + secrets.token_hex(8)
    tuple_ = {"object": f"doc:{marker}", "relation": "viewer", "user": f"user:{marker}"}
    written = await project.api.post(f"/v1/stores/{store.body['id']}/write", {"writes": [tuple_]})
    assert written.status == 200, written.body

    server = await receiver.server_span(written.body["request_id"])
    in_trace = receiver.trace(server.trace_id)
    queries = [s for s in in_trace if s.is_postgres]
    assert queries, in_trace
    for query in queries:
        assert query.kind == "CLIENT" and query.service == "authio-control-plane"
        assert query.parent_span_id == server.span_id
        assert query.statement is not None and "'" not in query.statement, query.statement
        assert not any(k.endswith("parameters") for k in query.attributes), query.attributes
    inserts = [q for q in queries if "INSERT INTO tuples" in (q.statement or "")]
    assert len(inserts) == 1 and "$1" in (inserts[0].statement or ""), [q.statement for q in queries]
    # The value written is in no span at all, database or other.
    await sentinel(receiver, cp)
    assert not [s.name for s in receiver.spans if marker in s.text()]


async def test_redis_spans_hold_no_arguments(pair: Pair) -> None:
    """The revocation announcer's PUBLISH (the revoke request itself no longer talks to Redis:
    issue 10) is traced without its arguments: neither the channel nor the key's digest."""
    receiver, cp = pair.receiver, pair.control_plane.api
    project = await bootstrap_project(cp, "telemetry-redis")
    created = await project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "doomed", "scopes": []})
    assert created.status == 201, created.body
    revoked = await project.api.delete(f"/v1/api-keys/{created.body['id']}")
    assert revoked.status in (200, 204), revoked.body
    server = await receiver.server_span(revoked.headers["X-Request-Id"])
    redis_spans = [s for s in receiver.trace(server.trace_id)
                   if s.attributes.get("db.system", s.attributes.get("db.system.name")) == "redis"]
    assert redis_spans == [], receiver.trace(server.trace_id)  # committed, not published, here
    publishes = await receiver.wait_for(
        lambda s: s.attributes.get("db.system", s.attributes.get("db.system.name")) == "redis"
        and "PUBLISH" in (s.statement or ""))
    for publish in publishes:
        assert publish.kind == "CLIENT", publish
        assert "PUBLISH ? ?" in (publish.statement or ""), publish.statement
    digest = hashlib.sha256(created.body["secret"].encode()).hexdigest()
    await sentinel(receiver, cp)
    assert not [s.name for s in receiver.spans if digest in s.text()]


_CLIENT = r"""
import asyncio, sys
import aiohttp, orjson
from opentelemetry import trace
from common.settings import load_settings
from common.telemetry import setup_tracing, shutdown_tracing

args = orjson.loads(sys.argv[1])
provider = setup_tracing(load_settings(), service_name_default="authio-test-client")
assert provider is not None


async def main():
    store, tuple_ = args["store"], args["tuple"]
    with trace.get_tracer("tests").start_as_current_span("cross-service call") as root:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer " + args["key"]}) as http:
            async with http.post(f"{args['control_plane']}/v1/stores/{store}/write",
                                 json={"writes": [tuple_]}) as r:
                written = await r.json()
            async with http.post(f"{args['engine']}/v1/stores/{store}/check", json={
                    "tuple_key": tuple_, "consistency": {"at_least_revision": written["revision"]}}) as r:
                checked = await r.json()
            async with http.get(args["echo"]) as r:
                echoed = await r.json()
    ctx = root.get_span_context()
    return {"trace_id": format(ctx.trace_id, "032x"), "root_span_id": format(ctx.span_id, "016x"),
            "written": written, "checked": checked, "echoed": echoed}


result = asyncio.run(main())
shutdown_tracing(provider)
print(orjson.dumps(result).decode())
"""


async def test_one_trace_crosses_client_control_plane_and_engine(pair: Pair, base_env: dict[str, str]) -> None:
    """A traced client (``setup_tracing`` in its own process: the instrumented ClientSession)
    writes through the control plane and checks on the engine inside one parent span: one trace,
    each server span the child of the client span that called it."""
    receiver, cp, engine = pair.receiver, pair.control_plane.api, pair.engine.api
    project = await bootstrap_project(cp, "telemetry-cross")
    store = await project.api.post("/v1/stores", {"name": "cross"})
    args = {"key": project.key, "store": store.body["id"], "control_plane": cp.base_url,
            "engine": engine.base_url, "echo": receiver.base_url + "/echo",
            "tuple": {"object": "doc:cross", "relation": "viewer", "user": "user:anne"}}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLIENT, orjson.dumps(args).decode(), cwd=ROOT,
        env=otlp_env(base_env, receiver.base_url), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    result = orjson.loads(out.splitlines()[-1])
    assert result["checked"]["allowed"] is True, result
    trace_id = result["trace_id"]

    spans = await receiver.wait_for(lambda s: s.trace_id == trace_id and s.kind == "SERVER", count=2)
    write = next(s for s in spans if s.service == "authio-control-plane")
    check = next(s for s in spans if s.service == "authio-engine")
    assert write.name == "POST /v1/stores/{store_id}/write"
    assert check.name == "POST /v1/stores/{store_id}/check"
    assert write.attributes["authio.request_id"] == result["written"]["request_id"]
    assert check.attributes["authio.request_id"] == result["checked"]["request_id"]
    assert check.attributes["authio.project_id"] == project.id

    clients = await receiver.wait_for(
        lambda s: s.trace_id == trace_id and s.service == "authio-test-client" and s.kind == "CLIENT",
        count=3)
    by_url = {str(s.attributes.get("http.url", s.attributes.get("url.full"))).rsplit("/", 1)[-1]: s
              for s in clients}
    assert set(by_url) == {"write", "check", "echo"}, by_url
    (root,) = [s for s in receiver.trace(trace_id) if s.span_id == result["root_span_id"]]
    assert (root.name, root.parent_span_id) == ("cross-service call", None)
    for client in clients:
        assert client.parent_span_id == root.span_id and client.http_status == 200
    assert write.parent_span_id == by_url["write"].span_id
    assert check.parent_span_id == by_url["check"].span_id
    # The W3C header itself, as a server received it.
    version, header_trace, header_parent, flags = result["echoed"]["traceparent"].split("-")
    assert (version, header_trace, header_parent) == ("00", trace_id, by_url["echo"].span_id)
    assert int(flags, 16) & 0x01, "sampled flag"  # (0x02, "random", is set by the SDK too)
    # Queries hang under the server span of their own process (the engine looks the new key up).
    queries = [s for s in receiver.trace(trace_id) if s.is_postgres]
    server_of = {"authio-control-plane": write.span_id, "authio-engine": check.span_id}
    assert {q.service for q in queries} == set(server_of), queries
    assert all(q.parent_span_id == server_of[q.service] for q in queries), queries


async def test_ratio_one_follows_the_parent(pair: Pair) -> None:
    receiver, cp = pair.receiver, pair.control_plane.api
    project = await bootstrap_project(cp, "telemetry-ratio-1")
    root = await project.api.get("/v1/projects/me")
    sampled, sampled_trace, sampled_parent = traceparent(sampled=True)
    child = await project.api.get("/v1/projects/me", headers={"traceparent": sampled})
    unsampled, unsampled_trace, _ = traceparent(sampled=False)
    dropped = await project.api.get("/v1/projects/me", headers={"traceparent": unsampled})
    assert root.status == child.status == dropped.status == 200

    assert (await receiver.server_span(root.body["request_id"])).parent_span_id is None
    span = await receiver.server_span(child.body["request_id"])
    assert (span.trace_id, span.parent_span_id) == (sampled_trace, sampled_parent)
    await sentinel(receiver, cp)
    assert receiver.trace(unsampled_trace) == []
    assert not [s for s in receiver.spans if s.attributes.get("authio.request_id") == dropped.body["request_id"]]


# -- OTEL_SAMPLER_RATIO=0.0, both apps in one process -------------------------------------------


async def test_ratio_zero_keeps_only_sampled_parents(http: ClientSession, base_env: dict[str, str]) -> None:
    async with receiving() as receiver, \
            serve_process(http, otlp_env(base_env, receiver.base_url, OTEL_SAMPLER_RATIO="0.0")) as served:
        project = await bootstrap_project(served.api, "telemetry-ratio-0")
        fresh = await project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "f", "scopes": []})
        assert fresh.status == 201
        no_parent = await project.api.get("/v1/projects/me")
        unsampled, unsampled_trace, _ = traceparent(sampled=False)
        await project.api.get("/v1/projects/me", headers={"traceparent": unsampled})
        sampled, sampled_trace, sampled_parent = traceparent(sampled=True)
        # A key never used yet: the lookup queries PostgreSQL inside this request.
        full = await project.api.get("/v1/projects/me", headers={"traceparent": sampled},
                                     key=fresh.body["secret"])
        assert no_parent.status == full.status == 200

        server = await receiver.server_span(full.body["request_id"])
        assert server.service == "authio"  # `authio serve` default service name
        assert (server.trace_id, server.parent_span_id) == (sampled_trace, sampled_parent)
        assert server.attributes["authio.api_key_id"] == fresh.body["id"]
        queries = [s for s in receiver.trace(sampled_trace) if s.is_postgres]
        assert len(queries) >= 2, receiver.trace(sampled_trace)  # key lookup and the project read
        assert all(q.parent_span_id == server.span_id for q in queries)

        await sentinel(receiver, served.api)
        assert receiver.trace(unsampled_trace) == []
        assert all(s.parent_span_id is not None for s in receiver.spans), \
            "ratio 0.0 keeps no root span: " + str([s.name for s in receiver.spans if not s.parent_span_id])
        assert not [s for s in receiver.spans
                    if s.attributes.get("authio.request_id") == no_parent.body["request_id"]]
        assert await stop_gracefully(served) == 0


# -- metrics -----------------------------------------------------------------------------------


async def test_edge_metrics_reach_the_collector(http: ClientSession,
                                                base_env: dict[str, str]) -> None:
    """With ``otlp``, the engine's edge counters are exported to ``/v1/metrics`` (at the latest
    by the final export at exit), and the validation's server span says why it was denied."""
    async with receiving() as receiver, \
            serve_process(http, otlp_env(base_env, receiver.base_url, OTEL_SAMPLER_RATIO="1.0",
                                         OTEL_SERVICE_NAME="authio-metrics-test")) as served:
        none = await served.api.get("/v1/edge/validate", key=None)
        bad = await served.api.get("/v1/edge/validate", key=None,
                                   headers={"Authorization": "Bearer not.a.jwt"})
        assert (none.status, bad.status) == (401, 401)
        span = await receiver.server_span(bad.body["request_id"])
        assert span.attributes["authio.edge.outcome"] == "denied"
        assert span.attributes["authio.edge.reason"] == "signature"
        assert await stop_gracefully(served) == 0  # the last export at exit
    denials = {p[2]["reason"]: p[3] for p in receiver.points
               if p[1] == "authio.edge.denials" and p[0] == "authio-metrics-test"}
    assert denials == {"no_session": 1, "signature": 1}, receiver.points
    validations = {p[2]["outcome"]: p[3] for p in receiver.points
                   if p[1] == "authio.edge.validations"}
    assert validations == {"valid": 0, "denied": 2}, receiver.points


# -- the stdout exporter, end to end -----------------------------------------------------------


def _status_of(span: dict[str, Any]) -> Any:
    attributes = span["attributes"]
    return attributes.get("http.status_code", attributes.get("http.response.status_code"))


async def test_stdout_exporter_prints_one_json_line_per_span(http: ClientSession,
                                                             base_env: dict[str, str]) -> None:
    env = {**base_env, "OTEL_EXPORTER": "stdout", "OTEL_SERVICE_NAME": "authio-stdout-test"}
    async with serve_process(http, env) as served:
        project = await bootstrap_project(served.api, "telemetry-stdout")
        me = await project.api.get("/v1/projects/me")
        unknown = await served.api.get("/v1/nothing-here")
        assert me.status == 200 and unknown.status == 404
        # SIGTERM at once: the spans still queued are flushed at graceful exit.
        assert await stop_gracefully(served) == 0

    lines = [orjson.loads(line) for line in served.stdout if line.startswith("{")]
    non_json = [line for line in served.stdout if line.strip() and not line.startswith("{")]
    assert all("listening on" in line for line in non_json), non_json
    by_request = {s["attributes"].get("authio.request_id"): s for s in lines if s["kind"] == "SERVER"}
    span = by_request[me.body["request_id"]]
    assert set(span) >= {"name", "trace_id", "span_id", "parent_span_id", "kind", "start_time",
                         "end_time", "status", "attributes", "resource"}
    assert span["name"] == "GET /v1/projects/me" and span["parent_span_id"] is None
    assert len(span["trace_id"]) == 32 and len(span["span_id"]) == 16
    assert span["resource"] == {"service.name": "authio-stdout-test"}
    assert span["attributes"]["authio.project_id"] == project.id
    assert span["attributes"]["authio.api_key_id"] == project.key_id
    assert _status_of(span) == 200
    assert span["status"] == "UNSET" and span["start_time"] <= span["end_time"]
    children = [s for s in lines if s["parent_span_id"] == span["span_id"]]
    assert children and all(c["kind"] == "CLIENT" and c["trace_id"] == span["trace_id"] for c in children)
    assert all(c["attributes"]["db.system"] == "postgresql" for c in children)
    assert _status_of(by_request[unknown.body["request_id"]]) == 404
    # Logs: JSON lines on stderr, each with the join fields.
    logs = [orjson.loads(line) for line in served.stderr if line.strip()]
    assert logs, "the engine logs its snapshot at INFO"
    for entry in logs:
        assert set(entry) >= {"ts", "level", "logger", "message", "request_id", "trace_id", "span_id"}


# -- a collector that is down or hangs ----------------------------------------------------------


async def _timed(call: Callable[[], Any]) -> tuple[float, Response]:
    start = time.perf_counter()
    response = await call()
    return time.perf_counter() - start, response


@pytest.mark.parametrize("collector", [closed_port, hanging_collector], ids=["closed-port", "hanging"])
async def test_unavailable_collector_never_slows_or_fails_a_request(
    http: ClientSession, base_env: dict[str, str], collector: Callable[[], Any]
) -> None:
    async with collector() as (url, connections), \
            serve_process(http, otlp_env(base_env, url, OTEL_SAMPLER_RATIO="1.0")) as served:
        project = await bootstrap_project(served.api, "telemetry-down")
        for _ in range(20):  # spans to export; then let an export start and stall or fail
            await project.api.get("/v1/projects/me")
        await asyncio.sleep(1.5)
        timings = [await _timed(lambda: project.api.get("/v1/projects/me")) for _ in range(50)]
        statuses = {r.status for _, r in timings}
        latencies = sorted(t for t, _ in timings)
        concurrent = await asyncio.wait_for(
            asyncio.gather(*(project.api.get("/v1/projects/me") for _ in range(50))), timeout=10)
        assert statuses == {200} and {r.status for r in concurrent} == {200}
        assert latencies[-1] < 1.0, latencies  # an export waits up to 2 s; no request did
        assert statistics.median(latencies) < 0.2, latencies
        if collector is hanging_collector:
            assert connections, "the exporter did try the collector"
        assert await stop_gracefully(served) == 0  # the final flush is bounded
    assert "Traceback" not in served.logs(), served.logs()
    otel_lines = [line for line in served.stderr if '"logger":"opentelemetry' in line]
    assert len(otel_lines) <= 10, otel_lines  # reported, throttled, never per request
    for line in served.stderr:
        orjson.loads(line)  # every log line is JSON
