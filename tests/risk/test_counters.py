"""The risk engine's attempt counters (``AttemptCounters``) against the suite's real Redis: the
calls of concurrent sign-ins go out together and each is counted once, in order; a Redis that
lost the script still counts."""

from __future__ import annotations

import asyncio
import hashlib
import secrets

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from common.db import create_redis
from control_plane.risk.service import COUNT_ATTEMPTS, AttemptCounters
from tests.fixtures.redis import private_redis


def _args(cap: int = 100) -> list[int | str]:
    now = 1_800_000_000_000
    return [now, 600_000, f"{now}:{secrets.token_hex(4)}", cap]


async def test_concurrent_calls_are_each_counted_once_in_order(redis_url: str, redis_prefix: str) -> None:
    client = create_redis(redis_url)
    counters = AttemptCounters(client)
    key = f"{redis_prefix}test-counters:{secrets.token_hex(4)}"
    try:
        counts = await asyncio.gather(*(counters.count([key], _args()) for _ in range(40)))
        assert sorted(c for [c] in counts) == list(range(1, 41))
        assert await client.zcard(key) == 40
        assert 0 < await client.pttl(key) <= 600_000
    finally:
        await client.delete(key)
        await counters.close()
        await client.aclose()


async def test_a_window_keeps_at_most_its_cap(redis_url: str, redis_prefix: str) -> None:
    client = create_redis(redis_url)
    counters = AttemptCounters(client)
    key = f"{redis_prefix}test-counters:{secrets.token_hex(4)}"
    try:
        for _ in range(12):
            [count] = await counters.count([key], _args(cap=5))
        assert count == 5  # still over any limit below the cap, in bounded memory
        assert await client.zcard(key) == 5
    finally:
        await client.delete(key)
        await counters.close()
        await client.aclose()


async def test_a_redis_that_lost_the_script_still_counts() -> None:
    """After SCRIPT FLUSH (what a restart does to the script cache; on a Redis of the test's
    own) EVALSHA answers NOSCRIPT: the calls are sent again with the script itself. After a
    restart the first call already counts, on a new connection; while Redis is away a call
    fails (the sign-in goes on unscored for velocity), and the next one after it returns counts."""
    with private_redis() as server:
        client: Redis = create_redis(server.url)
        counters = AttemptCounters(client)
        try:
            assert await counters.count(["k"], _args()) == [1]
            await client.script_flush()
            counts = await asyncio.gather(*(counters.count(["k"], _args()) for _ in range(3)))
            assert sorted(c for [c] in counts) == [2, 3, 4]
            sha = hashlib.sha1(COUNT_ATTEMPTS.encode()).hexdigest()
            assert await client.script_exists(sha) == [True]  # EVAL cached it again
            server.restart()  # empty, no script: the old connection is gone too
            assert await counters.count(["k"], _args()) == [1]
            server.stop()
            with pytest.raises((RedisError, OSError)):
                await counters.count(["k"], _args())
            server.start()
            assert await counters.count(["k"], _args()) == [1]
        finally:
            await counters.close()
            await client.aclose()
