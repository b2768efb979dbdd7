"""Connections: the PostgreSQL pool (asyncpg; plain SQL, no ORM on hot paths), its parameter
allocator, and the Redis client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Final

import asyncpg
import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class PooledConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no stubs
    """A pool connection released without asyncpg's reset query (``pg_advisory_unlock_all``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``): one round trip less per request, about a tenth
    of a sign-in's server time. Nothing leaves session state on a pooled connection: settings are
    ``SET LOCAL``, advisory locks ``pg_advisory_xact_lock``, cursors live inside transactions,
    ``LISTEN`` uses connections of its own. asyncpg still rolls back an open transaction and
    drops listeners on release."""

    def get_reset_query(self) -> str:
        return ""


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=lambda v: orjson.dumps(v).decode(), decoder=orjson.loads,
        schema="pg_catalog",
    )


async def create_pool(dsn: str, *, max_size: int, min_size: int = 1) -> asyncpg.Pool:
    """A pool whose connections decode ``jsonb`` with orjson.

    Raises OSError or asyncpg errors when PostgreSQL cannot be reached.
    """
    pool = await asyncpg.create_pool(
        dsn, min_size=min(min_size, max_size), max_size=max_size, init=_init_connection,
        command_timeout=60, connection_class=PooledConnection,
    )
    assert pool is not None
    return pool


class Params:
    """The ``$n`` placeholders of one SQL statement, allocated in order: no hand numbering, so a
    new value never shifts the numbers after it.

    Two ways to use it, one per statement:

    * by value, for SQL built per request: ``p(value)`` appends ``value`` and returns its ``$n``;
      pass ``p.values`` as the arguments.
    * by name, for SQL built once and run many times: ``p["name"]`` returns the ``$n`` of
      ``name`` (the same one each time it is asked); at run time ``p.bind({name: value, ...})``
      gives the arguments in order (raises KeyError when a name is missing or unknown).
    """

    __slots__ = ("_names", "values")

    def __init__(self) -> None:
        self.values: list[object] = []
        self._names: dict[str, int] = {}

    def __call__(self, value: object) -> str:
        if self._names:
            raise TypeError("this statement's parameters are named")
        self.values.append(value)
        return f"${len(self.values)}"

    def __getitem__(self, name: str) -> str:
        if self.values:
            raise TypeError("this statement's parameters are values")
        n = self._names.setdefault(name, len(self._names) + 1)
        return f"${n}"

    def copy(self) -> Params:
        """Another allocator holding the same values so far: the shared start of statements
        that go on differently."""
        other = Params()
        other.values = list(self.values)
        other._names = dict(self._names)
        return other

    def bind(self, values: Mapping[str, object]) -> list[object]:
        """The arguments of a named statement, in ``$n`` order. Raises KeyError for a missing
        or an unknown name."""
        unknown = values.keys() - self._names.keys()
        if unknown:
            raise KeyError(f"unknown parameters {sorted(unknown)}")
        return [values[name] for name in self._names]


async def delete_in_batches(pool: asyncpg.Pool, sql: str, *, batch: int = 5000) -> int:
    """Run ``sql`` (a DELETE of at most ``$1`` rows) until a batch comes back short, so no pass
    holds long locks; returns how many rows it deleted in all."""
    total = 0
    while True:
        status = await pool.execute(sql, batch)
        n = int(status.rsplit(" ", 1)[-1])
        total += n
        if n < batch:
            return total


REDIS_RETRIES: Final = 3


def create_redis(url: str) -> Redis:
    """The service's Redis client over its own connection pool.

    A command that meets a connection Redis has dropped (Redis restarted, a failover, an idle
    timeout) is retried on a new connection, up to ``REDIS_RETRIES`` times with jittered
    exponential backoff (redis-py's ``retry_on_error``; without it redis-py 8 still fails the
    first command on every pooled connection after a restart). Idle connections are checked
    every 30 s before use, and no socket wait lasts more than 5 s.
    """
    return Redis.from_url(
        url, retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), REDIS_RETRIES),
        retry_on_error=[RedisConnectionError, RedisTimeoutError], health_check_interval=30,
        socket_timeout=5, socket_connect_timeout=5,
    )


_LISTEN_CHECK_SECONDS: Final = 10.0
_RECONNECT_MAX_SECONDS: Final = 30.0


def reconnect_delay(failures: int) -> float:
    """The wait after the ``failures``-th consecutive failure to reach the database: 0.5 s
    doubling per failure, at most 30 s."""
    return min(_RECONNECT_MAX_SECONDS, 0.5 * 2.0 ** min(max(failures - 1, 0), 10))


async def listen_forever(dsn: str, channel: str, wake: asyncio.Event, *, application_name: str,
                         logger: logging.Logger) -> None:
    """Keep a connection of its own (``application_name``) listening on ``channel`` until
    cancelled, setting ``wake`` on every notification, and on every (re)connection too, since
    notifications sent while nobody listened are gone. A lost or silent connection (checked
    every 10 s: a network partition never closes the socket) is reopened with
    ``reconnect_delay`` backoff; whoever waits on ``wake`` should also poll meanwhile."""
    failures = 0
    while True:
        try:
            await _listen_once(dsn, channel, wake, application_name=application_name,
                               logger=logger, reconnected=failures > 0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            delay = reconnect_delay(failures)
            logger.warning("lost the %s listener (%s: %s); reconnecting in %.1f s (polling "
                           "meanwhile)", channel, type(exc).__name__, exc, delay)
            await asyncio.sleep(delay)
        else:
            failures = 1


async def _listen_once(dsn: str, channel: str, wake: asyncio.Event, *, application_name: str,
                       logger: logging.Logger, reconnected: bool) -> None:
    """One listening connection, until it is lost (returns) or cannot be opened (raises)."""
    conn = await asyncpg.connect(dsn, timeout=10,
                                 server_settings={"application_name": application_name})
    try:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(channel, lambda *_: wake.set())
        if reconnected:
            logger.info("listening on %s again", channel)
        wake.set()
        while not lost.is_set() and not conn.is_closed():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_LISTEN_CHECK_SECONDS):
                    await lost.wait()
            if not lost.is_set() and not conn.is_closed():
                await conn.fetchval("SELECT 1", timeout=_LISTEN_CHECK_SECONDS)
        logger.warning("lost the %s listener; reconnecting", channel)
    finally:
        if not conn.is_closed():
            conn.terminate()
