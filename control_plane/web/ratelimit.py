"""Rate limits of public endpoints, counted in Redis so every process shares them.

Built on the ``limits`` library's moving-window strategy (exact over the window, no burst at
window edges) with its redis-py storage. A limit string is ``limits``' notation, several joined
by ``;`` (``"5/15minutes"``, ``"30/minute;300/hour"``). An exceeded limit raises RateLimited
(429) with ``Retry-After`` in whole seconds (RFC 9110 10.2.3) and ``details.retry_after``.

Limits fail closed: while Redis cannot be reached, a limited request is refused with 503
``service_unavailable`` and ``Retry-After`` rather than let through uncounted. What they guard
costs money or a victim's inbox when unguarded (sign-in links by SMS are billed per message and
are the target of SMS pumping; by email they can flood an address), and a sign-in that waits a
few seconds for Redis to return costs little. The client shares the app's Redis pool, whose
retries reconnect by themselves: the first request after Redis returns is served.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Sequence
from typing import Final

from limits import RateLimitItem, parse_many
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from common.errors import RateLimited, ServiceUnavailable

log = logging.getLogger("authio.ratelimit")

UNAVAILABLE_RETRY_SECONDS: Final = 5


class RateLimit:
    """One named limit (``scope``) of one or more rates, enforced per identifier."""

    def __init__(self, limiter: MovingWindowRateLimiter, scope: str, rates: str) -> None:
        self._limiter = limiter
        self.scope = scope
        self.items: Sequence[RateLimitItem] = parse_many(rates)

    async def hit(self, identifier: str) -> None:
        """Count one request for ``identifier``. Raises RateLimited when any rate is exceeded
        (the request is then not counted against the other rates), ServiceUnavailable when Redis
        cannot be reached (the limit fails closed)."""
        try:
            await self._hit(identifier)
        except (RedisError, OSError) as exc:
            log.warning("rate limit %s: Redis unreachable (%s: %s); refusing with 503",
                        self.scope, type(exc).__name__, exc)
            raise ServiceUnavailable(
                f"The {self.scope.replace('_', ' ')} limit cannot be checked right now; retry "
                f"in {UNAVAILABLE_RETRY_SECONDS} s.",
                details={"retry_after": UNAVAILABLE_RETRY_SECONDS},
                headers={"Retry-After": str(UNAVAILABLE_RETRY_SECONDS)},
            ) from None

    async def _hit(self, identifier: str) -> None:
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


def client_bucket(ip: str) -> str:
    """What a per-IP limit counts: the address, or for IPv6 its /64, which one subscriber
    usually holds whole (RFC 6177) and could otherwise rotate through."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)
