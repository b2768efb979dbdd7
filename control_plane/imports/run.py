"""One import run: the records of an export, deduplicated, skipped or sent to ``POST
/v1/users``, paced and retried, with the cursor kept (SPEC.md 4 "Import tool").

* Each eligible record becomes ``POST /v1/users`` with ``email_verified: true`` (rule 2), its
  name and ``metadata.import`` (the origin and its id; never password material): 201 counts
  ``created``, 200 ``existed`` (rule 1), any other 4xx ``errored`` with its message.
* Requests are paced by ``rate`` per second (aiolimiter's leaky bucket, every attempt counted)
  with up to ``concurrency`` in flight. 429 and 5xx are retried (tenacity) after their
  ``Retry-After``, else exponential backoff with jitter, up to :data:`HTTP_ATTEMPTS` attempts;
  a network failure pauses the record and retries it without end (it is never skipped), and the
  run says once that it paused and once that it resumed. A 401 or 403 stops the run
  (:class:`ImportAborted`): every later request would fail the same way.
* The cursor (``cursor``) is saved every :data:`SAVE_SECONDS` and when the run stops for any
  reason; a run that reaches the end removes it. Records a resumed run finds done are only
  replayed through the deduplication (no request), so duplicates are judged as in one run.
  Requests in flight when a process was killed are sent again and count ``existed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import aiohttp
import orjson
from aiolimiter import AsyncLimiter
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from control_plane.imports import cursor as cursors
from control_plane.imports.cursor import Cursor
from control_plane.imports.formats import BadRecord, Candidate, Deduper, Format

HTTP_ATTEMPTS: Final = 10
"""Attempts of one record answered 429 or 5xx before it counts ``errored``."""
MAX_RETRY_AFTER: Final = 300.0
SAVE_SECONDS: Final = 0.5
KEPT_ERRORS: Final = 1000
"""Error messages kept in the cursor (the tally counts them all)."""
USER_AGENT: Final = "authio-import/1"


class ImportAborted(Exception):
    """The service refused the key (401/403): nothing more can be imported with it."""


class _Again(Exception):
    """A 429 or 5xx answer: try the record again."""

    def __init__(self, status: int, retry_after: float | None, message: str) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


def _retry_after(value: str | None) -> float | None:
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value))) if value else None
    except ValueError:
        return None  # an HTTP date: backoff decides


_BACKOFF: Final = wait_exponential_jitter(initial=0.5, max=30.0)


def _wait(state: RetryCallState) -> float:
    """``Retry-After`` when the answer gave one, else exponential backoff with jitter."""
    exc = state.outcome.exception() if state.outcome is not None else None
    if isinstance(exc, _Again) and exc.retry_after is not None:
        return exc.retry_after
    return _BACKOFF(state)


def _stop(state: RetryCallState) -> bool:
    """Network failures never stop; HTTP answers stop after :data:`HTTP_ATTEMPTS`."""
    exc = state.outcome.exception() if state.outcome is not None else None
    return isinstance(exc, _Again) and state.attempt_number >= HTTP_ATTEMPTS


class Reporter(Protocol):
    """Where a run tells its progress (a progress bar, or plain lines)."""

    def advance(self, done: int, tally: dict[str, int]) -> None: ...
    def note(self, message: str) -> None: ...


class UsersApi:
    """``POST /v1/users`` on a control plane, paced and retried (module docstring)."""

    def __init__(self, base_url: str, api_key: str, *, rate: float, concurrency: int,
                 note: Callable[[str], None]) -> None:
        self._url = base_url.rstrip("/") + "/v1/users"
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT,
                         "Content-Type": "application/json"}
        self._limiter = AsyncLimiter(rate, 1.0)
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            connector=aiohttp.TCPConnector(limit=concurrency))
        self._note = note
        self._paused = False

    async def close(self) -> None:
        await self._http.close()

    async def _post(self, body: bytes) -> tuple[str, str | None]:
        async with self._limiter, self._http.post(self._url, data=body,
                                                  headers=self._headers) as r:
            text = await r.read()
        if self._paused:
            self._paused = False
            self._note("the service answers again: resumed")
        if r.status in (201, 200):
            return ("created" if r.status == 201 else "existed"), None
        try:
            error = orjson.loads(text)["error"]
            message = f"{error['code']}: {error['message']}"
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = f"HTTP {r.status}"
        if r.status in (401, 403):
            raise ImportAborted(f"the service refused the key ({message}); sign in again "
                                "with `authio login`")
        if r.status == 429 or r.status >= 500:
            raise _Again(r.status, _retry_after(r.headers.get("Retry-After")), message)
        return "errored", message

    def _paused_by(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, (aiohttp.ClientError, TimeoutError)) and not self._paused:
            self._paused = True
            self._note(f"cannot reach the service ({type(exc).__name__}: {exc}); paused, "
                       "retrying (nothing is skipped)")

    async def create(self, candidate: Candidate) -> tuple[str, str | None]:
        """``(outcome, error message)`` of creating ``candidate``'s user. Raises
        ImportAborted."""
        body = orjson.dumps({"email": candidate.email, "email_verified": True,
                             "name": candidate.name, "metadata": candidate.metadata})
        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type((_Again, aiohttp.ClientError, TimeoutError)),
                    wait=_wait, stop=_stop, before_sleep=self._paused_by, reraise=True):
                with attempt:
                    return await self._post(body)
        except _Again as err:
            return "errored", f"{err} (after {HTTP_ATTEMPTS} attempts)"
        raise AssertionError("unreachable")


@dataclass(slots=True)
class _State:
    cursor: Cursor
    inflight: set[int]
    last_index: int = -1
    done: int = 0

    def finish(self, index: int, outcome: str, *, reason: str | None = None,
               error: str | None = None, email: str | None = None, raw: bool = False) -> None:
        c = self.cursor
        c.tally[outcome] += 1
        if reason is not None:
            c.reasons[reason] = c.reasons.get(reason, 0) + 1
        if error is not None and len(c.errors) < KEPT_ERRORS:
            c.errors.append(error if raw else f"record {index} ({email or 'no e-mail'}): {error}")
        c.done_above[index] = outcome
        self.done += 1

    def settle(self) -> None:
        """Move the resume point up to the lowest record not done."""
        c = self.cursor
        c.next_index = min(self.inflight) if self.inflight else self.last_index + 1
        for index in [i for i in c.done_above if i < c.next_index]:
            del c.done_above[index]


async def run(fmt: Format, file: Path, *, cursor: Cursor, api: UsersApi | None,
              concurrency: int, reporter: Reporter, persist: bool = True) -> Cursor:
    """Import ``file`` (module docstring); ``api`` None is a dry run (nothing sent: every
    eligible record counts ``created``). Returns the cursor as the run ends (its tally covers
    every run of the file); with ``persist`` it is saved as it goes and removed at the end.
    A record no parser understands counts ``errored`` with its reason. Raises ImportAborted
    (the cursor saved)."""
    state = _State(cursor, set())
    dedupe = Deduper()
    queue: asyncio.Queue[Candidate | None] = asyncio.Queue(maxsize=2 * concurrency)
    aborted: list[ImportAborted] = []

    async def work() -> None:
        while (candidate := await queue.get()) is not None:
            if aborted:
                continue  # drain: the run is stopping
            assert api is not None
            try:
                outcome, error = await api.create(candidate)
            except ImportAborted as err:
                aborted.append(err)
                continue
            state.inflight.discard(candidate.index)
            state.finish(candidate.index, outcome, error=error, email=candidate.email)

    async def keep() -> None:
        while True:
            await asyncio.sleep(SAVE_SECONDS)
            state.settle()
            if persist:
                cursors.save(file, cursor)
            reporter.advance(state.done, cursor.tally)

    workers = [asyncio.create_task(work()) for _ in range(concurrency if api else 0)]
    keeper = asyncio.create_task(keep())
    last_yield = time.monotonic()
    try:
        for candidate in records(fmt, file):
            if aborted:
                break
            state.last_index = candidate.index
            if isinstance(candidate, BadRecord):
                if not cursor.is_done(candidate.index):
                    state.finish(candidate.index, "errored", error=str(candidate), raw=True)
                continue
            if cursor.is_done(candidate.index):
                dedupe.reason(candidate)  # replayed: judged as the first run judged it
                continue
            reason = dedupe.reason(candidate)
            if reason is not None:
                state.finish(candidate.index, "skipped", reason=reason)
            elif api is None:
                state.finish(candidate.index, "created")
            else:
                state.inflight.add(candidate.index)
                await queue.put(candidate)
            if time.monotonic() - last_yield > 0.05:  # let the keeper and reporter run
                await asyncio.sleep(0)
                last_yield = time.monotonic()
        for _ in workers:
            await queue.put(None)
        await asyncio.gather(*workers)
    finally:
        for task in (keeper, *workers):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(keeper, *workers, return_exceptions=True)
        state.settle()
        reporter.advance(state.done, cursor.tally)
        if persist:
            cursors.save(file, cursor)
    if aborted:
        raise aborted[0]
    if persist:
        cursors.remove(file)
    return cursor


def records(fmt: Format, file: Path) -> Iterator[Candidate | BadRecord]:
    """``fmt``'s records of ``file``, a record no parser understands given as its BadRecord
    (counted ``errored``) instead of ending the iteration."""
    it = fmt.records(file)
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except BadRecord as bad:
            yield bad


def concurrency_for(rate: float) -> int:
    """Requests in flight for ``rate`` per second: enough to reach it at ~50 ms a request."""
    return max(2, min(128, int(rate / 16) + 1))


def summary(cursor: Cursor) -> list[str]:
    """The lines a run ends with: the skip reasons and errors, then the tally (exactly
    ``created N, existed N, skipped N, errored N``: DESIGN.md "CLI login and import")."""
    t, lines = cursor.tally, []
    if cursor.reasons:
        lines.append(f"skipped {t['skipped']}: " + ", ".join(
            f"{reason} {n}" for reason, n in sorted(cursor.reasons.items())))
    shown = cursor.errors[:20]
    lines += [f"error: {e}" for e in shown]
    if t["errored"] > len(shown):
        lines.append(f"... and {t['errored'] - len(shown)} more errors")
    lines.append(f"created {t['created']}, existed {t['existed']}, skipped {t['skipped']}, "
                 f"errored {t['errored']}")
    return lines

