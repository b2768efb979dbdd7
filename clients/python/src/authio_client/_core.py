"""The request/response core both clients share: what a call is (:class:`Call`), how it becomes
an HTTP request, how an answer becomes a value or an :class:`~authio_client.errors.AuthioError`,
and when a failure is tried again (:class:`RetryPolicy`, :class:`Attempts`). No I/O here: the
sync client sends with ``httpx.Client`` and sleeps with ``time.sleep``, the async one with
``httpx.AsyncClient`` and ``asyncio.sleep``, each in a loop of a dozen lines around this.

Retries (DESIGN.md "codes", docs/retries.md):

* 429 ``rate_limited`` and every 503 (``db_unavailable``, ``service_unavailable``, ``not_ready``,
  ``revision_not_reached``) are tried again after the answer's ``Retry-After`` (seconds or an
  HTTP date), else after an exponential backoff with jitter; except a 503 whose
  ``details.outcome`` is ``"unknown"`` (a write caught committing) on a call that is neither
  idempotent nor carries an ``Idempotency-Key``.
* A connection that could not be opened is tried again for any call (nothing was sent); one
  that broke after sending only for idempotent calls (GET, PUT, DELETE, checks, ``POST
  /v1/users``) and for calls with an ``Idempotency-Key`` (tuple writes: the key is made once
  per call and sent again on each retry, so the write applies at most once).
* Bounded: at most ``RetryPolicy.attempts`` tries in all and ``RetryPolicy.total_seconds`` from
  the first; a wait that would end past that bound is not started, and the last error is raised.
"""

from __future__ import annotations

import email.utils
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Generic, Literal, TypeVar

import httpx

from authio_client.errors import AuthioError, ConnectionFailed, Timeout, error_from

__all__ = ["DEFAULT_TIMEOUT", "LIMITS", "Attempts", "Call", "Config", "Reply", "RetryPolicy", "build_request",
           "interpret", "transport_error", "user_agent"]

T = TypeVar("T")
VERSION = "0.1.0"
DEFAULT_TIMEOUT = 10.0
LIMITS: Final = httpx.Limits(max_connections=100, max_keepalive_connections=100)
"""The clients' own connection pools: as many idle connections kept as may be open (httpx keeps
20 by default, so a busy client would open and close the rest for every request)."""
RETRY_STATUSES = frozenset({429, 503})


def user_agent() -> str:
    return f"authio-client-python/{VERSION} httpx/{httpx.__version__}"


_USER_AGENT: Final = user_agent()


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful answer: status, headers, the decoded JSON body (None when empty), and its
    ``request_id``."""

    status: int
    headers: httpx.Headers
    body: Any
    request_id: str | None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One operation: ``method`` and ``path`` (under the base URL, or the engine's URL when
    ``target`` is ``engine``), query ``params``, a ``json`` body, extra ``headers``, ``parse``
    turning the answer into the method's value, ``idempotent`` (safe to send again after a
    broken connection), and ``bearer``: a token sent instead of the API key (an end user's
    access token), or ``""`` for none at all."""

    method: str
    path: str
    parse: Callable[[Reply], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    idempotent: bool = False
    target: Literal["api", "engine"] = "api"
    bearer: str | None = None

    @property
    def keyed(self) -> bool:
        """Whether the call carries an ``Idempotency-Key`` (applied at most once, however often
        it is sent)."""
        return any(k.lower() == "idempotency-key" for k in self.headers)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failures are tried again: at most ``attempts`` tries in all, within ``total_seconds``
    of the first; between tries the answer's ``Retry-After``, else ``backoff`` seconds doubled
    each time up to ``max_backoff``, with jitter (a random 50 to 100 % of it).
    ``RetryPolicy(attempts=1)`` never retries."""

    attempts: int = 5
    total_seconds: float = 30.0
    backoff: float = 0.2
    max_backoff: float = 5.0


class Attempts:
    """The retry state of one call: :meth:`after_error` and :meth:`after_transport` answer the
    seconds to wait before the next try, or None to give up."""

    def __init__(self, policy: RetryPolicy, call: Call[Any], clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.call, self.clock = policy, call, clock
        self.started = clock()
        self.tries = 1

    def _wait(self, retry_after: float | None) -> float | None:
        if self.tries >= self.policy.attempts:
            return None
        if retry_after is not None:
            delay = max(0.0, retry_after)
        else:
            base = min(self.policy.max_backoff, self.policy.backoff * 2 ** (self.tries - 1))
            delay = random.uniform(base / 2, base)
        if self.clock() - self.started + delay > self.policy.total_seconds:
            return None
        self.tries += 1
        return delay

    def after_error(self, err: AuthioError) -> float | None:
        """Seconds to wait before sending the call again after the error answer ``err``."""
        if err.status not in RETRY_STATUSES:
            return None
        if err.details.get("outcome") == "unknown" and not (self.call.idempotent or self.call.keyed):
            return None
        return self._wait(err.retry_after)

    def after_transport(self, exc: httpx.TransportError) -> float | None:
        """Seconds to wait before sending the call again after ``exc`` (no answer)."""
        unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        if not (unsent or self.call.idempotent or self.call.keyed):
            return None
        return self._wait(None)


@dataclass(frozen=True, slots=True)
class Config:
    """What both clients are built from (see their docstrings)."""

    base_url: str
    engine_url: str
    api_key: str | None
    retry: RetryPolicy


def _join(base: str, path: str) -> str:
    return base.rstrip("/") + path


def build_request(http: httpx.Client | httpx.AsyncClient, config: Config, call: Call[Any]) -> httpx.Request:
    """The HTTP request of ``call`` (the same object is sent again on each retry)."""
    headers = {"Accept": "application/json", "User-Agent": _USER_AGENT, **call.headers}
    token = config.api_key if call.bearer is None else call.bearer
    if token:
        headers["Authorization"] = f"Bearer {token}"
    content = None
    if call.json is not None:
        content = json.dumps(call.json, separators=(",", ":")).encode()
        headers["Content-Type"] = "application/json"
    params = {k: _param(v) for k, v in (call.params or {}).items() if v is not None}
    base = config.engine_url if call.target == "engine" else config.base_url
    return http.build_request(call.method, _join(base, call.path), params=params, headers=headers,
                              content=content)


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def retry_after(headers: httpx.Headers) -> float | None:
    """The ``Retry-After`` header in seconds (RFC 9110 10.2.3: delay-seconds or an HTTP-date),
    None when absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def interpret(response: httpx.Response) -> Reply:
    """``response`` as a :class:`Reply` when it is a success (2xx, 304), else the
    :class:`~authio_client.errors.AuthioError` of its envelope, raised."""
    body: Any = None
    if response.content:
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
    request_id = response.headers.get("x-request-id")
    if response.is_success or response.status_code == 304:
        if request_id is None and isinstance(body, dict):
            request_id = body.get("request_id")
        return Reply(response.status_code, response.headers, body, request_id)
    raise error_from(response.status_code, body, request_id=request_id,
                     retry_after=retry_after(response.headers))


def transport_error(exc: httpx.TransportError, call: Call[Any]) -> AuthioError:
    """The error raised for ``exc`` once no retry is left."""
    what = f"{call.method} {call.path}"
    if isinstance(exc, httpx.TimeoutException):
        return Timeout(f"{what}: no answer in time ({type(exc).__name__})")
    return ConnectionFailed(f"{what}: {type(exc).__name__}: {exc}")
