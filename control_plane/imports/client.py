"""The import tool's HTTP client of a control plane: paced, retried, and clear about failure.

* Pacing: at most ``rate`` requests a second (aiolimiter's leaky bucket; every attempt counts),
  at most ``concurrency`` connections.
* 429 and 5xx are retried (tenacity) after their ``Retry-After``, else exponential backoff with
  jitter, up to :data:`HTTP_ATTEMPTS` attempts; the last answer is then returned as it is.
* A network failure (no answer at all) is retried without end: the tool pauses rather than
  skip anything, and says once that it paused and once that it resumed (``note``).
* 401 and 403 raise :class:`ImportAborted`: every later request would fail the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import aiohttp
import orjson
from aiolimiter import AsyncLimiter
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

HTTP_ATTEMPTS: Final = 10
"""Attempts of one request answered 429 or 5xx before its answer stands."""
MAX_RETRY_AFTER: Final = 300.0
USER_AGENT: Final = "authio-import/1"


class ImportAborted(Exception):
    """The service refused the key (401/403): nothing more can be imported with it."""


class _Again(Exception):
    """A 429 or 5xx answer: try again."""

    def __init__(self, status: int, body: Any, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.retry_after = status, body, retry_after


def _retry_after(value: str | None) -> float | None:
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value))) if value else None
    except ValueError:
        return None  # an HTTP date: backoff decides


_BACKOFF: Final = wait_exponential_jitter(multiplier=0.5, max=30.0)


def _wait(state: RetryCallState) -> float:
    """``Retry-After`` when the answer gave one, else exponential backoff with jitter."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, _Again) and exc.retry_after is not None:
        return exc.retry_after
    return _BACKOFF(state)


def message(body: Any, status: int | None = None) -> str:
    """What an answer's error envelope says (``code: message``), or its status."""
    try:
        return f"{body['error']['code']}: {body['error']['message']}"
    except (KeyError, TypeError):
        return f"HTTP {status}" if status is not None else "no error envelope"


class ServiceClient:
    """JSON requests to one control plane with one API key (module docstring)."""

    def __init__(self, base_url: str, api_key: str, *, rate: float, concurrency: int,
                 note: Callable[[str], None]) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT,
                         "Content-Type": "application/json"}
        self._limiter = AsyncLimiter(rate, 1.0)
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            connector=aiohttp.TCPConnector(limit=concurrency),
            cookie_jar=aiohttp.DummyCookieJar())  # an API client: no cookie to keep or send
        self._note = note
        self._paused = False

    async def close(self) -> None:
        await self._http.close()

    async def _once(self, method: str, path: str, body: bytes | None) -> tuple[int, Any]:
        async with self._limiter, self._http.request(method, self._base + path, data=body,
                                                     headers=self._headers) as r:
            raw = await r.read()
        if self._paused:
            self._paused = False
            self._note("the service answers again: resumed")
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        if r.status in (401, 403):
            raise ImportAborted(f"the service refused the key ({message(parsed, r.status)}); "
                                "sign in again with `authio login`")
        if r.status == 429 or r.status >= 500:
            raise _Again(r.status, parsed, _retry_after(r.headers.get("Retry-After")))
        return r.status, parsed

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, (aiohttp.ClientError, TimeoutError)) and not self._paused:
            self._paused = True
            self._note(f"cannot reach the service ({type(exc).__name__}: {exc}); paused, "
                       "retrying (nothing is skipped)")

    async def request(self, method: str, path: str, json: Any = None) -> tuple[int, Any]:
        """``(status, parsed JSON body or None)`` of ``method path`` (module docstring).
        Raises ImportAborted."""
        body = orjson.dumps(json) if json is not None else None
        answered = 0

        def stop(state: RetryCallState) -> bool:
            """Network failures never stop; answers stop after :data:`HTTP_ATTEMPTS` of them
            (however many network failures came between)."""
            nonlocal answered
            exc = state.outcome.exception() if state.outcome is not None else None
            if not isinstance(exc, _Again):
                return False
            answered += 1
            return answered >= HTTP_ATTEMPTS

        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type((_Again, aiohttp.ClientError, TimeoutError)),
                    wait=_wait, stop=stop, before_sleep=self._before_sleep, reraise=True):
                with attempt:
                    return await self._once(method, path, body)
        except _Again as err:
            return err.status, err.body
        raise AssertionError("unreachable")
