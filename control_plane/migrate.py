"""Schema migrations with alembic; ``authio migrate`` and the test session call ``upgrade``."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

_HERE = Path(__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    """An alembic Config for ``database_url`` (``postgresql://`` is mapped to asyncpg).

    The connections are opened by asyncpg from ``database_url`` itself (``attributes["dsn"]``,
    read by ``migrations/env.py``), as the service's pool opens them: libpq's parameters in its
    query (``sslmode=verify-full``, ``sslrootcert``, ``sslcert``, ``sslkey``, ...) mean the same
    to ``authio migrate`` as to ``authio serve``. SQLAlchemy's asyncpg dialect would hand them to
    ``asyncpg.connect`` as keyword arguments it does not take (``sslmode``), so the URL it is
    given serves only to choose the dialect."""
    url = database_url.replace("postgres://", "postgresql://", 1)
    url = url.replace("postgresql://", "postgresql+asyncpg://", 1)
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.partition("?")[0].replace("%", "%%"))
    cfg.attributes["dsn"] = database_url
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply every pending migration up to ``revision``. Blocking; run it outside an event loop."""
    command.upgrade(alembic_config(database_url), revision)


def run_sql(script: str) -> None:
    """Run a multi-statement SQL script inside a migration.

    asyncpg prepares every statement it is given through SQLAlchemy, and PostgreSQL refuses to
    prepare several commands at once; the driver connection's ``execute`` without arguments uses
    the simple query protocol, which takes a whole script. Runs in the migration's transaction.
    """
    from alembic import op
    from sqlalchemy.util import await_only

    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    await_only(driver.execute(script))
