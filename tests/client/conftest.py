"""The Python client's tests (``clients/python``, the ``authio-client`` distribution): the whole
service on a loopback port whose ``SERVICE_BASE_URL`` is that port (so the tokens' ``iss`` is
the URL the client is given), on a database of its own (its outbox worker delivers only its own
sign-in links and webhook deliveries, to loopback receivers: ``WEBHOOK_SETTINGS``), and a
fresh project per test. The clients talk to it over HTTP; an httpx event
hook records every request they send (:class:`Sent`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession
from authio_client import AsyncAuthioClient

from common.settings import Settings
from tests.client.helpers import Sent, async_client
from tests.fixtures.database import migrated_database
from tests.fixtures.service import Api, Project, bootstrap_project, serving_public

WEBHOOK_SETTINGS: dict[str, Any] = {"webhook_allow_private_urls": True,
                                    "webhook_retry_schedule": "0.3,0.3,0.3",
                                    "webhook_timeout_seconds": 2.0}
"""Webhook receivers on loopback over http (the client's webhook tests' own, on this service's
database, which no other service's workers deliver from) and a short retry schedule."""


@pytest.fixture(scope="session")
def client_database_url(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "client") as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def client_service(settings_factory: Callable[..., Settings], http: ClientSession,
                         client_database_url: str) -> AsyncIterator[Api]:
    async with serving_public(http, settings_factory, database_url=client_database_url,
                              **WEBHOOK_SETTINGS) as api:
        yield api


@pytest_asyncio.fixture
async def project(client_service: Api) -> Project:
    """A fresh project of the client tests' service, with a full-access key."""
    return await bootstrap_project(client_service, "client")


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest_asyncio.fixture
async def authio(project: Project, sent: Sent) -> AsyncIterator[AsyncAuthioClient]:
    """An async client of ``project`` (full-access key), recording into ``sent``."""
    client = async_client(project.api.base_url, project.key, sent)
    yield client
    await client.aclose()
