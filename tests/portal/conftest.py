"""The portal tests' service: both apps on a loopback port whose ``SERVICE_BASE_URL`` is that
port (so the links it makes open it, in a browser too), asking a local dnslib DNS server for
TXT records (``SERVICE_DNS_RESOLVER``); a fresh project per test. It runs on a database of its
own (this directory's ``db``): its outbox worker would otherwise deliver the shared service's
messages into its own dev mailbox for the rest of the session, where the tests that read the
shared one's never see them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.dns import Zone, dns_server
from tests.fixtures.service import Api, Project, bootstrap_project, serving_public


@pytest.fixture(scope="session")
def zone() -> Zone:
    """The records the portal tests' DNS server answers (each test publishes its own names)."""
    return Zone()


@pytest.fixture(scope="session")
def dns_address(zone: Zone) -> Iterator[str]:
    with dns_server(zone) as address:
        yield address


@pytest.fixture(scope="session")
def portal_database_url(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "portal") as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def db(portal_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Direct access to the portal tests' database (this directory's ``db``)."""
    async with database_pool(portal_database_url) as pool:
        yield pool


@pytest_asyncio.fixture(scope="session")
async def portal_service(settings_factory: Callable[..., Settings], http: ClientSession,
                         dns_address: str, portal_database_url: str) -> AsyncIterator[Api]:
    async with serving_public(http, settings_factory, dns_resolver=dns_address,
                              database_url=portal_database_url) as api:
        yield api


@pytest_asyncio.fixture
async def portal_project(portal_service: Api) -> Project:
    """A fresh project of the portal service, with a full-access key."""
    return await bootstrap_project(portal_service, "portal")
