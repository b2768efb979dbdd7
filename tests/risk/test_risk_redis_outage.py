"""The risk engine with its attempt counters' Redis stopped and started again (issue 19: Redis
never stops a sign-in; the velocity signals say the counters are out of reach and do not fire).

The service runs on a database and a ``redis-server`` of the test's own (as
tests/sessions/test_redis_outages.py does), so no other app's outbox delivers its links and
the test can stop and start that Redis. It has the risk service's settings: the test GeoIP
database, loopback as a trusted proxy, small velocity limits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import database_pool, events, migrated_database
from tests.fixtures.geo import PLACES
from tests.fixtures.identity import email, latest_link, send_link, token_of, verify
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.redis import PrivateRedis, private_redis
from tests.fixtures.service import Api, Project, bootstrap_project, combined_app, serving
from tests.risk.helpers import RISK_SETTINGS, client, decision, fired, reason

PREFIX = "risk_outage:"
OUT_OF_REACH = "not evaluated: the attempt counters (Redis) are out of reach"


@pytest.fixture(scope="module")
def outage_db(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "risk_outage") as url:
        yield url


@dataclass
class Rig:
    api: Api
    project: Project
    redis: PrivateRedis
    db: asyncpg.Pool

    async def link(self, address: str) -> str:
        """Send a sign-in link to ``address`` (Redis must run: the send is rate limited there,
        failing closed) and read its token."""
        before = len(await mailbox_messages(self.project.api, address, count=0))
        sent = await send_link(self.api, self.project, address)
        assert sent.status == 200, sent.body
        return token_of(await latest_link(self.project, address, count=before + 1))

    async def redeem(self, token: str, ip: str) -> dict[str, Any]:
        async with asyncio.timeout(5):  # the counters are given half a second, no more
            r = await verify(self.api, self.project, token, headers=client(ip))
        assert r.status == 200, r.body
        return dict(r.body)

    async def latest(self) -> dict[str, Any]:
        r = await self.project.api.get("/v1/risk/decisions?limit=1")
        assert r.status == 200, r.body
        return await decision(self.project, r.body["data"][0]["id"])


@pytest_asyncio.fixture
async def rig(outage_db: str, settings_factory: Callable[..., Settings], http: ClientSession,
              geoip_database: Path) -> AsyncIterator[Rig]:
    with private_redis() as redis:
        settings = settings_factory(database_url=outage_db, redis_url=redis.url, redis_prefix=PREFIX,
                                    geoip_database=str(geoip_database), **RISK_SETTINGS)
        async with serving(http, combined_app(settings)) as api, database_pool(outage_db) as db:
            project = await bootstrap_project(api, "risk-outage")
            yield Rig(api, project, redis, db)


async def test_a_sign_in_goes_through_without_redis_and_counts_again_once_it_is_back(rig: Rig) -> None:
    ip = PLACES["berlin"].ip
    address = email()
    token = await rig.link(address)
    await asyncio.to_thread(rig.redis.stop)

    first = await rig.redeem(token, ip)
    d = await rig.latest()
    assert d["session_id"] == first["session"]["id"]
    assert (d["score"], d["decision"], fired(d)) == (0, "allow", set())
    assert reason(d, "ip_velocity") == OUT_OF_REACH
    assert reason(d, "destination_velocity") == OUT_OF_REACH
    assert d["inputs"]["ip_attempts"] is None and d["inputs"]["destination_attempts"] is None
    assert d["inputs"]["place"]["city"] == "Berlin"  # the other signals saw everything
    assert reason(d, "blocked_network") == "not in a blocked network"

    await asyncio.to_thread(rig.redis.start)  # empty: no persistence
    second = await rig.redeem(await rig.link(address), ip)
    d2 = await rig.latest()
    assert d2["session_id"] == second["session"]["id"]
    assert (d2["inputs"]["ip_attempts"], d2["inputs"]["destination_attempts"]) == (1, 1)
    assert reason(d2, "ip_velocity") == f"1 attempt from {ip} in 10 min"
    assert reason(d2, "destination_velocity") == "1 attempt on this account in 10 min"
    assert (d2["score"], d2["decision"]) == (0, "allow")

    # Nothing else lost: both decisions, both sessions, and their events.
    listed = await rig.project.api.get("/v1/risk/decisions")
    assert [x["id"] for x in listed.body["data"]] == [d2["id"], d["id"]]
    attempts = await events(rig.db, rig.project.id, "auth.signin_attempt")
    assert [(e["metadata"]["outcome"], e["metadata"]["decision_id"]) for e in attempts] == [
        ("success", d["id"]), ("success", d2["id"])]
    evaluated = await events(rig.db, rig.project.id, "auth.risk_evaluated")
    assert [e["metadata"]["decision_id"] for e in evaluated] == [d["id"], d2["id"]]
    sessions = await rig.db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", first["user"]["id"])
    assert sessions == 2


async def test_a_known_bad_network_is_blocked_without_redis(rig: Rig) -> None:
    """The velocity signals cannot judge, the others still do: Redis away is no way around a
    block."""
    token = await rig.link(email())
    await asyncio.to_thread(rig.redis.stop)
    async with asyncio.timeout(5):
        r = await verify(rig.api, rig.project, token, headers=client("203.0.113.77"))
    assert r.status == 403, r.body
    assert r.body["error"]["code"] == "blocked_by_risk_policy"
    d = await decision(rig.project, r.body["error"]["details"]["decision_id"])
    assert (d["score"], d["decision"], fired(d)) == (100, "block", {"blocked_network"})
    assert reason(d, "ip_velocity") == OUT_OF_REACH
    await asyncio.to_thread(rig.redis.start)
