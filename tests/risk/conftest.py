"""The risk tests' service: both apps with the test GeoIP database, loopback as a trusted proxy
(``X-Forwarded-For`` names the client), a known-bad network and small velocity limits
(tests/risk/helpers.py); a fresh project per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.geo import write_city_database
from tests.fixtures.service import Api, Project, bootstrap_project, combined_app, serving
from tests.risk.helpers import RISK_SETTINGS


@pytest.fixture(scope="session")
def geoip_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_city_database(tmp_path_factory.mktemp("geoip") / "city.mmdb")


@pytest_asyncio.fixture(scope="session")
async def risk_service(settings_factory: Callable[..., Settings], http: ClientSession,
                       geoip_database: Path) -> AsyncIterator[Api]:
    settings = settings_factory(geoip_database=str(geoip_database), **RISK_SETTINGS)
    async with serving(http, combined_app(settings)) as api:
        yield api


@pytest_asyncio.fixture
async def risk_project(risk_service: Api) -> Project:
    """A fresh project of the risk service, with a full-access key."""
    return await bootstrap_project(risk_service, "risk")
