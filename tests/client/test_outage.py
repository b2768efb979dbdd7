"""PostgreSQL away while the client calls: the service answers 503 ``db_unavailable`` with
``Retry-After``, and the client waits as told and tries again until it comes back, so the
application sees only a slower success. PostgreSQL is reached through a proxy
(``tests.fixtures.pgproxy``) that cuts every connection and refuses new ones, as an unreachable
server does; the server itself is never stopped."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

import pytest
from aiohttp import ClientSession
from authio_client import RetryPolicy
from authio_client.errors import DbUnavailable

from common.settings import Settings
from tests.client.helpers import Sent, async_client, sync_client
from tests.fixtures.pgproxy import pg_proxy
from tests.fixtures.service import bootstrap_project, serving_public

DOWN_SECONDS = 2.5


async def test_a_postgres_outage_is_503_then_success_through_the_retry(
    settings_factory: Callable[..., Settings], http: ClientSession, client_database_url: str,
) -> None:
    async with pg_proxy(client_database_url) as proxy:
        async with serving_public(http, settings_factory, database_url=proxy.url(client_database_url),
                                  pg_connect_timeout_seconds=1.0, pg_command_timeout_seconds=2.0) as api:
            project = await bootstrap_project(api, "client-outage")
            sent = Sent()
            client = async_client(api.base_url, project.key, sent,
                                  retry=RetryPolicy(attempts=10, total_seconds=30.0))
            store = await client.create_store("outage")
            sent.clear()

            proxy.go_down()
            asyncio.get_running_loop().call_later(DOWN_SECONDS, proxy.go_up)
            started = time.monotonic()
            address = f"outage-{secrets.token_hex(4)}@example.com"
            user, written = await asyncio.gather(
                client.create_user(address),
                client.write_tuples(store.id, writes=[("doc:1", "viewer", "user:anne")]))
            took = time.monotonic() - started

            assert (user.created, user.email) == (True, address)
            assert (written.written, written.revision.value) == (1, 1)
            for path in ("/v1/users", f"/v1/stores/{store.id}/write"):
                statuses = [s for p, s in sent.statuses if p == path]
                assert statuses[0] == 503 and statuses[-1] in (200, 201), (path, statuses)
                assert set(statuses[:-1]) == {503}, statuses
            # Retry-After: 1 was honoured: the retries were not a busy loop.
            assert len(sent.statuses) <= 2 * (DOWN_SECONDS + 2)
            assert DOWN_SECONDS <= took < DOWN_SECONDS + 5
            # The write went in once, under the key it was first sent with.
            keys = {h["idempotency-key"] for (_, p), h in zip(sent.requests, sent.headers, strict=True)
                    if p.endswith("/write")}
            assert keys == {written.idempotency_key}
            assert (await client.get_store(store.id)).revision == 1

            # A bound that runs out first gives the 503 to the caller.
            proxy.go_down()
            try:
                def give_up() -> float:
                    start = time.monotonic()
                    with sync_client(api.base_url, project.key, Sent(),
                                     retry=RetryPolicy(attempts=3, total_seconds=10.0)) as c:
                        with pytest.raises(DbUnavailable) as err:
                            c.get_store(store.id)
                        assert (err.value.status, err.value.retry_after) == (503, 1.0)
                    return time.monotonic() - start
                assert 2.0 <= await asyncio.to_thread(give_up) < 8.0  # 3 tries, 1 s apart
            finally:
                proxy.go_up()
            await client.aclose()
