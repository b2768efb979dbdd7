"""The suite's root: the fixture plugins, and the stall reporter every test runs under.

Tests run against real PostgreSQL and Redis, one fresh database and Redis key prefix per run
(``make test`` finds or starts the servers through ``devtools``). The fixtures live in
``tests/fixtures/`` as pytest plugins: ``database``, ``redis``, ``service`` (the apps, a client,
a project per test), ``peers`` (a browser, mail and SMS providers, a telemetry collector, the
development mailbox) and ``proxies`` (nginx and Caddy in front of the engine). Test modules
import helpers from there, or from their domain folder's helper module, never from this file or
from another test module.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

# Plain asserts in the helper modules report their operands too (plugins get this on their own).
pytest.register_assert_rewrite("tests.fixtures.identity", "tests.organizations.helpers",
                               "tests.engine.reference", "tests.edge.helpers")

pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.redis",
    "tests.fixtures.service",
    "tests.fixtures.peers",
    "tests.fixtures.proxies",
]

STALL_SECONDS = 120.0


@pytest_asyncio.fixture(autouse=True)
async def report_stalls(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """If a test runs past ``STALL_SECONDS``, print every asyncio task's stack to standard error
    (thread dumps show only the event loop's select; run pytest with ``-s`` to see it at once).
    This is how a stopping app that awaited a worker which had swallowed its cancellation was
    found (asyncio.wait_for in Python 3.11; see tests/messages/test_outbox.py)."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        print(f"\n--- {request.node.nodeid} has run {STALL_SECONDS:.0f} s; asyncio tasks:",
              file=sys.stderr)
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=sys.stderr)

    handle = loop.call_later(STALL_SECONDS, dump)
    yield
    handle.cancel()
