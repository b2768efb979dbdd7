"""The API-key cache never outlives a revocation: a lookup that was in flight when the key was
revoked and invalidated must not put the key back in the cache (review finding: it did, keeping a
revoked key working for TTL + reply delay).

While PostgreSQL is away, known keys stand in for it (issue 10, item 5); the rules of that are
pinned here with a pool whose answers the test decides (tests/engine/test_engine_outage.py runs
the real outage)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from common.auth import ApiKeyAuthenticator, hash_secret
from common.db import DatabaseUnresponsive
from common.errors import InvalidApiKey
from tests.fixtures.service import Project


async def test_lookup_in_flight_during_revocation_is_not_cached(
    project: Project, database_url: str, new_project: Callable[[str], Awaitable[Project]],
) -> None:
    # One connection whose lookup statement is already prepared, so the lookup under test is a
    # single round trip that leaves before the loop is blocked.
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    assert pool is not None
    other = await new_project("warm-up")
    await ApiKeyAuthenticator(pool, ttl_seconds=600).authenticate(f"Bearer {other.key}")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=600)
    header = f"Bearer {project.key}"

    def revoke_in_another_thread() -> None:
        async def revoke() -> None:
            conn = await asyncpg.connect(database_url)
            try:
                await conn.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1",
                                   project.key_id)
            finally:
                await conn.close()
        asyncio.run(revoke())

    lookup = asyncio.create_task(auth.authenticate(header))
    for _ in range(5):  # let the lookup send its query
        await asyncio.sleep(0)
    # Block this event loop: PostgreSQL answers the lookup (key still valid), the reply waits in
    # the socket, then the key is revoked and the revocation message is handled.
    time.sleep(0.1)  # noqa: ASYNC251 - blocking the loop is the point
    worker = threading.Thread(target=revoke_in_another_thread)
    worker.start()
    worker.join()
    auth.invalidate(hash_secret(project.key))

    # The lookup began before the revocation and PostgreSQL answered it then: the old answer.
    assert (await lookup).key_id == project.key_id
    # ...but that answer must not be cached past the invalidation.
    with pytest.raises(InvalidApiKey):
        await auth.authenticate(header)
    await pool.close()


async def test_unknown_keys_do_not_evict_known_ones(project: Project, db: asyncpg.Pool) -> None:
    auth = ApiKeyAuthenticator(db, ttl_seconds=600, unknown_maxsize=3)
    principal = await auth.authenticate(f"Bearer {project.key}")
    for i in range(10):
        with pytest.raises(InvalidApiKey):
            await auth.authenticate(f"Bearer sk_live_{'x' * 40}{i:03d}")
    # The same object: served from the cache, which the flood of unknown keys did not empty.
    assert await auth.authenticate(f"Bearer {project.key}") is principal


class FlakyPool:
    """Answers the key lookup like PostgreSQL would, or fails like an unreachable one."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.down = False
        self.hang: asyncio.Event | None = None
        self.calls = 0

    async def fetchrow(self, sql: str, digest: str) -> dict[str, Any] | None:
        self.calls += 1
        if self.hang is not None:
            await self.hang.wait()
        if self.down:
            raise ConnectionRefusedError(111, "Connect call failed")
        return self.rows.get(digest)

    def add(self, secret: str, key_id: str) -> None:
        self.rows[hash_secret(secret)] = {"id": key_id, "project_id": "proj_x", "tenant_id": "ten_x",
                                          "scopes": [], "prefix": "sk_live_", "project_name": "p"}


KEY, OTHER = "sk_live_" + "a" * 43, "sk_live_" + "b" * 43


async def test_known_keys_stand_in_while_postgres_is_away() -> None:
    pool = FlakyPool()
    pool.add(KEY, "key_a")
    pool.add(OTHER, "key_b")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=0.05)  # type: ignore[arg-type]
    assert (await auth.authenticate(f"Bearer {KEY}")).key_id == "key_a"
    pool.down = True
    await asyncio.sleep(0.06)
    assert (await auth.authenticate(f"Bearer {KEY}")).key_id == "key_a"
    assert auth.outage
    with pytest.raises(ConnectionRefusedError):  # never seen: neither valid nor invalid
        await auth.authenticate(f"Bearer {OTHER}")
    # Once the outage is known, no request waits on PostgreSQL: a hung lookup runs behind.
    pool.hang = asyncio.Event()
    await asyncio.sleep(0.06)
    async with asyncio.timeout(0.5):
        assert (await auth.authenticate(f"Bearer {KEY}")).key_id == "key_a"
    # A revocation heard on Redis wins at once.
    auth.invalidate(hash_secret(KEY))
    pool.hang.set()
    with pytest.raises(ConnectionRefusedError):
        await auth.authenticate(f"Bearer {KEY}")


async def test_a_revocation_seen_when_postgres_is_back_wins() -> None:
    pool = FlakyPool()
    pool.add(KEY, "key_a")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=0.05)  # type: ignore[arg-type]
    await auth.authenticate(f"Bearer {KEY}")
    pool.down = True
    await asyncio.sleep(0.06)
    await auth.authenticate(f"Bearer {KEY}")  # stands in
    pool.down, pool.rows = False, {}  # back, and the key was revoked meanwhile
    await asyncio.sleep(0.06)
    for _ in range(3):  # the first may still be answered from memory while the lookup runs
        try:
            await auth.authenticate(f"Bearer {KEY}")
        except InvalidApiKey:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("a key revoked in PostgreSQL was still accepted once it answered")
    assert not auth.outage
    with pytest.raises(InvalidApiKey):
        await auth.authenticate(f"Bearer {KEY}")


async def test_only_keys_known_shortly_before_the_outage_stand_in() -> None:
    pool = FlakyPool()
    pool.add(KEY, "key_a")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=0.05, stale_grace_seconds=0.1)  # type: ignore[arg-type]
    await auth.authenticate(f"Bearer {KEY}")
    await asyncio.sleep(0.2)  # unused for longer than the grace: it may have been revoked since
    pool.down = True
    with pytest.raises(ConnectionRefusedError):
        await auth.authenticate(f"Bearer {KEY}")


async def test_a_resubscription_looks_keys_up_again_but_keeps_them_as_stand_ins() -> None:
    """``clear()`` runs when the revocation feed reconnects (it may have missed messages). Before:
    it forgot every key, so a feed reconnecting during a PostgreSQL outage turned every check
    into a 503. Now every key is looked up afresh, and known ones still stand in."""
    pool = FlakyPool()
    pool.add(KEY, "key_a")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=600)  # type: ignore[arg-type]
    await auth.authenticate(f"Bearer {KEY}")
    auth.clear()
    await auth.authenticate(f"Bearer {KEY}")
    assert pool.calls == 2  # looked up again at once, long before the TTL
    pool.down = True
    auth.clear()
    assert (await auth.authenticate(f"Bearer {KEY}")).key_id == "key_a"
    assert auth.outage and pool.calls == 3


async def test_a_lookup_without_an_answer_is_waited_for_briefly() -> None:
    """A stopped or cut-off PostgreSQL answers nothing (tests/engine/test_engine_outage.py runs
    one for real): a request waits ``lookup_wait_seconds`` for the lookup, then a known key
    stands in and an unknown one is DatabaseUnresponsive (503); the query goes on, and its late
    answer is taken."""
    pool = FlakyPool()
    pool.add(KEY, "key_a")
    pool.add(OTHER, "key_b")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=0.05, lookup_wait_seconds=0.1)  # type: ignore[arg-type]
    await auth.authenticate(f"Bearer {KEY}")
    pool.hang = asyncio.Event()
    await asyncio.sleep(0.06)
    async with asyncio.timeout(0.5):
        assert (await auth.authenticate(f"Bearer {KEY}")).key_id == "key_a"
        with pytest.raises(DatabaseUnresponsive):
            await auth.authenticate(f"Bearer {OTHER}")
    assert auth.outage
    pool.hang.set()  # PostgreSQL answers at last
    await asyncio.sleep(0.01)
    assert not auth.outage
    assert (await auth.authenticate(f"Bearer {OTHER}")).key_id == "key_b"


async def test_a_known_key_is_hashed_once_not_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check path's cost (issue 12): a key answered from the cache is not hashed again; a
    revocation still wins at once, and made-up keys are not remembered."""
    import common.auth

    hashed: list[str] = []

    def counting(secret: str) -> str:
        hashed.append(secret)
        return hash_secret(secret)

    monkeypatch.setattr(common.auth, "hash_secret", counting)
    pool = FlakyPool()
    pool.add(KEY, "key_a")
    auth = ApiKeyAuthenticator(pool, ttl_seconds=60)  # type: ignore[arg-type]
    for _ in range(5):
        assert (await auth.authenticate(f"Bearer {KEY}")).key_id == "key_a"
    assert hashed.count(KEY) == 2  # the first lookup, and the first hit that remembers it
    auth.invalidate(hash_secret(KEY))
    pool.rows = {}
    with pytest.raises(InvalidApiKey):
        await auth.authenticate(f"Bearer {KEY}")
    for _ in range(3):
        with pytest.raises(InvalidApiKey):
            await auth.authenticate(f"Bearer {OTHER}")
    assert hashed.count(OTHER) == 3
