"""The console tests' service: its own database (its outbox worker is then the only one that
delivers its messages), its own Redis prefix, mail over real SMTP, its base URL its own port on
``localhost`` (the operator project's passkey relying party is that host)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.peers import SmtpSink, smtp_server
from tests.fixtures.service import serving_public
from tests.operators.helpers import ConsoleService


@pytest.fixture(scope="module")
def console_db(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "console") as url:
        yield url


@pytest_asyncio.fixture(scope="module")
async def console(console_db: str, settings_factory: Callable[..., Settings], redis_prefix: str,
                  http: ClientSession) -> AsyncIterator[ConsoleService]:
    sink = SmtpSink()
    async with smtp_server(sink) as smtp_port, database_pool(console_db) as pool, \
            serving_public(
                http, settings_factory, host="localhost", database_url=console_db,
                redis_prefix=f"{redis_prefix}console:", email_sink="smtp",
                smtp_host="127.0.0.1", smtp_port=smtp_port, smtp_tls="none",
                smtp_from="authio console test <no-reply@authio.test>",
                outbox_poll_seconds=0.1) as api:
        yield ConsoleService(api, sink, pool)
