"""Stopping background workers (``common.runtime.stop_tasks``)."""

from __future__ import annotations

import asyncio
import contextlib

from common.runtime import stop_tasks


async def test_a_worker_that_swallowed_its_cancellation_is_still_stopped() -> None:
    """Python 3.11's ``wait_for`` and some client reconnect loops can eat a ``CancelledError``;
    the worker then sat in its next wait forever and the shutdown hung on it."""
    swallowed = asyncio.Event()

    async def worker() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        swallowed.set()
        await asyncio.Event().wait()  # never set: only a second cancellation ends this

    task = asyncio.create_task(worker(), name="stubborn")
    await asyncio.sleep(0)
    async with asyncio.timeout(10):
        await stop_tasks(task)
    assert swallowed.is_set() and task.cancelled()


async def test_an_error_a_worker_ended_with_is_raised() -> None:
    async def worker() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("cleanup failed")

    task = asyncio.create_task(worker())
    await asyncio.sleep(0)
    try:
        await stop_tasks(task)
    except RuntimeError as exc:
        assert str(exc) == "cleanup failed"
    else:
        raise AssertionError("the worker's error was not raised")
