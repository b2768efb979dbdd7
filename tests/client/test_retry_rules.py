"""The client's retry rules (``authio_client._core``), decided without I/O on a clock the test
moves: which answers and failures are tried again, after how long, and when the bound stops it.
The same rules are exercised over HTTP by ``test_outage.py`` and the lost-answer write test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
from authio_client import RetryPolicy
from authio_client import _operations as ops
from authio_client._core import Attempts, Call, retry_after
from authio_client.errors import (
    AuthioError,
    DbUnavailable,
    InvalidRequest,
    RateLimited,
    ServerError,
    error_from,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def attempts(call: Call[Any], policy: RetryPolicy | None = None) -> tuple[Attempts, Clock]:
    clock = Clock()
    return Attempts(policy or RetryPolicy(attempts=4, total_seconds=10.0), call, clock), clock


def unavailable(retry_after: float | None = 1.0, **details: object) -> AuthioError:
    return DbUnavailable("down", status=503, details=details, retry_after=retry_after)


def test_429_and_503_wait_their_retry_after_within_the_bounds() -> None:
    a, clock = attempts(ops.create_organization("Acme", "acme"))
    assert a.after_error(RateLimited("slow down", status=429, retry_after=3.0)) == 3.0
    clock.now = 3.0
    assert a.after_error(unavailable(1.0)) == 1.0
    clock.now = 4.0
    assert a.after_error(unavailable(1.0)) == 1.0
    clock.now = 5.0
    assert a.after_error(unavailable(1.0)) is None  # the 4th try was the last
    b, clock = attempts(ops.get_store("store_x"))
    clock.now = 9.5
    assert b.after_error(unavailable(1.0)) is None  # would end past total_seconds


def test_other_errors_are_final() -> None:
    a, _ = attempts(ops.get_store("store_x"))
    for err in (InvalidRequest("bad", status=400), ServerError("boom", status=500),
                error_from(404, {"error": {"code": "store_not_found", "message": "x", "details": {}}})):
        assert a.after_error(err) is None


def test_a_write_caught_committing_is_resent_only_with_a_key() -> None:
    unknown = unavailable(1.0, outcome="unknown")
    keyed, _ = attempts(ops.write_tuples("store_x", writes=[("doc:1", "viewer", "user:1")]))
    assert keyed.after_error(unknown) == 1.0
    plain, _ = attempts(ops.create_organization("Acme", "acme"))
    assert plain.after_error(unknown) is None
    assert plain.after_error(unavailable(1.0)) == 1.0  # nothing was written: safe


def test_broken_connections_are_retried_when_safe() -> None:
    request = httpx.Request("POST", "http://x/")
    refused = httpx.ConnectError("refused", request=request)
    broken = httpx.ReadError("reset", request=request)
    post, _ = attempts(ops.create_organization("Acme", "acme"))
    assert post.after_transport(refused) is not None  # never sent
    assert post.after_transport(broken) is None  # may have been applied
    for safe in (ops.get_store("store_x"), ops.check("store_x", "doc:1", "viewer", "user:1"),
                 ops.write_tuples("store_x", writes=[("doc:1", "viewer", "user:1")])):
        a, _ = attempts(safe)
        delay = a.after_transport(broken)
        assert delay is not None and 0.1 <= delay <= 0.2  # backoff 0.2 s, jittered down to half


def test_backoff_doubles_up_to_its_cap() -> None:
    a, _ = attempts(ops.get_store("store_x"), RetryPolicy(attempts=10, total_seconds=100, backoff=1.0,
                                                          max_backoff=4.0))
    delays = [a.after_transport(httpx.ConnectError("x")) for _ in range(5)]
    assert all(d is not None for d in delays)
    highs = [1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(h / 2 <= d <= h for d, h in zip(delays, highs, strict=True))  # type: ignore[operator]


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after(httpx.Headers({"Retry-After": "5"})) == 5.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    value = retry_after(httpx.Headers({"Retry-After": later}))
    assert value is not None and 28 <= value <= 30
    assert retry_after(httpx.Headers({})) is None
    assert retry_after(httpx.Headers({"Retry-After": "soon"})) is None


def test_errors_by_code_then_by_status() -> None:
    def err(status: int, code: str) -> AuthioError:
        return error_from(status, {"error": {"code": code, "message": "m", "details": {"k": 1}},
                                   "request_id": "req_1"})
    assert type(err(404, "user_not_found")).__name__ == "UserNotFound"
    assert type(err(404, "passkey_not_found")).__name__ == "NotFound"  # no class of its own
    assert type(err(503, "bootstrap_disabled")).__name__ == "Unavailable"
    assert type(err(418, "teapot")).__name__ == "AuthioError"
    e = err(409, "phone_in_use")
    assert (type(e).__name__, e.code, e.status, e.details, e.request_id) == ("Conflict", "phone_in_use", 409,
                                                                            {"k": 1}, "req_1")
    proxy = error_from(502, b"<html>bad gateway</html>")
    assert (type(proxy).__name__, proxy.code) == ("ServerError", "http_502")
