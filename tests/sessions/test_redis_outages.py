"""Revocations and sign-in links with Redis stopped, restarted empty, and back (issue 10, 1 and 2).

Each test runs the service on a database and a ``redis-server`` of its own (so no other app's
announcer or outbox reaches them), stops and restarts that Redis, and watches what verifiers
would see: the revocation set and the API-key revocations.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession
from redis.asyncio import Redis

from common import revocations
from common.auth import hash_secret
from common.db import create_redis
from common.settings import Settings
from control_plane.app import create_control_plane_app
from engine.app import create_engine_app
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.identity import email, send_link, session_call, sign_in
from tests.fixtures.peers import StallingProxy
from tests.fixtures.redis import PrivateRedis, private_redis
from tests.fixtures.service import Api, Project, assert_error, bootstrap_project, combined_app, eventually, serving

PREFIX = "outage:"


@pytest.fixture(scope="module")
def outage_db(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "redis_outage") as url:
        yield url


@dataclass
class Rig:
    api: Api
    project: Project
    redis: PrivateRedis
    client: Redis
    db: asyncpg.Pool

    async def in_set(self, *session_ids: str) -> bool:
        key = revocations.set_key(PREFIX)
        return all([await self.client.zscore(key, s) is not None for s in session_ids])


@pytest_asyncio.fixture
async def rig(outage_db: str, settings_factory: Callable[..., Settings],
              http: ClientSession) -> AsyncIterator[Rig]:
    with private_redis() as redis:
        settings = settings_factory(database_url=outage_db, redis_url=redis.url,
                                    redis_prefix=PREFIX)
        client = create_redis(redis.url)  # retries, as the service's own client does
        async with serving(http, combined_app(settings)) as api, database_pool(outage_db) as db:
            project = await bootstrap_project(api)
            yield Rig(api, project, redis, client, db)
        await client.aclose()


async def test_every_revocation_after_a_restart_reaches_the_set(rig: Rig) -> None:
    """Before: after each Redis restart every other revocation was lost (the first command on
    each pooled connection failed, unretried), and the set came back empty for good."""
    signed = [await sign_in(rig.project, email(), api=rig.api) for _ in range(6)]
    first = await session_call(rig.api, "POST", "/v1/sessions/revoke", signed[0].access_token)
    assert first.status == 200, first.body
    await eventually(lambda: rig.in_set(signed[0].session_id), what="the first revocation")

    await asyncio.to_thread(rig.redis.restart)  # no persistence: it comes back empty
    for s in signed[1:]:
        r = await session_call(rig.api, "POST", "/v1/sessions/revoke", s.access_token)
        assert r.status == 200, r.body
    # The five made after the restart, and the one made before it (the set is rebuilt).
    await eventually(lambda: rig.in_set(*(s.session_id for s in signed)), within=15,
                     what="every revocation in the set")
    assert await rig.client.exists(revocations.announced_key(PREFIX))


async def test_revocations_while_redis_is_down_are_announced_when_it_returns(rig: Rig) -> None:
    kept, revoked, deleted = [await sign_in(rig.project, email(), api=rig.api) for _ in range(3)]
    doomed_key = await rig.project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "d",
                                                             "scopes": []})
    assert doomed_key.status == 201, doomed_key.body
    await asyncio.to_thread(rig.redis.stop)

    async with asyncio.timeout(5):  # none of them waits for Redis
        answers = await asyncio.gather(
            session_call(rig.api, "POST", "/v1/sessions/revoke", revoked.access_token),
            rig.project.api.delete(f"/v1/users/{deleted.user_id}"),
            rig.project.api.delete(f"/v1/api-keys/{doomed_key.body['id']}"),
        )
    assert [a.status for a in answers] == [200, 200, 200], [a.body for a in answers]
    # The control plane refuses the ended session at once: PostgreSQL is the source of truth.
    gone = await session_call(rig.api, "GET", "/v1/sessions/me", revoked.access_token)
    assert_error(gone, 401, "no_session")
    assert (await session_call(rig.api, "GET", "/v1/sessions/me", kept.access_token)).status == 200

    await asyncio.to_thread(rig.redis.start)
    await eventually(lambda: rig.in_set(revoked.session_id, deleted.session_id), within=15,
                     what="the revocations made while Redis was down")

    async def key_announced() -> bool:
        return bool(await rig.db.fetchval(
            "SELECT announced_at IS NOT NULL FROM revocations WHERE kind = 'api_key' "
            "AND subject = $1", hash_secret(doomed_key.body["secret"])))

    await eventually(key_announced, within=15, what="the API-key revocation announced")
    assert not await rig.in_set(kept.session_id)


async def test_sign_in_links_fail_closed_while_redis_is_down_and_recover(rig: Rig) -> None:
    """Before: 500 while Redis was down, and on the first sends after it returned. The send is
    rate limited in Redis, and the limit fails closed: 503 with Retry-After."""
    await asyncio.to_thread(rig.redis.stop)
    r = await send_link(rig.api, rig.project, email())
    assert_error(r, 503, "service_unavailable")
    assert r.headers["Retry-After"] == str(r.body["error"]["details"]["retry_after"])

    await asyncio.to_thread(rig.redis.start)
    assert (await send_link(rig.api, rig.project, email())).status == 200  # the very next one
    await asyncio.to_thread(rig.redis.restart)
    assert (await send_link(rig.api, rig.project, email())).status == 200  # and after a restart


async def test_a_redis_rolled_back_to_an_older_snapshot_gets_the_set_rebuilt(rig: Rig) -> None:
    """Redis may come back with the marker but without the latest members (an older RDB
    snapshot, the last second of an AOF, a lagging replica promoted): the marker's high-water
    mark is then behind PostgreSQL's, and the set is rebuilt."""
    early, late = [await sign_in(rig.project, email(), api=rig.api) for _ in range(2)]
    assert (await session_call(rig.api, "POST", "/v1/sessions/revoke", early.access_token)).status == 200
    await eventually(lambda: rig.in_set(early.session_id), what="the first revocation")
    set_key, marker = revocations.set_key(PREFIX), revocations.announced_key(PREFIX)
    snapshot = {k: await rig.client.dump(k) for k in (set_key, marker)}
    assert (await session_call(rig.api, "POST", "/v1/sessions/revoke", late.access_token)).status == 200
    await eventually(lambda: rig.in_set(late.session_id), what="the second revocation")

    for key, dumped in snapshot.items():  # back to the snapshot taken between the two
        await rig.client.restore(key, 0, dumped, replace=True)
    assert not await rig.in_set(late.session_id)
    await eventually(lambda: rig.in_set(early.session_id, late.session_id), within=15,
                     what="the set rebuilt")


async def test_a_rebuild_publishes_every_member_again(rig: Rig) -> None:
    """A verifier that mirrors the set and re-read it before the rebuild hears of each member."""
    s = await sign_in(rig.project, email(), api=rig.api)
    assert (await session_call(rig.api, "POST", "/v1/sessions/revoke", s.access_token)).status == 200
    await eventually(lambda: rig.in_set(s.session_id), what="the revocation")
    async with rig.client.pubsub() as pubsub:
        await pubsub.subscribe(revocations.channel(PREFIX))
        await rig.client.flushall()
        heard: list[bytes] = []

        async def republished() -> bool:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                heard.append(message["data"].split(b" ")[0])
            return s.session_id.encode() in heard

        await eventually(republished, within=15, what="the member published again")
    assert await rig.in_set(s.session_id)


async def test_the_announcer_holds_no_connection_while_redis_stalls(
        outage_db: str, settings_factory: Callable[..., Settings], http: ClientSession) -> None:
    """With a pool of one connection, a revocation whose announcement waits on a stalled Redis
    must not keep the database from the requests (before: the announcer held its connection and
    row locks in a transaction for as long as the Redis pipeline waited). Redis stalls from the
    pipeline on, after the row was claimed."""
    with private_redis() as redis:
        async with StallingProxy("127.0.0.1", redis.port) as proxy:
            settings = settings_factory(database_url=outage_db, redis_prefix=PREFIX,
                                        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
                                        pg_pool_max=1)
            async with serving(http, combined_app(settings)) as api:
                project = await bootstrap_project(api, "stalled-announcer")
                s = await sign_in(project, email(), api=api)
                proxy.stall_on(b"MULTI")  # the announcer's pipeline, after it claimed the row
                r = await session_call(api, "POST", "/v1/sessions/revoke", s.access_token)
                assert r.status == 200, r.body
                await asyncio.sleep(0.5)  # the announcer is now waiting on Redis
                for _ in range(3):
                    async with asyncio.timeout(2):
                        assert (await project.api.get("/v1/users")).status == 200
                    await asyncio.sleep(0.5)
                proxy.resume()


@dataclass
class Split:
    """A control plane and an engine apart (as deployed), with API-key caches of 30 s: only the
    revocation channel can make the engine refuse a revoked key within a test's seconds."""

    redis: PrivateRedis
    project: Project
    engine: Api
    store: str

    async def cached_key(self) -> tuple[str, str]:
        """A new key (id, secret) the engine has just accepted, hence caches."""
        made = await self.project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "k",
                                                            "scopes": ["authz:check"]})
        assert made.status == 201, made.body
        assert (await _check(self.engine, self.store, made.body["secret"])).status == 200
        return made.body["id"], made.body["secret"]

    async def revoke(self, key_id: str) -> None:
        revoked = await self.project.api.delete(f"/v1/api-keys/{key_id}")
        assert revoked.status == 200, revoked.body

    async def refused_soon(self, secret: str) -> None:
        await eventually(functools.partial(_refused, self.engine, self.store, secret), within=5,
                         what="the revoked key refused by the engine")


@pytest_asyncio.fixture
async def split(outage_db: str, settings_factory: Callable[..., Settings],
                http: ClientSession) -> AsyncIterator[Split]:
    with private_redis() as redis:
        settings = settings_factory(database_url=outage_db, redis_url=redis.url,
                                    redis_prefix=PREFIX, api_key_cache_seconds=30.0)
        async with serving(http, create_control_plane_app(settings)) as cp, \
                serving(http, create_engine_app(settings)) as engine:
            project = await bootstrap_project(cp, "split")
            store = (await project.api.post("/v1/stores", {"name": "s"})).body["id"]
            yield Split(redis, project, engine, store)


async def test_an_api_key_revoked_right_after_a_restart_is_refused_by_the_engine(
        split: Split) -> None:
    """Before: a key revoked after a Redis restart stayed accepted by the engine until its
    cache entry expired (here 30 s)."""
    for settle_seconds in (0.0, 2.0):  # right after the restart, and once it has settled
        key_id, secret = await split.cached_key()
        await asyncio.to_thread(split.redis.restart)
        await asyncio.sleep(settle_seconds)
        await split.revoke(key_id)
        await split.refused_soon(secret)


async def test_an_api_key_revoked_while_redis_is_down_is_refused_by_the_engine(
        split: Split) -> None:
    """The engine's subscription is away as long as Redis is, and comes back on its own timing:
    whether the announcement comes before or after it, the engine refuses the key once Redis
    is back (its cache is cleared on every resubscription)."""
    for down_seconds in (0.5, 3.0):
        key_id, secret = await split.cached_key()
        await asyncio.to_thread(split.redis.stop)
        await split.revoke(key_id)
        await asyncio.sleep(down_seconds)
        await asyncio.to_thread(split.redis.start)
        await split.refused_soon(secret)


async def _refused(engine: Api, store: str, key: str) -> bool:
    return (await _check(engine, store, key)).status == 401


async def _check(engine: Api, store: str, key: str) -> Any:
    return await engine.with_key(key).post(f"/v1/stores/{store}/check", {
        "tuple_key": {"object": "doc:1", "relation": "viewer", "user": "user:ann"}})
