"""The suite's root: the fixture plugins, the stall reporter every test runs under, and the lines
that say how far collection got.

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
import threading
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.fixtures.installs import tell

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
COLLECTION_HEARTBEAT_S = 15.0


class _CollectionProgress:
    """Says on the terminal when collection starts, where it is every
    ``COLLECTION_HEARTBEAT_S`` while it lasts, and when it ends. Collecting the whole suite
    takes about a minute, most of it schemathesis building the cases of
    ``tests/test_openapi_fuzz.py`` from the OpenAPI document, and ``pytest -q`` prints nothing
    meanwhile: a fresh machine's first run looked hung."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.module = ""
        self.done = threading.Event()
        tell("tests: collecting the tests (about a minute for the whole suite)")
        threading.Thread(target=self.beat, name="collection progress", daemon=True).start()

    def beat(self) -> None:
        while not self.done.wait(COLLECTION_HEARTBEAT_S):
            tell(f"tests: still collecting, at {self.module} ({time.monotonic() - self.began:.0f} s)")

    def finish(self, count: int) -> None:
        self.done.set()
        tell(f"tests: {count} test{'' if count == 1 else 's'} collected in "
             f"{time.monotonic() - self.began:.0f} s, running them")


_progress: _CollectionProgress | None = None


def pytest_collection(session: pytest.Session) -> None:
    global _progress
    _progress = _CollectionProgress()


def pytest_collectstart(collector: pytest.Collector) -> None:
    if _progress is not None and isinstance(collector, pytest.Module):
        _progress.module = collector.nodeid


def pytest_collection_finish(session: pytest.Session) -> None:
    if _progress is not None:
        _progress.finish(len(session.items))


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
