"""The console tests' service: its own database (its outbox worker is then the only one that
delivers its messages), its own Redis prefix, mail over real SMTP, its base URL its own port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from aiohttp import ClientSession, web

from common.http import EnvelopeRunner
from common.settings import Settings
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.peers import SmtpSink, smtp_server
from tests.fixtures.service import Api, combined_app, free_ports, wait_ready
from tests.operators.helpers import ConsoleService


@pytest.fixture(scope="module")
def console_db(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "console") as url:
        yield url


@pytest_asyncio.fixture(scope="module")
async def console(console_db: str, settings_factory: Callable[..., Settings], redis_prefix: str,
                  http: ClientSession) -> AsyncIterator[ConsoleService]:
    sink = SmtpSink()
    async with smtp_server(sink) as smtp_port, database_pool(console_db) as pool:
        port = free_ports(1)[0]
        base = f"http://127.0.0.1:{port}"
        settings = settings_factory(
            database_url=console_db, redis_prefix=f"{redis_prefix}console:", base_url=base,
            port=port, email_sink="smtp", smtp_host="127.0.0.1", smtp_port=smtp_port,
            smtp_tls="none", smtp_from="authio console test <no-reply@authio.test>",
            outbox_poll_seconds=0.1)
        runner = EnvelopeRunner(combined_app(settings), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            api = Api(http, base)
            await wait_ready(api)
            yield ConsoleService(api, sink, pool)
        finally:
            await runner.cleanup()
