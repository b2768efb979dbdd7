"""The TLS tests' services run on a database of their own: the shared in-process service's outbox
worker would otherwise deliver their messages (a magic link the test waits for) into its own
development mailbox, and theirs the shared service's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.database import migrated_database


@pytest.fixture(scope="session")
def tls_database_url(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "tls") as url:
        yield url
