"""Check coalescing for the async client: the ``check`` calls made in one event-loop tick go to
the engine as one ``batch-check`` request per store (DataLoader-style).

How: the first ``check`` of a tick schedules a flush with ``loop.call_soon``; every ``check``
until then adds its tuple and a future to the store's queue. The flush runs once the tasks
that were ready in that tick have run (so ``asyncio.gather`` of N checks flushes once, with N
items), drops the items whose callers gave up (timed out or cancelled), folds identical checks
(same tuple, same ``at_least_revision``) into one item, and sends the rest in requests of at most
:data:`~authio_client._operations.MAX_BATCH` items, each item with its own
``consistency.at_least_revision`` (the engine answers all of a request at one revision, after
one bounded wait for the highest one asked). Each caller gets its own item's answer, or its own
item's error.

Failures (the documented fall-back):

* the whole request fails (the API key, the store, the client's retries of 429/503 and of
  broken connections spent): every caller of that request gets that error, as its own check
  would have;
* the request is refused as unknown (404 ``not_found`` or 405 ``method_not_allowed``: a proxy or
  an older service without ``batch-check``): this client stops coalescing and sends each check
  alone from then on;
* an item answered ``revision_not_reached`` (its engine had not followed that revision when its
  wait ended) goes into a later batch after the answer's ``Retry-After`` (1 s), within the
  client's retry bounds, as a single check's 503 would be retried;
* a caller's own ``timeout`` raises :class:`~authio_client.errors.Timeout` for that caller only.

``coalesce=False`` on the client sends every check alone (``POST /v1/stores/{id}/check``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from authio_client import _operations as ops
from authio_client._core import Call, RetryPolicy
from authio_client.errors import AuthioError
from authio_client.models import CheckResult, TupleKey

__all__ = ["Coalescer"]

Runner = Callable[[Call[Any]], Awaitable[Any]]


@dataclass(eq=False, slots=True)
class Pending:
    tuple_key: TupleKey
    at_least: int | None
    future: asyncio.Future[CheckResult]
    started: float = field(default_factory=time.monotonic)
    tries: int = 1

    @property
    def key(self) -> Hashable:
        return (self.tuple_key, self.at_least)


class Coalescer:
    """The queue of one async client (see the module docstring). ``batches`` counts the
    ``batch-check`` requests sent, ``items`` the items they carried; ``batch_supported`` turns
    False after a request refused as unknown."""

    def __init__(self, run: Runner, retry: RetryPolicy, max_batch: int = ops.MAX_BATCH) -> None:
        self._run, self._retry, self.max_batch = run, retry, max_batch
        self._queues: dict[str, list[Pending]] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.batch_supported = True
        self.batches = 0
        self.items = 0

    def submit(self, store_id: str, tuple_key: TupleKey, at_least: int | None) -> asyncio.Future[CheckResult]:
        """Queue one check; the future gets its answer or its error."""
        loop = asyncio.get_running_loop()
        pending = Pending(tuple_key, at_least, loop.create_future())
        self._enqueue(store_id, pending)
        return pending.future

    def _enqueue(self, store_id: str, pending: Pending) -> None:
        self._queues.setdefault(store_id, []).append(pending)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        queues, self._queues = self._queues, {}
        for store_id, queued in queues.items():
            groups: dict[Hashable, list[Pending]] = {}
            for p in queued:
                if not p.future.done():
                    groups.setdefault(p.key, []).append(p)
            chunk: list[list[Pending]] = []
            for same in groups.values():
                chunk.append(same)
                if len(chunk) == self.max_batch:
                    self._spawn(store_id, chunk)
                    chunk = []
            if chunk:
                self._spawn(store_id, chunk)

    def _spawn(self, store_id: str, chunk: list[list[Pending]]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(store_id, chunk))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, store_id: str, chunk: list[list[Pending]]) -> None:
        if not self.batch_supported:
            await asyncio.gather(*(self._single(store_id, same) for same in chunk))
            return
        items = [ops.check_body(same[0].tuple_key, same[0].at_least) for same in chunk]
        self.batches += 1
        self.items += len(items)
        try:
            results: list[CheckResult | AuthioError] = await self._run(
                ops.batch_check_chunk(store_id, items, None))
        except AuthioError as err:
            if err.code in ("not_found", "method_not_allowed") and err.status in (404, 405):
                self.batch_supported = False
                await asyncio.gather(*(self._single(store_id, same) for same in chunk))
                return
            for same in chunk:
                _fail(same, err)
            return
        except BaseException as exc:  # cancelled (the client closing) or a bug: nobody waits forever
            for same in chunk:
                _fail(same, exc)
            raise
        for same, result in zip(chunk, results, strict=True):
            if isinstance(result, AuthioError):
                self._item_failed(store_id, same, result)
            else:
                for p in same:
                    if not p.future.done():
                        p.future.set_result(result)

    def _item_failed(self, store_id: str, same: list[Pending], err: AuthioError) -> None:
        delay = err.retry_after if err.retry_after is not None else 1.0
        loop = asyncio.get_running_loop()
        for p in same:
            if p.future.done():
                continue
            if (err.status == 503 and p.tries < self._retry.attempts
                    and time.monotonic() - p.started + delay <= self._retry.total_seconds):
                p.tries += 1
                loop.call_later(delay, self._enqueue, store_id, p)
            else:
                p.future.set_exception(err)

    async def _single(self, store_id: str, same: list[Pending]) -> None:
        first = same[0]
        call = ops.check(store_id, first.tuple_key.object, first.tuple_key.relation, first.tuple_key.user,
                         at_least_revision=first.at_least)
        try:
            result = await self._run(call)
        except AuthioError as err:
            _fail(same, err)
        else:
            for p in same:
                if not p.future.done():
                    p.future.set_result(result)

    async def aclose(self) -> None:
        """Cancel the requests in flight (their callers get CancelledError)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _fail(same: list[Pending], exc: BaseException) -> None:
    for p in same:
        if not p.future.done():
            if isinstance(exc, asyncio.CancelledError):
                p.future.cancel()
            else:
                p.future.set_exception(exc)
