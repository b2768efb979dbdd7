"""PostgreSQL going away: writes answer db_unavailable (503) in the envelope, checks keep
answering from the engine's memory, and everything recovers when PostgreSQL is back.

Runs against a private PostgreSQL of its own (started with devtools on free ports),
which the test stops and starts for real; no fault is simulated.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from aiohttp import ClientSession

from common.settings import Settings
from control_plane.migrate import upgrade
from devtools import ensure_services, remove_private, stop_private
from tests.fixtures.service import assert_error, bootstrap_project, combined_app, free_ports, serving


async def test_outage_is_db_unavailable_and_recovers(
    settings_factory: Callable[..., Settings], http: ClientSession, redis_url: str,
) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="authio-outage-"))
    pg_port, redis_port = free_ports(2)

    def start() -> str:
        urls = ensure_services(run_dir=run_dir, database_url=None, redis_url=None, force_private=True,
                               private_pg_port=pg_port, private_redis_port=redis_port,
                               log=lambda _: None)
        return urls.database_url

    database_url = await asyncio.to_thread(start)
    try:
        await asyncio.to_thread(upgrade, database_url)
        # A long key cache, so the engine can keep authenticating from memory during the outage.
        settings = settings_factory(database_url=database_url, redis_url=redis_url,
                                    api_key_cache_seconds=600, pg_pool_max=2)
        async with serving(http, combined_app(settings)) as service:
            project = await bootstrap_project(service, "outage")
            store = (await project.api.post("/v1/stores", {"name": "s"})).body["id"]
            tuple_key = {"object": "doc:1", "relation": "viewer", "user": "user:ann"}
            written = await project.api.post(f"/v1/stores/{store}/write", {"writes": [tuple_key]})
            check = {"tuple_key": tuple_key, "consistency": {"at_least_revision": written.body["revision"]}}
            assert (await project.api.post(f"/v1/stores/{store}/check", check)).body["allowed"] is True

            await asyncio.to_thread(stop_private, run_dir, log=lambda _: None)

            r = await project.api.post("/v1/stores", {"name": "during outage"})
            assert_error(r, 503, "db_unavailable")
            assert r.headers["Retry-After"] == "1"
            r = await project.api.post(f"/v1/stores/{store}/write",
                                       {"writes": [{**tuple_key, "object": "doc:2"}]})
            assert_error(r, 503, "db_unavailable")
            # The engine answers from memory: checks are unaffected by the outage.
            r = await project.api.post(f"/v1/stores/{store}/check", {"tuple_key": tuple_key})
            assert (r.status, r.body["allowed"]) == (200, True)

            await asyncio.to_thread(start)
            for _ in range(100):  # the pool replaces its dead connections on the next acquire
                r = await project.api.post("/v1/stores", {"name": "after outage"})
                if r.status == 201:
                    break
                await asyncio.sleep(0.1)
            assert r.status == 201, r.body
    finally:
        await asyncio.to_thread(remove_private, run_dir, log=lambda _: None)
        shutil.rmtree(run_dir, ignore_errors=True)
