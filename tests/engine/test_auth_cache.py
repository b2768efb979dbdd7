"""The API-key cache never outlives a revocation: a lookup that was in flight when the key was
revoked and invalidated must not put the key back in the cache (review finding: it did, keeping a
revoked key working for TTL + reply delay)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from common.auth import ApiKeyAuthenticator, hash_secret
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
