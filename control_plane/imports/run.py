"""One import run: the records of an export, deduplicated, skipped or sent to ``POST
/v1/users``, with the cursor kept (SPEC.md 4 "Import tool").

* Each eligible record becomes ``POST /v1/users`` with ``email_verified: true`` (rule 2), its
  name and ``metadata.import`` (the origin and its id; never password material): 201 counts
  ``created``, 200 ``existed`` (rule 1), any other answer ``errored`` with its message.
* Up to ``concurrency`` requests are in flight, paced and retried by the
  :class:`~control_plane.imports.client.ServiceClient` (429 and 5xx retried honouring
  ``Retry-After``, a network failure paused and never skipped); a 401 or 403 stops the run
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from control_plane.imports import cursor as cursors
from control_plane.imports.client import HTTP_ATTEMPTS, ImportAborted, ServiceClient, message
from control_plane.imports.cursor import Cursor
from control_plane.imports.formats import BadRecord, Candidate, Deduper, Format

SAVE_SECONDS: Final = 0.5
KEPT_ERRORS: Final = 1000
"""Error messages kept in the cursor (the tally counts them all)."""


class Reporter(Protocol):
    """Where a run tells its progress (a progress bar, or plain lines)."""

    def advance(self, done: int, tally: dict[str, int]) -> None: ...
    def note(self, message: str) -> None: ...


class UsersApi:
    """``POST /v1/users`` through a :class:`ServiceClient` (paced and retried)."""

    def __init__(self, client: ServiceClient) -> None:
        self._client = client

    async def create(self, candidate: Candidate) -> tuple[str, str | None]:
        """``(outcome, error message)`` of creating ``candidate``'s user: ``created`` (201),
        ``existed`` (200) or ``errored``. Raises ImportAborted."""
        status, body = await self._client.request("POST", "/v1/users", {
            "email": candidate.email, "email_verified": True, "name": candidate.name,
            "metadata": candidate.metadata})
        if status in (200, 201):
            return ("created" if status == 201 else "existed"), None
        retried = f" (after {HTTP_ATTEMPTS} attempts)" if status == 429 or status >= 500 else ""
        return "errored", message(body, status) + retried


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

