"""The portal tests' service: both apps on a loopback port whose ``SERVICE_BASE_URL`` is that
port (so the links it makes open it, in a browser too), asking a local dnslib DNS server for
TXT records (``SERVICE_DNS_RESOLVER``); a fresh project per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from aiohttp import ClientSession, web

from common.http import EnvelopeRunner
from common.settings import Settings
from tests.fixtures.dns import Zone, dns_server
from tests.fixtures.service import Api, Project, bootstrap_project, combined_app, free_ports, wait_ready


@pytest.fixture(scope="session")
def zone() -> Zone:
    """The records the portal tests' DNS server answers (each test publishes its own names)."""
    return Zone()


@pytest.fixture(scope="session")
def dns_address(zone: Zone) -> Iterator[str]:
    with dns_server(zone) as address:
        yield address


@pytest_asyncio.fixture(scope="session")
async def portal_service(settings_factory: Callable[..., Settings], http: ClientSession,
                         dns_address: str) -> AsyncIterator[Api]:
    port = free_ports(1)[0]
    base = f"http://127.0.0.1:{port}"
    settings = settings_factory(base_url=base, port=port, dns_resolver=dns_address)
    runner = EnvelopeRunner(combined_app(settings), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        api = Api(http, base)
        await wait_ready(api)
        yield api
    finally:
        await runner.cleanup()


@pytest_asyncio.fixture
async def portal_project(portal_service: Api) -> Project:
    """A fresh project of the portal service, with a full-access key."""
    return await bootstrap_project(portal_service, "portal")
