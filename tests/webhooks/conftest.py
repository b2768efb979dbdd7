"""The webhook tests' service: both apps on a database of their own (every running app's workers
fan out and deliver from the one database: on the suite's, the session's ``service``, which
refuses loopback receivers, would take these tests' deliveries), receivers allowed on loopback
over http, and a short retry schedule (``helpers.SETTINGS``); a fresh project per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.service import Api, Project, bootstrap_project, combined_app, serving
from tests.webhooks.helpers import SETTINGS


@pytest.fixture(scope="session")
def webhooks_database_url(database_url: str) -> Iterator[str]:
    """A database of the webhook tests' own, on the suite's server, dropped after the run."""
    with migrated_database(database_url, "webhooks") as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def db(webhooks_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Direct access to the webhook tests' database (this directory's ``db``)."""
    async with database_pool(webhooks_database_url) as pool:
        yield pool


@pytest.fixture(scope="session")
def webhooks_settings(settings_factory: Callable[..., Settings],
                      webhooks_database_url: str) -> Callable[..., Settings]:
    """``settings_factory`` on the webhook tests' database, with ``helpers.SETTINGS``."""
    def make(**overrides: Any) -> Settings:
        return settings_factory(**{"database_url": webhooks_database_url, **SETTINGS, **overrides})
    return make


@pytest_asyncio.fixture(scope="session")
async def webhooks_service(webhooks_settings: Callable[..., Settings],
                           http: ClientSession) -> AsyncIterator[Api]:
    async with serving(http, combined_app(webhooks_settings())) as api:
        yield api


@pytest_asyncio.fixture
async def hooks_project(webhooks_service: Api) -> Project:
    """A fresh project of the webhook service, with a full-access key."""
    return await bootstrap_project(webhooks_service, "hooks")
