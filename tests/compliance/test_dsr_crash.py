"""A data-subject deletion survives the death of the process running it (issue 21): killed
between two anonymization batches, it is finished by another process once its lease lapsed,
to the same end state as an uninterrupted one."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import ClientSession

from common.ids import new_id
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.identity import email, sign_in
from tests.fixtures.service import BOOTSTRAP_TOKEN, bootstrap_project, eventually, serve_process

EVENTS = 30_000  # 15 batches


@pytest.fixture(scope="module")
def crash_database_url(database_url: str) -> Iterator[str]:
    """A database of this test's own: no in-process service resumes its deletions."""
    with migrated_database(database_url, "dsr_crash") as url:
        yield url


def _env(database_url: str, redis_url: str, redis_prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN, SERVICE_KMS_KEY=os.environ["SERVICE_KMS_KEY"],
               SERVICE_PG_POOL_MAX="4", OTEL_EXPORTER="none", SERVICE_LOG_LEVEL="WARNING",
               SERVICE_DEV_MAILBOX="true")
    return env


async def test_a_deletion_killed_between_batches_is_finished_elsewhere(
        http: ClientSession, crash_database_url: str, redis_url: str, redis_prefix: str) -> None:
    env = _env(crash_database_url, redis_url, redis_prefix)
    async with database_pool(crash_database_url) as db:
        async with serve_process(http, env, "control-plane") as a:
            project = await bootstrap_project(a.api, "dsr-crash")
            address = email()
            user_id = (await sign_in(project, address)).user_id
            now = datetime.now(UTC)
            await db.copy_records_to_table(
                "audit_events", columns=("id", "created_at", "action", "actor_type", "actor_id",
                                         "user_id", "project_id", "description", "metadata"),
                records=[(new_id("evt"), now - timedelta(seconds=i), "profile.viewed", "user",
                          user_id, user_id, project.id, f"{address} viewed a page",
                          f'{{"user_email": "{address}", "page": {i}}}')
                         for i in range(EVENTS)])
            made = await project.api.post("/v1/compliance/dsr", {"request_type": "deletion",
                                                                 "user_email": address})
            dsr_id = made.body["dsr_id"]
            call = asyncio.create_task(project.api.post(f"/v1/compliance/dsr/{dsr_id}/fulfill", {}))

            deadline = asyncio.get_running_loop().time() + 30
            while True:  # polled closely: a batch takes tens of milliseconds
                done = await db.fetchval(
                    "SELECT (result #>> '{anonymized,audit_events}')::int FROM dsr_requests "
                    "WHERE id = $1 AND status = 'in_progress'", dsr_id)
                if done and done < EVENTS:
                    break
                assert asyncio.get_running_loop().time() < deadline, "never between two batches"
                await asyncio.sleep(0.002)
            a.proc.kill()
            await a.proc.wait()
            with pytest.raises(Exception):  # noqa: B017 (the connection died with the process)
                await call
        state = await db.fetchrow("SELECT status, result FROM dsr_requests WHERE id = $1", dsr_id)
        assert state["status"] == "in_progress"
        left = await db.fetchval("SELECT count(*) FROM audit_events WHERE user_id = $1", user_id)
        assert 0 < left < EVENTS + 3
        # Its lease lapses (60 s: made to lapse now), and another process takes over.
        await db.execute("UPDATE dsr_requests SET locked_until = now() WHERE id = $1", dsr_id)
        async with serve_process(http, env, "control-plane") as b:
            async def fulfilled() -> bool:
                status = await db.fetchval("SELECT status FROM dsr_requests WHERE id = $1", dsr_id)
                return bool(status == "fulfilled")
            await eventually(fulfilled, within=60, what="the deletion finished by another process")
            shown = await b.api.with_key(project.key).get(f"/v1/compliance/dsr/{dsr_id}")
            assert shown.body["status"] == "fulfilled"
            assert shown.body["result"]["anonymized"]["audit_events"] >= EVENTS
        assert await db.fetchval(
            "SELECT count(*) FROM audit_events WHERE project_id = $1 AND (user_id = $2 OR actor_id = $2 "
            "OR metadata::text ILIKE $3 OR description ILIKE $3)", project.id, user_id, f"%{address}%") == 0
        assert await db.fetchval("SELECT count(*) FROM audit_events WHERE project_id = $1 AND "
                                 "action = 'dsr.fulfilled'", project.id) == 1
