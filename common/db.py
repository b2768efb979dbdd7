"""PostgreSQL pool setup (asyncpg; plain SQL, no ORM on hot paths), what a lost connection
looks like (:func:`is_connection_error`), and a transaction that tells a failed commit from one
whose outcome is unknown (:func:`transaction`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import orjson
from asyncpg import exceptions as pg


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
        # AdminShutdownError, CrashShutdownError: in-flight queries when the server stops.
        | pg.OperatorInterventionError,
    ) or (isinstance(exc, pg.InterfaceError) and "connection is closed" in str(exc)) or (
        isinstance(exc, OSError) and exc.errno is not None
    )


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
        except pg.InternalClientError as exc:
            raise self._lost(exc) from exc

    async def _execute(self, *args: Any, **kwargs: Any) -> Any:
        # Every statement with arguments and every fetch goes through here (asyncpg 0.2x-0.3x).
        try:
            return await super()._execute(*args, **kwargs)
        except pg.InternalClientError as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: pg.InternalClientError) -> pg.ConnectionDoesNotExistError:
        self.terminate()
        return pg.ConnectionDoesNotExistError(
            f"the connection to PostgreSQL is no longer usable ({exc}); it was closed")


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
