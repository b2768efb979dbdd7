"""Connections: the PostgreSQL pool (asyncpg; plain SQL, no ORM on hot paths), its parameter
allocator, what a lost connection looks like (:func:`is_connection_error`), a transaction that
tells a failed commit from one whose outcome is unknown (:func:`transaction`), and the Redis
client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import asyncpg
import orjson
from asyncpg import exceptions as pg
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` says PostgreSQL could not be reached or the connection to it was lost
    (the server is down, restarting, refusing connections or ended the session): what the
    envelope answers as 503 ``db_unavailable``, and never a fault of the request."""
    return isinstance(
        exc,
        ConnectionError
        | pg.PostgresConnectionError
        | pg.CannotConnectNowError
        | pg.TooManyConnectionsError
        | pg.ConnectionDoesNotExistError
        | DatabaseUnresponsive
        # AdminShutdownError, CrashShutdownError: in-flight queries when the server stops.
        | pg.OperatorInterventionError,
    ) or (isinstance(exc, pg.InterfaceError) and "connection is closed" in str(exc)) or (
        isinstance(exc, OSError) and exc.errno is not None
    )


class DatabaseUnresponsive(TimeoutError):
    """PostgreSQL did not answer in time: a connection was not accepted within the pool's
    connect timeout, or a statement got no answer within its command timeout (a server that is
    stopped, overloaded or cut off by the network without closing the socket). A lost connection
    for :func:`is_connection_error`: 503 ``db_unavailable``, never a 500 after a minute. A
    statement that timed out is cancelled by asyncpg, and its connection closed when the cancel
    cannot be delivered either."""


class CommitInDoubt(pg.ConnectionDoesNotExistError):  # type: ignore[misc]
    """The connection was lost while ``COMMIT`` was in flight: PostgreSQL may have committed the
    transaction or not, and only reading the database again can tell. Anything that does not
    resolve it sees a lost connection (503 ``db_unavailable``)."""


@contextlib.asynccontextmanager
async def transaction(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """``conn.transaction()``, except for what a lost connection means.

    Before ``COMMIT`` is sent, a lost connection is an error like any other: PostgreSQL rolls
    back the transaction of a session that ends, so nothing of it happened. While ``COMMIT`` is
    in flight it raises :class:`CommitInDoubt` instead (asyncpg's own ``__aexit__`` raises
    ``InterfaceError`` then, and a caller answering 503 would call a committed change a
    failure). The error that ended the block is never hidden by a rollback that cannot be sent.
    """
    tx = conn.transaction()
    await tx.start()
    try:
        yield
    except BaseException:
        # On a lost connection the rollback fails too (PostgreSQL rolls back by itself); the
        # block's own error is the one to raise.
        with contextlib.suppress(Exception):
            await tx.rollback()
        raise
    try:
        await tx.commit()
    except Exception as exc:
        if is_connection_error(exc):
            raise CommitInDoubt(f"the connection was lost while committing: {exc}") from exc
        raise


class PooledConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no stubs
    """A pool connection that ends itself when its protocol state is broken, released without
    asyncpg's reset query.

    **Broken protocol state.** When PostgreSQL ends a session (a fast or immediate shutdown,
    ``pg_terminate_backend``) it sends a FATAL error, then closes the socket. A FATAL that
    arrives while the connection runs no statement (idle in the pool, or between a request's
    last statement and its release) puts asyncpg's protocol in its error-consuming state, and the
    connection only counts as closed once the end of the stream is processed, on a later turn of
    the event loop. A request handed the connection in between failed at its first statement
    with ``InternalClientError: cannot switch to state 15; another operation (2) is in progress``
    (a 500). Nothing was sent to the server then: the statement was refused by the client. So an
    ``InternalClientError`` (asyncpg's protocol out of step with the server: the connection is
    unusable whatever caused it) ends the connection at once and is raised as
    ``ConnectionDoesNotExistError``, a lost connection (503 ``db_unavailable``); the pool opens a
    new connection on the next acquire.

    **No reset query** (``pg_advisory_unlock_all``, ``CLOSE ALL``, ``UNLISTEN *``, ``RESET
    ALL``): one round trip less per request, about a tenth of a sign-in's server time. Nothing
    leaves session state on a pooled connection: settings are ``SET LOCAL``, advisory locks
    ``pg_advisory_xact_lock``, cursors live inside transactions, ``LISTEN`` uses connections of
    its own. asyncpg still rolls back an open transaction and drops listeners on release. A reset
    query would not catch the broken state above (it arises mostly while the connection sits idle
    in the pool), and measured under restarts it turned some committed writes into 500s: the
    reset failed at release, after the commit."""

    def get_reset_query(self) -> str:
        return ""

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        # Statements without arguments (BEGIN, COMMIT, ROLLBACK) go through here alone.
        try:
            return await super().execute(*args, **kwargs)
        except (pg.InternalClientError, TimeoutError) as exc:
            raise self._meaning(exc) from exc

    async def _execute(self, *args: Any, **kwargs: Any) -> Any:
        # Every statement with arguments and every fetch goes through here (asyncpg 0.2x-0.3x).
        try:
            return await super()._execute(*args, **kwargs)
        except (pg.InternalClientError, TimeoutError) as exc:
            raise self._meaning(exc) from exc

    def _meaning(self, exc: Exception) -> Exception:
        """A broken protocol state ends the connection and is a lost connection; asyncpg's
        command timeout (a plain ``TimeoutError`` raised inside the statement call, so never a
        caller's own ``asyncio.timeout``) is DatabaseUnresponsive."""
        if isinstance(exc, DatabaseUnresponsive):
            return exc
        if isinstance(exc, TimeoutError):
            return DatabaseUnresponsive("PostgreSQL did not answer the statement in time")
        self.terminate()
        lost: Exception = pg.ConnectionDoesNotExistError(
            f"the connection to PostgreSQL is no longer usable ({exc}); it was closed")
        return lost


async def _connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect`` for the pool, its connect timeout raised as DatabaseUnresponsive."""
    try:
        return await asyncpg.connect(*args, **kwargs)
    except TimeoutError as exc:
        raise DatabaseUnresponsive(
            f"PostgreSQL did not accept a connection within {kwargs.get('timeout')} s") from exc


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=lambda v: orjson.dumps(v).decode(), decoder=orjson.loads,
        schema="pg_catalog",
    )


async def create_pool(dsn: str, *, max_size: int, min_size: int = 1,
                      connect_timeout: float = 5.0, command_timeout: float = 30.0) -> asyncpg.Pool:
    """A pool of :class:`PooledConnection` whose connections decode ``jsonb`` with orjson.

    ``connect_timeout`` bounds opening a connection and ``command_timeout`` every statement
    (seconds); either one running out raises :class:`DatabaseUnresponsive`. Raises OSError or
    asyncpg errors when PostgreSQL cannot be reached.
    """
    pool = await asyncpg.create_pool(
        dsn, min_size=min(min_size, max_size), max_size=max_size, init=_init_connection,
        connect=_connect, timeout=connect_timeout, command_timeout=command_timeout,
        connection_class=PooledConnection,
    )
    assert pool is not None
    return pool


@dataclass(frozen=True, slots=True)
class Statement:
    """SQL assembled once (a hot path's), and the names of its parameters (:class:`Params`, by
    name: bind them with ``statement.params.bind(values)``)."""

    sql: str
    params: Params


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

    def bind_from(self, values: Mapping[str, object]) -> list[object]:
        """The arguments of a named statement from ``values``, which may also hold names the
        statement does not use (values shared by statements that differ). Raises KeyError for a
        missing name."""
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


async def follow_channel(redis: Redis, channel: str, *, on_message: Callable[[str], None],
                         on_subscribed: Callable[[], Awaitable[None]],
                         on_reconnect: Callable[[Any], None], what: str,
                         logger: logging.Logger) -> None:
    """Run forever: call ``on_message`` with each message published on the Redis pub/sub
    ``channel`` (decoded to text). Every time a message may have been missed, the follower is
    told: ``on_subscribed`` after each subscription this loop makes (the first, and again after
    a failure, retried within 0.1 to 1 s), ``on_reconnect`` (sync; redis-py keeps it as a weak
    method, so its owner must live as long as the loop) after each reconnection redis-py makes
    by itself, which subscribes again without telling. ``what`` names the feed in the log."""
    failures = 0
    while True:
        try:
            async with redis.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                if pubsub.connection is not None:
                    pubsub.connection.register_connect_callback(on_reconnect)
                await on_subscribed()
                if failures:
                    logger.info("%s followed again", what)
                failures = 0
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        on_message(data.decode() if isinstance(data, bytes) else str(data))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            if failures == 1:
                logger.warning("%s lost (%s: %s); retrying every 1 s or less", what,
                               type(exc).__name__, exc)
            await asyncio.sleep(min(1.0, 0.1 * 2 ** (failures - 1)))


_LISTEN_CHECK_SECONDS: Final = 10.0
_RECONNECT_MAX_SECONDS: Final = 30.0


def reconnect_delay(failures: int) -> float:
    """The wait after the ``failures``-th consecutive failure to reach the database: 0.5 s
    doubling per failure, at most 30 s."""
    return min(_RECONNECT_MAX_SECONDS, 0.5 * 2.0 ** min(max(failures - 1, 0), 10))


class Outage:
    """The consecutive failures of one worker loop to reach the database, waited out with
    :func:`reconnect_delay` backoff and said once each way::

        outage = Outage("webhook fan-out", log)
        while True:
            try:
                rows = await pool.fetch(...)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await outage.failed(exc)  # logs, then sleeps
                continue
            outage.over()
    """

    __slots__ = ("failures", "logger", "what")

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what, self.logger, self.failures = what, logger, 0

    async def failed(self, exc: BaseException) -> None:
        """Count a failure, log it with the wait before the next try, and wait."""
        self.failures += 1
        delay = reconnect_delay(self.failures)
        self.logger.warning("%s failed (%s: %s); retrying in %.1f s", self.what,
                            type(exc).__name__, exc, delay)
        await asyncio.sleep(delay)

    def over(self) -> None:
        """A try succeeded: the next failure starts the backoff afresh."""
        if self.failures:
            self.logger.info("%s works again", self.what)
            self.failures = 0


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """How a :func:`claim_forever` loop paces itself: at most ``batch`` rows a claim and
    ``in_flight`` handled at once; with nothing to claim it waits for a wake-up or
    ``poll_seconds``."""

    batch: int
    in_flight: int
    poll_seconds: float


async def claim_forever(
    claim: Callable[[int], Awaitable[Sequence[T]]],
    handle: Callable[[T], Coroutine[Any, Any, None]], *, limits: ClaimLimits,
    wake: asyncio.Event, what: str, logger: logging.Logger, name: Callable[[T], str],
    listen: tuple[str, str, str] | None = None,
) -> None:
    """A worker that claims due rows under a lease and handles each in a task of its own, until
    cancelled (the outbox's and the webhook deliveries' loop).

    ``claim(n)`` claims at most ``n`` rows (a lease and an attempt counted in its statement);
    each row goes to ``handle`` in a task named ``name(row)``, at most ``limits.in_flight`` at
    once. After a full batch it claims again at once (more may be due); otherwise it waits for
    ``wake`` (set by ``NOTIFY`` on the ``listen`` connection, ``(dsn, channel,
    application_name)``, by whoever queued rows in this process, and when a task ends) or
    ``limits.poll_seconds``. A failed claim is waited out (:class:`Outage`, logged as ``what``).
    Cancelling abandons the tasks in flight: their leases run out and a claim takes them again
    (at least once)."""
    in_flight: set[asyncio.Task[None]] = set()

    def done(task: asyncio.Task[None]) -> None:
        in_flight.discard(task)
        wake.set()

    listener = None if listen is None else asyncio.create_task(listen_forever(
        listen[0], listen[1], wake, application_name=listen[2], logger=logger),
        name=listen[2])
    outage = Outage(what, logger)
    try:
        while True:
            wake.clear()  # before claiming: a wake-up during the claim ends the next wait
            free = limits.in_flight - len(in_flight)
            more = False
            if free > 0:
                want = min(free, limits.batch)
                try:
                    rows = await claim(want)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await outage.failed(exc)
                    continue
                outage.over()
                for row in rows:
                    task = asyncio.create_task(handle(row), name=name(row))
                    in_flight.add(task)
                    task.add_done_callback(done)
                more = len(rows) == want
            if more and len(in_flight) < limits.in_flight:
                continue  # a full batch: more may be due right now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limits.poll_seconds):
                    await wake.wait()
    finally:
        tasks = [*([listener] if listener is not None else []), *in_flight]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
