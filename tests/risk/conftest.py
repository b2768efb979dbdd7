"""The risk tests' service: both apps on a database of their own, with the test GeoIP database,
loopback as a trusted proxy (``X-Forwarded-For`` names the client), a known-bad network and
small velocity limits (tests/risk/helpers.py); a fresh project per test.

The database is the risk tests' own (``risk_database_url``; ``db`` reads it here), because every
running app's outbox worker delivers from the one outbox and each app's development mailbox
lists only what its own worker delivered: on the suite's database, the session's ``service``
and this one would take each other's links. An app a test starts besides ``risk_service`` runs
on this database too (``risk_settings_factory``) and reads the mailbox with ``also``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.geo import write_city_database
from tests.fixtures.service import Api, Project, bootstrap_project, combined_app, serving
from tests.risk.helpers import RISK_SETTINGS


@pytest.fixture(scope="session")
def geoip_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_city_database(tmp_path_factory.mktemp("geoip") / "city.mmdb")


@pytest.fixture(scope="session")
def risk_database_url(database_url: str) -> Iterator[str]:
    """A database of the risk tests' own, on the suite's server, dropped after the run."""
    with migrated_database(database_url, "risk") as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def db(risk_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Direct access to the risk tests' database (this directory's ``db``)."""
    async with database_pool(risk_database_url) as pool:
        yield pool


@pytest.fixture(scope="session")
def risk_settings_factory(settings_factory: Callable[..., Settings],
                          risk_database_url: str) -> Callable[..., Settings]:
    """``settings_factory`` on the risk tests' database."""
    def make(**overrides: Any) -> Settings:
        return settings_factory(**{"database_url": risk_database_url, **overrides})
    return make


@pytest_asyncio.fixture(scope="session")
async def risk_service(risk_settings_factory: Callable[..., Settings], http: ClientSession,
                       geoip_database: Path) -> AsyncIterator[Api]:
    settings = risk_settings_factory(geoip_database=str(geoip_database), **RISK_SETTINGS)
    async with serving(http, combined_app(settings)) as api:
        yield api


@pytest_asyncio.fixture
async def risk_project(risk_service: Api) -> Project:
    """A fresh project of the risk service, with a full-access key."""
    return await bootstrap_project(risk_service, "risk")
