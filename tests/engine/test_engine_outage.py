"""The engine while PostgreSQL is away (issue 10, item 5), through HTTP.

The engine holds every tuple in memory, so a PostgreSQL outage must not stop checks: keys it
knows keep working, checks answer from memory and say so (``"stale": true``, ``X-Authio-Stale``),
``/readyz`` says ``stale`` (and stays 200), a key it has never seen is 503 (it cannot be told
valid or not, so never 401), a revocation heard on Redis still wins at once, and once PostgreSQL
is back the engine catches up and the marker goes away. The control plane and the engine run as two apps, as in
production, on a private PostgreSQL that the test stops and starts for real.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import ClientSession
from redis.asyncio import Redis

from common.auth import hash_secret, revocation_channel
from common.settings import Settings
from control_plane.app import create_control_plane_app
from control_plane.migrate import upgrade
from devtools import ensure_services, remove_private, stop_private
from engine.app import create_engine_app
from tests.fixtures.peers import StallingProxy
from tests.fixtures.pgproxy import through
from tests.fixtures.service import (
    Api,
    Response,
    assert_error,
    bootstrap_project,
    eventually,
    free_ports,
    serving,
)

TTL = 0.3  # the API-key cache lifetime of this test: an outage outlasts it many times over


def tk(obj: str) -> dict[str, str]:
    return {"object": obj, "relation": "viewer", "user": "user:ann"}


async def store_with_doc(api: Api) -> tuple[str, int]:
    """A new store holding ``doc:1#viewer@user:ann``: its id and the revision of that write."""
    store = (await api.post("/v1/stores", {"name": "s"})).body["id"]
    written = await api.post(f"/v1/stores/{store}/write", {"writes": [tk("doc:1")]})
    assert written.status == 200, written.body
    return str(store), int(written.body["revision"])


async def check(engine: Api, store: str, obj: str, key: str, at_least: int | None = None) -> Response:
    body: dict[str, Any] = {"tuple_key": tk(obj)}
    if at_least is not None:
        body["consistency"] = {"at_least_revision": at_least}
    return await engine.with_key(key).post(f"/v1/stores/{store}/check", body)


async def test_checks_outlive_a_postgres_outage(
    settings_factory: Callable[..., Settings], http: ClientSession, redis_url: str,
) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="authio-engine-outage-"))
    pg_port, redis_port = free_ports(2)

    def start() -> str:
        return ensure_services(run_dir=run_dir, database_url=None, redis_url=None,
                               force_private=True, private_pg_port=pg_port,
                               private_redis_port=redis_port, log=lambda _: None).database_url

    database_url = await asyncio.to_thread(start)
    redis = Redis.from_url(redis_url)
    try:
        await asyncio.to_thread(upgrade, database_url)
        settings = settings_factory(database_url=database_url, redis_url=redis_url,
                                    api_key_cache_seconds=TTL, engine_poll_seconds=0.2)
        async with serving(http, create_control_plane_app(settings)) as cp, \
                serving(http, create_engine_app(settings)) as engine:
            project = await bootstrap_project(cp, "engine-outage")
            store, revision = await store_with_doc(project.api)
            keys = {}
            for name in ("doomed", "unseen"):
                r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": name,
                                                            "scopes": ["authz:check"]})
                keys[name] = r.body["secret"]
            for key in (project.key, keys["doomed"]):  # the engine knows these two keys
                r = await check(engine, store, "doc:1", key, revision)
                assert (r.status, r.body["allowed"]) == (200, True), r.body
                assert_fresh(r)
            assert (await engine.get("/readyz")).body["status"] == "ready"

            await asyncio.to_thread(stop_private, run_dir, log=lambda _: None)

            # Known keys keep working, long past their cache lifetime, answered from memory at
            # the last revision, and every answer says so.
            until = time.monotonic() + 6 * TTL
            while time.monotonic() < until:
                r = await check(engine, store, "doc:1", project.key)
                assert (r.status, r.body.get("allowed")) == (200, True), r.body
                assert (r.body["revision"], r.body["stale"]) == (revision, True), r.body
                assert r.headers["X-Authio-Stale"] == "true"
                await asyncio.sleep(TTL / 3)
            batch = await engine.with_key(project.key).post(
                f"/v1/stores/{store}/batch-check", {"checks": [{"tuple_key": tk("doc:1")}]})
            assert (batch.status, batch.body["stale"]) == (200, True), batch.body
            assert batch.headers["X-Authio-Stale"] == "true"
            # Ready (taking every engine out would stop checks too), and saying it is stale.
            ready = await engine.get("/readyz")
            assert (ready.status, ready.body["status"]) == (200, "stale")
            # A key the engine never saw cannot be told valid or revoked: 503, not 401.
            r = await check(engine, store, "doc:1", keys["unseen"])
            assert_error(r, 503, "db_unavailable")
            assert r.headers["Retry-After"] == "1"
            # A revocation heard on Redis (as the control plane's announcer sends it) wins at
            # once, database or not.
            await redis.publish(revocation_channel(settings.redis_prefix),
                                hash_secret(keys["doomed"]))
            r = await eventually(lambda: _refused(engine, store, keys["doomed"]), within=5,
                                 what="the revoked key refused")
            assert r.status == 503, r.body

            await asyncio.to_thread(start)
            # The engine catches up: the marker goes away, and a write made after the outage is
            # visible at its revision.
            await eventually(lambda: _fresh(engine, store, project.key), within=20,
                             what="checks no longer stale")
            assert (await engine.get("/readyz")).body["status"] == "ready"
            after = await eventually(lambda: _written(project.api, store), within=20,
                                     what="a write after the outage")
            r = await check(engine, store, "doc:2", project.key, after.body["revision"])
            assert (r.status, r.body["allowed"]) == (200, True), r.body
            assert_fresh(r)
            r = await check(engine, store, "doc:1", keys["unseen"])
            assert r.status == 200, r.body
    finally:
        await redis.aclose()
        await asyncio.to_thread(remove_private, run_dir, log=lambda _: None)
        shutil.rmtree(run_dir, ignore_errors=True)


async def test_checks_and_answers_outlive_an_unresponsive_postgres(
    settings_factory: Callable[..., Settings], http: ClientSession, database_url: str,
) -> None:
    """PostgreSQL that answers nothing: stopped (SIGSTOP), or cut off by the network without a
    reset, held here by a proxy that stalls every byte both ways while connections stay open.
    Before: every request waited for asyncpg's 60 s command timeout and then answered 500, and
    the engine's key lookups waited as long, so checks stopped. Now a known key stands in after
    a short wait and checks go on, an unknown key is 503, and a control-plane call is 503
    ``db_unavailable`` with ``Retry-After`` once its statement's timeout runs out; when
    PostgreSQL answers again, so does everything, by itself."""
    upstream = urlsplit(database_url)
    async with StallingProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        settings = settings_factory(
            database_url=through(database_url, proxy.port), api_key_cache_seconds=TTL,
            pg_connect_timeout_seconds=1.0, pg_command_timeout_seconds=1.0)
        async with serving(http, create_control_plane_app(settings)) as cp, \
                serving(http, create_engine_app(settings)) as engine:
            project = await bootstrap_project(cp, "engine-unresponsive")
            store, revision = await store_with_doc(project.api)
            r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "unseen",
                                                        "scopes": ["authz:check"]})
            unseen = r.body["secret"]
            r = await check(engine, store, "doc:1", project.key, revision)
            assert (r.status, r.body["allowed"]) == (200, True), r.body

            proxy.stall()
            try:
                await asyncio.sleep(2 * TTL)  # the key's cache entry has expired
                for _ in range(3):
                    started = time.monotonic()
                    r = await check(engine, store, "doc:1", project.key)
                    assert (r.status, r.body.get("allowed")) == (200, True), r.body
                    assert time.monotonic() - started < 3
                started = time.monotonic()
                r = await check(engine, store, "doc:1", unseen)
                assert_error(r, 503, "db_unavailable")
                assert r.headers["Retry-After"] == "1"
                assert time.monotonic() - started < 3
                for call in (project.api.get(f"/v1/stores/{store}"),
                             project.api.post(f"/v1/stores/{store}/write",
                                              {"writes": [tk("doc:3")]})):
                    started = time.monotonic()
                    r = await call
                    assert_error(r, 503, "db_unavailable")
                    assert r.headers["Retry-After"] == "1"
                    assert time.monotonic() - started < 10
            finally:
                proxy.resume()

            await eventually(lambda: _fresh(engine, store, unseen), within=20,
                             what="a key the engine never saw accepted again")
            r = await project.api.get(f"/v1/stores/{store}")
            assert r.status == 200, r.body


def assert_fresh(r: Response) -> None:
    assert "stale" not in r.body and "X-Authio-Stale" not in r.headers, (r.headers, r.body)


async def _fresh(engine: Api, store: str, key: str) -> bool:
    r = await check(engine, store, "doc:1", key)
    return r.status == 200 and "stale" not in r.body


async def _refused(engine: Api, store: str, key: str) -> Response | None:
    r = await check(engine, store, "doc:1", key)
    return r if r.status != 200 else None


async def _written(api: Api, store: str) -> Response | None:
    r = await api.post(f"/v1/stores/{store}/write", {"writes": [tk("doc:2")]})
    return r if r.status == 200 else None
