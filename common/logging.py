"""Structured logs: one JSON object per line on standard error.

Each line carries ``ts``, ``level``, ``logger``, ``message``, ``request_id``, ``trace_id`` and
``span_id`` (null outside a request or a trace), ``exception`` (the formatted traceback) when there
is one, and any ``extra={...}`` fields. ``request_id`` is the id the client got in ``X-Request-Id``
and in the error envelope; ``trace_id`` is the trace the request's spans belong to, so a client's
error, a log line and a span can be joined (SPEC.md 1).

The request id comes from :data:`CURRENT_REQUEST_ID`, which ``common.http.envelope_middleware`` sets
for the duration of each request; the trace ids from the current OpenTelemetry span (valid even
for a request the sampler did not keep).

``configure_logging`` replaces ``logging.basicConfig`` in the ``authio`` command. Records of the
OpenTelemetry SDK and exporters are throttled to one per logger and message per minute, so a
collector outage is reported, not repeated for every batch.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import orjson
from opentelemetry import trace

__all__ = ["CURRENT_REQUEST_ID", "ContextFilter", "JsonFormatter", "configure_logging"]

CURRENT_REQUEST_ID: Final[ContextVar[str | None]] = ContextVar("authio_request_id", default=None)
"""The id of the request being handled in this context (set by the envelope middleware)."""

_CONTEXT_FIELDS: Final = ("request_id", "trace_id", "span_id")
# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_FIELDS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName", *_CONTEXT_FIELDS,
}
_THROTTLED_PREFIX: Final = "opentelemetry"
_THROTTLE_SECONDS: Final = 60.0


class ContextFilter(logging.Filter):
    """Stamps ``request_id``, ``trace_id`` and ``span_id`` on each record (an explicit
    ``extra={"request_id": ...}`` wins). Runs in the thread that logs, so it sees its context."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = CURRENT_REQUEST_ID.get()
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = format(ctx.trace_id, "032x")
            record.span_id = format(ctx.span_id, "016x")
        else:
            record.trace_id = record.span_id = None
        return True


class _Throttle(logging.Filter):
    """At most one record per (logger, message template) per minute from OpenTelemetry's own
    loggers: an unreachable collector fails every export, and once a minute is enough to know."""

    def __init__(self, seconds: float = _THROTTLE_SECONDS) -> None:
        super().__init__()
        self._seconds = seconds
        self._last: dict[tuple[str, object], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_THROTTLED_PREFIX):
            return True
        key, now = (record.name, record.msg), time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._seconds:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


class JsonFormatter(logging.Formatter):
    """One compact JSON object per record (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _CONTEXT_FIELDS:
            out[name] = getattr(record, name, None)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_") and key not in out:
                out[key] = value
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str | int, *, stream: TextIO | None = None) -> logging.Handler:
    """Send every log record as a JSON line to ``stream`` (standard error), at ``level``.

    Replaces the root logger's handlers; returns the handler installed.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(_Throttle())
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
