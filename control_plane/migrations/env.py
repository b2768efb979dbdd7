"""Alembic environment: runs migrations over SQLAlchemy's asyncpg driver.

The URL comes from the ``sqlalchemy.url`` option set by ``control_plane.migrate``, and the
connections from ``asyncpg.connect`` of the service's own ``DATABASE_URL`` (``attributes["dsn"]``)
so that its TLS parameters (``sslmode``, ``sslrootcert``, ...) hold here too. Migrations are
plain SQL (``op.execute``); there are no ORM models. Concurrent runs on one database are
serialized by a session advisory lock (:data:`MIGRATION_LOCK`).
"""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import async_engine_from_config

config = context.config


MIGRATION_LOCK = 0x617574680069  # "auth\0i": pg_advisory_lock's key, this database's migrator


def _run(connection: Connection) -> None:
    # One migrator at a time per database (a Kubernetes Job retried while its first pod still
    # runs, two operators, a rollout's hook racing a manual run): a session lock held until the
    # connection closes, taken before alembic reads the current revision, so the second waits and
    # then finds nothing left to apply instead of failing on a table the first just created.
    connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
    connection.commit()
    context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    dsn = config.attributes.get("dsn")  # control_plane.migrate: asyncpg reads the URL whole
    creator = {"async_creator": lambda: asyncpg.connect(dsn)} if dsn else {}
    engine = async_engine_from_config(
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
        poolclass=pool.NullPool, **creator,
    )
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
