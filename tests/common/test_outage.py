"""``common.db.Outage``: a worker loop's database outage, waited out with backoff and said once
each way (the webhook fan-out and delivery worker, the outbox and the audit streams use it)."""

from __future__ import annotations

import logging

import pytest

from common.db import Outage, reconnect_delay


async def test_failures_back_off_and_recovery_is_said_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr("common.db.asyncio.sleep", sleep)
    log = logging.getLogger("tests.outage")
    caplog.set_level(logging.INFO, logger="tests.outage")
    outage = Outage("claiming things", log)
    outage.over()  # nothing failed: nothing said
    for _ in range(3):
        await outage.failed(ConnectionRefusedError("no server"))
    outage.over()
    outage.over()
    await outage.failed(OSError("again"))
    assert waited == [reconnect_delay(1), reconnect_delay(2), reconnect_delay(3), reconnect_delay(1)]
    assert waited[:3] == [0.5, 1.0, 2.0]
    assert [r.getMessage() for r in caplog.records] == [
        "claiming things failed (ConnectionRefusedError: no server); retrying in 0.5 s",
        "claiming things failed (ConnectionRefusedError: no server); retrying in 1.0 s",
        "claiming things failed (ConnectionRefusedError: no server); retrying in 2.0 s",
        "claiming things works again",
        "claiming things failed (OSError: again); retrying in 0.5 s",
    ]
