"""PostgreSQL pool setup (asyncpg; plain SQL, no ORM on hot paths)."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg
import orjson


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
