"""The engine against a real PostgreSQL: the store registry (snapshot, LISTEN, catch-up after a
lost listener, poll fallback, load on demand, ``wait_for``) and the check endpoints of the engine
app alone (shapes, errors, consistency, depth cap, batch items).

Rows are written straight into a throwaway database the way the control plane writes them (the
store row locked, its revision bumped, ``tuple_changes`` rows, ``pg_notify`` in the same
transaction), so these tests pin the engine's half of that contract without the control plane.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession, web

from common import changes
from common.auth import hash_secret
from common.errors import NotReady
from common.http import EnvelopeRunner
from common.settings import load_settings
from engine.app import create_engine_app
from engine.appkeys import STORES
from engine.graph import check
from engine.registry import LoadedStore, StoreRegistry
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.pgproxy import pg_proxy

PROJECT = "proj_engine_registry_tests"
OTHER_PROJECT = "proj_engine_registry_other"

Tuple = tuple[str, str, str]


@pytest.fixture(scope="module")
def eng_db(database_url: str) -> Iterator[str]:
    """A throwaway migrated database with two projects, dropped at the end of the module."""

    async def seed(url: str) -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                """INSERT INTO tenants (id, name) VALUES ('ten_engine_tests', 't');
                   INSERT INTO projects (id, tenant_id, name, environment) VALUES
                     ('proj_engine_registry_tests', 'ten_engine_tests', 'p', 'test'),
                     ('proj_engine_registry_other', 'ten_engine_tests', 'q', 'test');"""
            )
        finally:
            await conn.close()

    with migrated_database(database_url, "eng") as url:
        asyncio.run(seed(url))
        yield url


@pytest_asyncio.fixture(scope="module")
async def pool(eng_db: str) -> AsyncIterator[asyncpg.Pool]:
    async with database_pool(eng_db, max_size=6) as p:
        yield p


Factory = Callable[..., Awaitable[StoreRegistry]]


@pytest_asyncio.fixture
async def make_registry(eng_db: str, pool: asyncpg.Pool) -> AsyncIterator[Factory]:
    """Start registries (poll effectively off unless asked) and close them after the test."""
    started: list[StoreRegistry] = []

    async def make(poll_seconds: float = 3600.0) -> StoreRegistry:
        registry = StoreRegistry(pool=pool, dsn=eng_db, poll_seconds=poll_seconds)
        started.append(registry)
        registry.start()
        assert await registry.wait_ready(30), "registry never became ready"
        return registry

    yield make
    for registry in started:
        await registry.close()


# -- writing like the control plane ------------------------------------------------------------


async def create_store(pool: asyncpg.Pool, *, project: str = PROJECT, notify: bool = True,
                       tuples: list[Tuple] | None = None) -> str:
    """A store at revision 0 (or 1 with ``tuples``, written as one change)."""
    store_id = f"store_{secrets.token_hex(13)}"
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO stores (id, project_id, name) VALUES ($1, $2, 'n')",
                           store_id, project)
        if notify:
            await conn.execute("SELECT pg_notify($1, $2)", changes.CHANNEL,
                               changes.payload(store_id, 0))
    if tuples:
        await write(pool, store_id, writes=tuples, notify=notify)
    return store_id


async def write(pool: asyncpg.Pool, store_id: str, *, writes: list[Tuple] | None = None,
                deletes: list[Tuple] | None = None, notify: bool = True) -> int:
    """One effective write: new revision, tuples, tuple_changes (deletes first), pg_notify."""
    async with pool.acquire() as conn, conn.transaction():
        current = await conn.fetchval("SELECT revision FROM stores WHERE id = $1 FOR UPDATE",
                                      store_id)
        revision = current + 1
        seq = 0
        for o, r, u in deletes or ():
            await conn.execute("DELETE FROM tuples WHERE store_id = $1 AND object = $2 AND "
                               "relation = $3 AND subject = $4", store_id, o, r, u)
            seq += 1
            await conn.execute("INSERT INTO tuple_changes VALUES ($1, $2, $3, 'delete', $4, $5, $6)",
                               store_id, revision, seq, o, r, u)
        for o, r, u in writes or ():
            await conn.execute("INSERT INTO tuples (store_id, object, relation, subject, revision) "
                               "VALUES ($1, $2, $3, $4, $5)", store_id, o, r, u, revision)
            seq += 1
            await conn.execute("INSERT INTO tuple_changes VALUES ($1, $2, $3, 'write', $4, $5, $6)",
                               store_id, revision, seq, o, r, u)
        await conn.execute("UPDATE stores SET revision = $2 WHERE id = $1", store_id, revision)
        if notify:
            await conn.execute("SELECT pg_notify($1, $2)", changes.CHANNEL,
                               changes.payload(store_id, revision))
    return int(revision)


def allowed(store: LoadedStore, o: str, r: str, u: str) -> bool:
    return check(store.graph, object=o, relation=r, user=u).allowed


async def until(predicate: Callable[[], bool], within: float) -> float:
    """Seconds until ``predicate()`` holds; AssertionError after ``within`` seconds."""
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > within:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(0.001)
    return time.perf_counter() - start


# -- tests -------------------------------------------------------------------------------------


def test_change_notification_contract() -> None:
    assert changes.CHANNEL == "authio_tuple_changes"
    assert changes.payload("store_abc", 12) == "store_abc:12"
    assert changes.payload("store_abc", 0) == "store_abc:0"
    for store_id, revision in (("store_abc", 12), ("store_abc", 0), ("a:b", 3)):
        assert changes.parse(changes.payload(store_id, revision)) == (store_id, revision)
    assert changes.parse("a:b:3") == ("a:b", 3)
    for bad in ("", "store_abc", ":3", "store_abc:", "store_abc:x", "store_abc:-1",
                "store_abc:+1", "store_abc: 1", "store_abc:1_0", "store_abc:\u0661"):
        assert changes.parse(bad) is None, bad
    with pytest.raises(ValueError):
        changes.payload("store_abc", -1)


async def test_snapshot_load(pool: asyncpg.Pool, make_registry: Factory) -> None:
    doc = await create_store(pool, tuples=[("doc:1", "viewer", "group:eng#member"),
                                           ("group:eng", "member", "user:ann")])
    await write(pool, doc, writes=[("doc:2", "viewer", "user:bob")],
                deletes=[("group:eng", "member", "user:ann")])
    empty = await create_store(pool)
    # Values PostgreSQL's text COPY escapes: backslash, tab, newline, carriage return.
    odd = ("doc:a\\b\tc", "rel\nx", "user:\r\\n")
    weird = await create_store(pool, tuples=[odd, ("doc:é", "viewer", "user:ü")])

    registry = await make_registry()
    store = await registry.get(doc)
    assert store is not None and store.revision == 2 and store.project_id == PROJECT
    assert len(store.graph) == 2
    assert allowed(store, "doc:2", "viewer", "user:bob")
    assert not allowed(store, "doc:1", "viewer", "user:ann")
    e = await registry.get(empty)
    assert e is not None and e.revision == 0 and len(e.graph) == 0
    w = await registry.get(weird)
    assert w is not None and allowed(w, *odd) and allowed(w, "doc:é", "viewer", "user:ü")


async def test_follows_notifications(pool: asyncpg.Pool,
                                                  make_registry: Factory) -> None:
    store_id = await create_store(pool)
    registry = await make_registry()  # polls every hour: only LISTEN can bring changes in 1 s
    store = await registry.get(store_id)
    assert store is not None
    latencies = []
    for i in range(20):
        revision = await write(pool, store_id, writes=[(f"doc:{i}", "viewer", "user:ann")])
        # Measured from the commit (write returned) to the change being visible.
        latencies.append(await until(lambda r=revision: store.revision >= r, 1.0))  # type: ignore[misc]
        assert allowed(store, f"doc:{i}", "viewer", "user:ann")
    revision = await write(pool, store_id, deletes=[("doc:0", "viewer", "user:ann")])
    await until(lambda: store.revision >= revision, 1.0)
    assert not allowed(store, "doc:0", "viewer", "user:ann")
    # Typically well under 1 ms; the median bound keeps a busy CI machine from flaking.
    assert sorted(latencies)[len(latencies) // 2] < 0.1, latencies

    # A store created after start is loaded from its creation notification (revision 0).
    new_id = await create_store(pool)
    await until(lambda: registry.peek(new_id) is not None, 1.0)


async def test_catch_up_after_listener_killed(pool: asyncpg.Pool, eng_db: str,
                                              make_registry: Factory) -> None:
    store_id = await create_store(pool)
    registry = await make_registry()
    store = await registry.get(store_id)
    assert store is not None

    async def listener_pids() -> list[int]:
        rows = await pool.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()")
        return [r["pid"] for r in rows]

    before = await listener_pids()
    assert before
    # Written without a notification at all, as if sent while nobody listened: only the
    # post-reconnect poll pass can find it (the periodic poll is an hour away). Written before
    # the listener is killed, not after: a reconnect and its poll faster than the write would
    # otherwise miss it, and the test would fail on its own race.
    revision = await write(pool, store_id, writes=[("doc:1", "viewer", "user:ann")], notify=False)
    assert store.revision < revision
    await pool.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", before)
    await until(lambda: store.revision >= revision, 5.0)
    assert allowed(store, "doc:1", "viewer", "user:ann")
    # Listening again: the next write arrives through LISTEN.
    # A terminated backend can linger in pg_stat_activity for a moment: wait for the new one.
    for _ in range(100):
        after = await listener_pids()
        if after and not set(after) & set(before):
            break
        await asyncio.sleep(0.02)
    assert after and not set(after) & set(before)
    revision = await write(pool, store_id, writes=[("doc:2", "viewer", "user:ann")])
    await until(lambda: store.revision >= revision, 1.0)


async def test_a_listener_that_went_silent_is_replaced(pool: asyncpg.Pool, eng_db: str) -> None:
    """A LISTEN connection whose link dies without a word (half-open: no FIN, no RST, as after a
    network partition) still says it is open and would never hear a notification again. Its
    probe query gets no answer within the contact timeout, so the engine reconnects, catches up
    with a full poll pass and hears the next write: here well before the poll (an hour away)."""
    async with pg_proxy(eng_db) as proxy:
        registry = StoreRegistry(pool=pool, dsn=proxy.url(eng_db), poll_seconds=3600.0,
                                 contact_timeout_seconds=1.0, listener_probe_seconds=0.2)
        registry.start()
        try:
            assert await registry.wait_ready(30)
            store_id = await create_store(pool)
            await until(lambda: registry.peek(store_id) is not None, 2.0)
            store = registry.peek(store_id)
            assert store is not None
            old = registry._listener
            proxy.stall()
            revision = await write(pool, store_id, writes=[("doc:1", "viewer", "user:ann")])
            await asyncio.sleep(0.1)
            assert store.revision < revision  # its notification went into the silent link
            assert not old.is_closed()  # and the connection does not know
            # Probe period + contact timeout, then a reconnect: no goodbye awaited on the dead link
            # (a graceful close would add 2 s).
            await until(lambda: store.revision >= revision, 2.5)
            assert registry._listener is not old
            assert allowed(store, "doc:1", "viewer", "user:ann")
            await until(lambda: not registry.stale, 2.0)
            revision = await write(pool, store_id, writes=[("doc:2", "viewer", "user:ann")])
            await until(lambda: store.revision >= revision, 1.0)  # listening again
        finally:
            await registry.close()


async def test_the_tables_refuse_a_hash_in_object_or_relation(pool: asyncpg.Pool) -> None:
    """The engine reads ``object || '#' || relation`` as a node key, and takes a snapshot's rows
    as distinct pairs: exact only while neither part holds a ``#`` (``('a#b', 'c')`` and
    ``('a', 'b#c')`` would be one node), which the tables hold (migration 0008), not only the
    API's validation."""
    store_id = await create_store(pool)
    for obj, relation in (("doc:a#b", "viewer"), ("doc:a", "view#er")):
        with pytest.raises(asyncpg.CheckViolationError):
            await write(pool, store_id, writes=[(obj, relation, "user:x")])
        with pytest.raises(asyncpg.CheckViolationError):
            await pool.execute("INSERT INTO tuple_changes VALUES ($1, 99, 1, 'write', $2, $3, "
                               "'user:x')", store_id, obj, relation)
    await write(pool, store_id, writes=[("doc:a", "viewer", "group:g#member")])  # userset: fine


async def test_slow_listener_reconnect_is_kept(pool: asyncpg.Pool, make_registry: Factory,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconnect slower than a poll tick keeps its new connection. While it connects there is
    no listener, so the poll loop flags a loss; that flag must not tear the new one down."""
    registry = await make_registry(poll_seconds=0.02)
    real_connect = asyncpg.connect
    connects = 0

    async def slow_connect(*args: Any, **kwargs: Any) -> Any:
        nonlocal connects
        connects += 1
        await asyncio.sleep(0.2)  # ten poll ticks
        return await real_connect(*args, **kwargs)

    monkeypatch.setattr(asyncpg, "connect", slow_connect)  # the module engine.registry calls
    old = registry._listener
    await pool.execute("SELECT pg_terminate_backend($1)", old.get_server_pid())
    await until(lambda: registry._listener not in (None, old), 5.0)
    fresh = registry._listener
    await asyncio.sleep(0.6)  # thirty more poll ticks
    assert connects == 1
    assert registry._listener is fresh and not fresh.is_closed()
    assert not registry._listener_lost.is_set()


async def test_poll_is_the_fallback(pool: asyncpg.Pool, make_registry: Factory) -> None:
    store_id = await create_store(pool)
    registry = await make_registry(poll_seconds=0.1)
    store = await registry.get(store_id)
    assert store is not None
    revision = await write(pool, store_id, writes=[("doc:1", "viewer", "user:ann")], notify=False)
    silent = await create_store(pool, notify=False)
    await until(lambda: store.revision >= revision, 1.0)
    await until(lambda: registry.peek(silent) is not None, 1.0)
    # A deleted store is forgotten by the poll.
    await pool.execute("DELETE FROM stores WHERE id = $1", silent)
    await until(lambda: registry.peek(silent) is None, 1.0)


async def test_unknown_store_loaded_on_demand(pool: asyncpg.Pool,
                                              make_registry: Factory) -> None:
    registry = await make_registry()
    assert await registry.get("store_doesnotexist") is None
    # Created without any notification (and no poll): get() still finds it.
    store_id = await create_store(pool, notify=False,
                                  tuples=[("doc:1", "viewer", "user:ann")])
    assert registry.peek(store_id) is None
    loads = await asyncio.gather(*(registry.get(store_id) for _ in range(5)))
    assert all(s is loads[0] for s in loads) and loads[0] is not None
    assert loads[0].revision == 1 and allowed(loads[0], "doc:1", "viewer", "user:ann")
    other = await create_store(pool, project=OTHER_PROJECT, notify=False)
    got = await registry.get(other)
    assert got is not None and got.project_id == OTHER_PROJECT

    # A miss is remembered about 1 s, unless a notification says the store now exists.
    late = f"store_{secrets.token_hex(13)}"
    assert await registry.get(late) is None
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO stores (id, project_id, name) VALUES ($1, $2, 'n')",
                           late, PROJECT)
    assert await registry.get(late) is None
    await asyncio.sleep(1.1)
    assert await registry.get(late) is not None


async def test_find_waits_for_the_start_up_load_only_so_long(pool: asyncpg.Pool, eng_db: str,
                                                             make_registry: Factory) -> None:
    """``find`` (the check and edge routes' lookup): not_ready past its bound while the
    snapshot is still loading (here: never started), else ``get``'s answer."""
    loading = StoreRegistry(pool=pool, dsn=eng_db, poll_seconds=3600.0)
    started = time.perf_counter()
    with pytest.raises(NotReady):
        await loading.find(f"store_{secrets.token_hex(13)}", 0.2)
    assert 0.15 < time.perf_counter() - started < 5
    registry = await make_registry()
    store_id = await create_store(pool, notify=False, tuples=[("doc:1", "viewer", "user:ann")])
    found = await registry.find(store_id, 0.2)
    assert found is not None and found is registry.peek(store_id)
    assert await registry.find(f"store_{secrets.token_hex(13)}", 0.2) is None


async def test_wait_for(pool: asyncpg.Pool, make_registry: Factory) -> None:
    store_id = await create_store(pool)
    registry = await make_registry()
    store = await registry.get(store_id)
    assert store is not None
    assert await registry.wait_for(store, 0, 0.0)
    t0 = time.perf_counter()
    assert not await registry.wait_for(store, 5, 0.2)
    assert 0.19 <= time.perf_counter() - t0 < 0.5
    # A write without notification: wait_for's own catch-up finds it.
    revision = await write(pool, store_id, writes=[("doc:1", "viewer", "user:ann")], notify=False)
    assert await registry.wait_for(store, revision, 1.0)
    # Waiters are woken by the apply step of a later write.
    waiter = asyncio.create_task(registry.wait_for(store, revision + 1, 2.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await write(pool, store_id, writes=[("doc:2", "viewer", "user:ann")])
    assert await asyncio.wait_for(waiter, 1.0)


# -- the check endpoints over HTTP (engine app alone) ------------------------------------------

FULL_KEY = "sk_test_" + "F" * 43
NARROW_KEY = "sk_test_" + "N" * 43  # users:read only
OTHER_KEY = "sk_test_" + "O" * 43  # full access, other project


class EngineApi:
    def __init__(self, session: ClientSession, base_url: str, app: web.Application) -> None:
        self.session, self.base_url, self.app = session, base_url, app

    async def post(self, path: str, body: Any, key: str | None = FULL_KEY) -> tuple[int, Any, Any]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        async with self.session.post(self.base_url + path, data=orjson.dumps(body),
                                     headers=headers) as r:
            parsed = orjson.loads(await r.read())
            assert r.headers["X-Request-Id"] == parsed["request_id"]
            return r.status, parsed, r.headers


@pytest_asyncio.fixture(scope="module")
async def engine_api(eng_db: str, pool: asyncpg.Pool) -> AsyncIterator[EngineApi]:
    """The engine app alone on a loopback port, with three API keys in the database."""
    for key, project, scopes in ((FULL_KEY, PROJECT, []), (NARROW_KEY, PROJECT, ["users:read"]),
                                 (OTHER_KEY, OTHER_PROJECT, [])):
        await pool.execute(
            "INSERT INTO api_keys (id, project_id, name, prefix, secret_hash, last_four, scopes) "
            "VALUES ($1, $2, 'k', 'sk_test_', $3, $4, $5)",
            f"key_{secrets.token_hex(13)}", project, hash_secret(key), key[-4:], scopes)
    settings = load_settings(
        database_url=eng_db, redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        redis_prefix=f"authio_eng_{secrets.token_hex(4)}:", consistency_timeout_ms=300,
        engine_poll_seconds=3600, pg_pool_max=4,
    )
    app = create_engine_app(settings)
    runner = EnvelopeRunner(app, access_log=None)  # as the service: the envelope comes with it
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    async with ClientSession() as session:
        api = EngineApi(session, f"http://127.0.0.1:{port}", app)
        for _ in range(300):
            async with session.get(api.base_url + "/readyz") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
        yield api
    await runner.cleanup()


def tk(o: str, r: str, u: str) -> dict[str, Any]:
    return {"tuple_key": {"object": o, "relation": r, "user": u}}


async def test_http_check_answers(pool: asyncpg.Pool, engine_api: EngineApi) -> None:
    store_id = await create_store(pool, tuples=[("doc:1", "viewer", "group:eng#member"),
                                                ("group:eng", "member", "user:ann"),
                                                ("doc:1", "owner", "user:bob")])
    path = f"/v1/stores/{store_id}/check"
    # The rows were written straight to the database a moment ago: ask for their revision.
    status, body, _ = await engine_api.post(
        path, {**tk("doc:1", "viewer", "user:ann"), "consistency": {"at_least_revision": 1}})
    assert status == 200, body
    assert body["allowed"] is True and body["resolution"] == "userset" and body["revision"] == 1
    assert body["resolution_path"] == ["doc:1#viewer@group:eng#member",
                                       "group:eng#member@user:ann"]
    status, body, _ = await engine_api.post(path, tk("doc:1", "owner", "user:bob"))
    assert (status, body["resolution"], body["resolution_path"]) == (
        200, "direct", ["doc:1#owner@user:bob"])
    status, body, _ = await engine_api.post(path, tk("doc:1", "owner", "user:ann"))
    assert (status, body["allowed"], body["resolution"], body["resolution_path"]) == (
        200, False, "none", [])


async def test_http_check_errors(pool: asyncpg.Pool, engine_api: EngineApi) -> None:
    store_id = await create_store(pool, tuples=[("doc:1", "viewer", "user:ann")])
    path = f"/v1/stores/{store_id}/check"
    good = tk("doc:1", "viewer", "user:ann")

    status, body, _ = await engine_api.post(path, {**good, "extra": 1,
                                                   "consistency": {"at_least_revision": 0, "x": 1}})
    assert status == 400 and body["error"]["code"] == "invalid_request"
    assert {f["field"] for f in body["error"]["details"]["fields"]} == {"extra", "consistency.x"}
    status, body, _ = await engine_api.post(
        path, {"tuple_key": {"object": "doc1", "relation": "viewer", "user": "user:ann", "z": 0}})
    assert status == 400
    assert [f["field"] for f in body["error"]["details"]["fields"]] == ["tuple_key.z",
                                                                        "tuple_key.object"]
    status, body, _ = await engine_api.post(path, {**good, "consistency": {"at_least_revision": -1}})
    assert status == 400 and body["error"]["details"]["fields"][0]["field"] == (
        "consistency.at_least_revision")

    for bad_path, key in ((f"/v1/stores/store_{'0' * 26}/check", FULL_KEY), (path, OTHER_KEY)):
        status, body, _ = await engine_api.post(bad_path, good, key=key)
        assert (status, body["error"]["code"]) == (404, "store_not_found")
    status, body, _ = await engine_api.post(path, good, key=None)
    assert (status, body["error"]["code"]) == (401, "missing_api_key")
    status, body, _ = await engine_api.post(path, good, key=NARROW_KEY)
    assert (status, body["error"]["code"]) == (403, "insufficient_scope")


async def test_http_malformed_store_id_costs_no_lookup(engine_api: EngineApi,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An id that cannot be a store id is store_not_found before any load task or query."""
    registry = engine_api.app[STORES]
    real_get = registry.get
    looked_up: list[str] = []

    async def spy_get(store_id: str) -> LoadedStore | None:
        looked_up.append(store_id)
        return await real_get(store_id)

    monkeypatch.setattr(registry, "get", spy_get)
    good = tk("doc:1", "viewer", "user:ann")
    malformed = ["nope", "store_doesnotexist", f"proj_{'0' * 26}", f"store_{'0' * 25}",
                 f"store_{'0' * 27}", f"store_{'A' * 26}", f"store_{'0' * 25}u", "x" * 2000]
    for store_id in malformed:
        for path, body in ((f"/v1/stores/{store_id}/check", good),
                           (f"/v1/stores/{store_id}/batch-check", {"checks": [good]})):
            status, answer, _ = await engine_api.post(path, body)
            assert (status, answer["error"]["code"]) == (404, "store_not_found"), (path, answer)
        assert store_id not in registry._missing and store_id not in registry._loads
    assert looked_up == []
    # A well-formed unknown id is still looked up (once; the miss is then remembered).
    unknown = f"store_{secrets.token_hex(13)}"
    status, answer, _ = await engine_api.post(f"/v1/stores/{unknown}/check", good)
    assert (status, answer["error"]["code"]) == (404, "store_not_found")
    assert looked_up == [unknown] and unknown in registry._missing


async def test_http_consistency_and_depth(pool: asyncpg.Pool, engine_api: EngineApi) -> None:
    store_id = await create_store(pool)
    path = f"/v1/stores/{store_id}/check"
    # Not notified: the at_least_revision wait's own catch-up must find it.
    revision = await write(pool, store_id, writes=[("doc:1", "viewer", "user:ann")], notify=False)
    status, body, _ = await engine_api.post(
        path, {**tk("doc:1", "viewer", "user:ann"), "consistency": {"at_least_revision": revision}})
    assert (status, body["allowed"], body["revision"]) == (200, True, revision)
    status, body, headers = await engine_api.post(
        path, {**tk("doc:1", "viewer", "user:ann"), "consistency": {"at_least_revision": 99}})
    assert (status, body["error"]["code"]) == (400, "revision_ahead")
    assert body["error"]["details"] == {"requested": 99, "current": revision}
    assert "Retry-After" not in headers

    chain = [(f"group:{i}", "member", f"group:{i + 1}#member") for i in range(30)]
    revision = await write(pool, store_id, writes=[*chain, ("group:30", "member", "user:deep")])
    status, body, _ = await engine_api.post(
        path, {**tk("group:0", "member", "user:deep"), "consistency": {"at_least_revision": revision}})
    assert (status, body["error"]["code"]) == (422, "resolution_too_complex")
    assert body["error"]["details"] == {"max_depth": 25}


async def test_http_revision_not_reached_while_the_follower_is_held(
        pool: asyncpg.Pool, engine_api: EngineApi) -> None:
    """A committed revision the engine cannot follow in time is 503 ``revision_not_reached``
    with ``Retry-After`` after the wait (300 ms here), never ``revision_ahead``; a revision past
    the head is still 400 at once meanwhile: the head is read apart from the follower.

    The follower is held for real: the write commits without a notification (the poll is off),
    then a transaction holds ``tuple_changes`` in ACCESS EXCLUSIVE mode, so the catch-up's read
    of the log waits on PostgreSQL's lock while ``stores`` (the head) stays readable."""
    store_id = await create_store(pool, tuples=[("doc:1", "viewer", "user:ann")])
    path = f"/v1/stores/{store_id}/check"
    status, body, _ = await engine_api.post(
        path, {**tk("doc:1", "viewer", "user:ann"), "consistency": {"at_least_revision": 1}})
    assert (status, body["revision"]) == (200, 1), body
    revision = await write(pool, store_id, writes=[("doc:2", "viewer", "user:ann")], notify=False)
    ask = {**tk("doc:2", "viewer", "user:ann"), "consistency": {"at_least_revision": revision}}
    async with pool.acquire() as conn:
        held = conn.transaction()
        await held.start()
        try:
            await conn.execute("LOCK TABLE tuple_changes IN ACCESS EXCLUSIVE MODE")
            started = time.perf_counter()
            status, body, headers = await engine_api.post(path, ask)
            elapsed = time.perf_counter() - started
            assert (status, body["error"]["code"]) == (503, "revision_not_reached"), body
            assert body["error"]["details"] == {"requested": revision, "current": 1}
            assert headers["Retry-After"] == "1"
            assert 0.25 < elapsed < 1.5, elapsed  # the 300 ms wait, not an instant refusal
            started = time.perf_counter()
            status, body, _ = await engine_api.post(
                path, {**ask, "consistency": {"at_least_revision": revision + 1}})
            assert (status, body["error"]["code"]) == (400, "revision_ahead"), body
            assert body["error"]["details"] == {"requested": revision + 1, "current": revision}
            assert time.perf_counter() - started < 0.25
            # batch: the call's own revision fails the call; an item's, that item
            status, body, headers = await engine_api.post(
                f"/v1/stores/{store_id}/batch-check",
                {"checks": [tk("doc:1", "viewer", "user:ann"), ask]})
            assert status == 200, body
            assert body["results"][0]["allowed"] is True and body["revision"] == 1
            assert body["results"][1]["error"]["code"] == "revision_not_reached", body
            status, body, headers = await engine_api.post(
                f"/v1/stores/{store_id}/batch-check",
                {"checks": [tk("doc:1", "viewer", "user:ann")],
                 "consistency": {"at_least_revision": revision}})
            assert (status, body["error"]["code"]) == (503, "revision_not_reached"), body
            assert headers["Retry-After"] == "1"
            # A check waiting when the follower moves is answered then, within its wait.
            waiting = asyncio.create_task(engine_api.post(path, ask))
            await asyncio.sleep(0.1)
            assert not waiting.done()
        finally:
            await held.rollback()
    status, body, _ = await waiting
    assert (status, body["allowed"], body["revision"]) == (200, True, revision), body
    status, body, _ = await engine_api.post(path, ask)
    assert (status, body["allowed"], body["revision"]) == (200, True, revision), body


async def test_the_head_is_read_only_beyond_what_the_engine_knows(
        pool: asyncpg.Pool, engine_api: EngineApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """``at_least_revision`` at or below the store's revision reads nothing; above it, the head
    is read (once for concurrent askers); a revision a notification announced needs no read
    even while the follower is held (it is known committed: the check waits, then 503)."""
    registry = engine_api.app[STORES]
    real_read = registry._read_head
    reads: list[str] = []

    async def counting_read(store_id: str, timeout_s: float) -> int | None:
        reads.append(store_id)
        return await real_read(store_id, timeout_s)

    monkeypatch.setattr(registry, "_read_head", counting_read)
    store_id = await create_store(pool, tuples=[("doc:1", "viewer", "user:ann")])
    path = f"/v1/stores/{store_id}/check"
    # First the engine follows the store to revision 1 (checks without consistency): create_store
    # commits the store (revision 0) and its tuples (revision 1) apart, and on a loaded machine
    # the second notice may come after a consistent check, which then rightly reads the head.
    for _ in range(200):
        status, body, _ = await engine_api.post(path, tk("doc:1", "viewer", "user:ann"))
        if (status, body["revision"]) == (200, 1):
            break
        await asyncio.sleep(0.05)
    assert (status, body["revision"]) == (200, 1), body
    reads.clear()
    at = {**tk("doc:1", "viewer", "user:ann"), "consistency": {"at_least_revision": 1}}
    for _ in range(3):
        status, body, _ = await engine_api.post(path, at)
        assert (status, body["revision"]) == (200, 1), body
    assert reads == []
    status, body, _ = await engine_api.post(path, {**at, "consistency": {"at_least_revision": 7}})
    assert (status, body["error"]["code"]) == (400, "revision_ahead"), body
    assert reads == [store_id]
    reads.clear()
    assert await asyncio.gather(*(registry.head(store_id, 1.0) for _ in range(10))) == [1] * 10
    assert reads == [store_id]  # one query for the ten
    # Committed without a notification, then announced while the catch-up is held by a lock.
    reads.clear()
    revision = await write(pool, store_id, writes=[("doc:2", "viewer", "user:ann")], notify=False)
    ask = {**tk("doc:2", "viewer", "user:ann"), "consistency": {"at_least_revision": revision}}
    async with pool.acquire() as conn:
        held = conn.transaction()
        await held.start()
        try:
            await conn.execute("LOCK TABLE tuple_changes IN ACCESS EXCLUSIVE MODE")
            await pool.execute("SELECT pg_notify($1, $2)", changes.CHANNEL,
                               changes.payload(store_id, revision))
            store = registry.peek(store_id)
            assert store is not None
            await until(lambda: registry.heard(store) == revision, within=5)
            status, body, headers = await engine_api.post(path, ask)
            assert (status, body["error"]["code"]) == (503, "revision_not_reached"), body
            assert headers["Retry-After"] == "1"
        finally:
            await held.rollback()
    assert reads == []
    status, body, _ = await engine_api.post(path, ask)
    assert (status, body["allowed"], body["revision"]) == (200, True, revision), body


async def test_http_batch_check(pool: asyncpg.Pool, engine_api: EngineApi) -> None:
    chain = [(f"group:{i}", "member", f"group:{i + 1}#member") for i in range(30)]
    store_id = await create_store(pool, tuples=[("doc:1", "viewer", "user:ann"), *chain])
    path = f"/v1/stores/{store_id}/batch-check"
    checks = [tk("doc:1", "viewer", "user:ann"), tk("doc:1", "viewer", "bad"), 7,
              {**tk("doc:1", "viewer", "user:ann"), "consistency": {"at_least_revision": 50}},
              tk("group:0", "member", "user:nobody"), tk("doc:1", "viewer", "user:bob")]
    status, body, _ = await engine_api.post(path, {"checks": checks})
    assert status == 200, body
    r = body["results"]
    assert body["revision"] == 1 and len(r) == len(checks)
    assert r[0] == {"allowed": True, "resolution": "direct",
                    "resolution_path": ["doc:1#viewer@user:ann"], "revision": 1,
                    "dispatch_count": 1, "depth": 1}
    assert r[1]["error"]["code"] == "invalid_request"
    assert r[1]["error"]["details"]["fields"][0]["field"] == "tuple_key.user"
    assert r[2]["error"]["details"]["fields"][0]["field"] == "checks[2]"
    assert r[3]["error"] == {"code": "revision_ahead", "message": r[3]["error"]["message"],
                             "details": {"requested": 50, "current": 1}}
    assert r[4]["error"] == {"code": "resolution_too_complex", "message": r[4]["error"]["message"],
                             "details": {"max_depth": 25}}
    assert r[5]["allowed"] is False
    bad_bodies: list[dict[str, Any]] = [
        {"checks": []}, {"checks": [checks[0]] * 1001}, {"checks": [checks[0]], "x": 1},
        {"checks": [checks[0]], "consistency": {"at_least_revision": "1"}}]
    for bad in bad_bodies:
        status, body, _ = await engine_api.post(path, bad)
        assert (status, body["error"]["code"]) == (400, "invalid_request"), bad
    status, body, _ = await engine_api.post(
        path, {"checks": [checks[0]], "consistency": {"at_least_revision": 50}})
    assert (status, body["error"]["code"]) == (400, "revision_ahead")
    assert body["error"]["details"] == {"requested": 50, "current": 1}
