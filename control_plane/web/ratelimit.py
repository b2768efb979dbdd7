"""Rate limits of public endpoints, counted in Redis so every process shares them.

Built on the ``limits`` library's moving-window strategy (exact over the window, no burst at
window edges) with its redis-py storage. A limit string is ``limits``' notation, several joined
by ``;`` (``"5/15minutes"``, ``"30/minute;300/hour"``). An exceeded limit raises RateLimited
(429) with ``Retry-After`` in whole seconds (RFC 9110 10.2.3) and ``details.retry_after``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from limits import RateLimitItem, parse_many
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.asyncio import Redis

from common.errors import RateLimited


class RateLimit:
    """One named limit (``scope``) of one or more rates, enforced per identifier."""

    def __init__(self, limiter: MovingWindowRateLimiter, scope: str, rates: str) -> None:
        self._limiter = limiter
        self.scope = scope
        self.items: Sequence[RateLimitItem] = parse_many(rates)

    async def hit(self, identifier: str) -> None:
        """Count one request for ``identifier``. Raises RateLimited when any rate is exceeded
        (the request is then not counted against the other rates)."""
        for item in self.items:
            if not await self._limiter.hit(item, self.scope, identifier):
                stats = await self._limiter.get_window_stats(item, self.scope, identifier)
                retry_after = max(1, math.ceil(stats.reset_time - time.time()))
                raise RateLimited(
                    f"Too many requests for this {self.scope.replace('_', ' ')}; retry in "
                    f"{retry_after} s.",
                    details={"retry_after": retry_after, "limit": str(item)},
                    headers={"Retry-After": str(retry_after)},
                )


class RateLimits:
    """The limiter over the app's Redis client (its connection pool: nothing of its own to
    open or close); ``limit()`` makes named limits sharing it."""

    def __init__(self, redis: Redis, redis_url: str, key_prefix: str) -> None:
        self._storage = RedisStorage(
            "async+" + redis_url, implementation="redispy", key_prefix=key_prefix + "ratelimit",
            # limits types its options as scalars; the redis-py bridge hands them to Redis().
            connection_pool=redis.connection_pool,  # type: ignore[arg-type]
        )
        self._limiter = MovingWindowRateLimiter(self._storage)

    def limit(self, scope: str, rates: str) -> RateLimit:
        return RateLimit(self._limiter, scope, rates)
