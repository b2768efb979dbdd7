"""The compliance tests' service: both apps on a database of their own (a deletion's proof walks
every table, and webhook deliveries to loopback receivers need a service that allows them:
``webhook_allow_private_urls``), deliveries retried only after a long while (so they stay
pending), and a fresh project per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.service import Api, Project, bootstrap_project, combined_app, serving


@pytest.fixture(scope="session")
def compliance_database_url(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "compliance") as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def cdb(compliance_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Direct access to the compliance tests' database."""
    async with database_pool(compliance_database_url) as pool:
        yield pool


@pytest.fixture(scope="session")
def compliance_settings(settings_factory: Callable[..., Settings],
                        compliance_database_url: str) -> Settings:
    return settings_factory(database_url=compliance_database_url, webhook_allow_private_urls=True,
                            webhook_retry_schedule="600", webhook_timeout_seconds=2.0)


@pytest_asyncio.fixture(scope="session")
async def compliance_service(compliance_settings: Settings,
                             http: ClientSession) -> AsyncIterator[Api]:
    async with serving(http, combined_app(compliance_settings)) as api:
        yield api


@pytest_asyncio.fixture
async def cproject(compliance_service: Api) -> Project:
    """A fresh project of the compliance service, with a full-access key."""
    return await bootstrap_project(compliance_service, "compliance")
