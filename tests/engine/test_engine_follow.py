"""The engine as a service of its own, following the control plane's change log.

The engine runs as its own app (``create_engine_app``), the control plane as another
(``create_control_plane_app``): two servers that share nothing but PostgreSQL and Redis, as in
production (DESIGN.md "Two services, one product"). Writes go to the control plane, checks to the
engine, so every answer proves the LISTEN / ``tuple_changes`` path, never an in-process shortcut.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from tests.engine import reference
from tests.fixtures.service import Api, Project, assert_error, bootstrap_project, serving

VISIBLE_WITHIN_S = 1.0


# --- fixtures and helpers ---------------------------------------------------------------------


@asynccontextmanager
async def running_engine(http: ClientSession, settings: Settings,
                         ready: bool = True) -> AsyncIterator[Api]:
    """The engine alone on a port of its own; stopped on exit."""
    from engine.app import create_engine_app

    async with serving(http, create_engine_app(settings), ready=ready) as api:
        yield api


@pytest_asyncio.fixture(scope="module")
async def control_plane(settings_factory: Callable[..., Settings],
                        http: ClientSession) -> AsyncIterator[Api]:
    """The control plane alone (no engine in its process)."""
    from control_plane.app import create_control_plane_app

    async with serving(http, create_control_plane_app(settings_factory())) as api:
        yield api


@pytest_asyncio.fixture(scope="module")
async def engine(control_plane: Api, settings_factory: Callable[..., Settings],
                 http: ClientSession) -> AsyncIterator[Api]:
    """One engine for the module, started before any store of this module exists. Its fallback
    poll is slowed to 30 s, so anything visible within a second without a consistency token got
    there through LISTEN/NOTIFY and the change log."""
    async with running_engine(http, settings_factory(engine_poll_seconds=30)) as api:
        yield api


@pytest_asyncio.fixture
async def proj(control_plane: Api) -> Project:
    """A fresh project, bootstrapped through the control-plane-only app."""
    return await bootstrap_project(control_plane, "follow")


def tk(spec: str) -> dict[str, str]:
    obj, _, rest = spec.partition("#")
    rel, _, user = rest.partition("@")
    return {"object": obj, "relation": rel, "user": user}


def spec_of(t: dict[str, str]) -> str:
    return f"{t['object']}#{t['relation']}@{t['user']}"


async def new_store(cp: Api, name: str = "follow") -> str:
    r = await cp.post("/v1/stores", {"name": name})
    assert r.status == 201, r.body
    return str(r.body["id"])


async def write(cp: Api, store: str, writes: list[str] | None = None,
                deletes: list[str] | None = None) -> int:
    r = await cp.post(f"/v1/stores/{store}/write", {"writes": [tk(s) for s in writes or []],
                                                    "deletes": [tk(s) for s in deletes or []]})
    assert r.status == 200, r.body
    return int(r.body["revision"])


async def listing(cp: Api, store: str) -> set[str]:
    """Every tuple of the store through GET /v1/stores/{id}/tuples (all pages)."""
    found: set[str] = set()
    cursor = None
    while True:
        r = await cp.get(f"/v1/stores/{store}/tuples?limit=1000"
                         + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        found.update(spec_of(t) for t in r.body["data"])
        cursor = r.body["next_cursor"]
        if not cursor:
            return found


async def check(api: Api, store: str, spec: str, revision: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"tuple_key": tk(spec)}
    if revision is not None:
        body["consistency"] = {"at_least_revision": revision}
    r = await api.post(f"/v1/stores/{store}/check", body)
    assert r.status == 200, (spec, r.status, r.body)
    return dict(r.body)


async def batch(api: Api, store: str, specs: list[str],
                revision: int | None = None) -> list[dict[str, Any]]:
    """Batch-check ``specs`` (any number, 1,000 per call); every item must answer."""
    results: list[dict[str, Any]] = []
    for start in range(0, len(specs), 1000):
        body: dict[str, Any] = {"checks": [{"tuple_key": tk(s)} for s in specs[start:start + 1000]]}
        if revision is not None:
            body["consistency"] = {"at_least_revision": revision}
        r = await api.post(f"/v1/stores/{store}/batch-check", body)
        assert r.status == 200, r.body
        for s, item in zip(specs[start:start + 1000], r.body["results"], strict=True):
            assert "error" not in item, (s, item)
            results.append(item)
    return results


async def until_visible(api: Api, store: str, spec: str, want: bool = True,
                        within: float = 3.0) -> float:
    """Poll the check without a consistency token until it answers ``want``; seconds taken."""
    started = time.perf_counter()
    while True:
        if (await check(api, store, spec))["allowed"] is want:
            return time.perf_counter() - started
        assert time.perf_counter() - started < within, f"{spec} never became {want}"
        await asyncio.sleep(0.005)


# --- (5) readiness and shape ------------------------------------------------------------------


async def test_engine_is_ready_and_serves_only_checks(engine: Api, proj: Project) -> None:
    r = await engine.get("/readyz", key=None)
    assert r.status == 200, r.body
    assert r.body["status"] == "ready"
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    r = await engine.get("/healthz", key=None)
    assert r.status == 200, r.body
    # the engine never writes: control-plane routes do not exist there
    api = engine.with_key(proj.key)
    assert_error(await api.post("/v1/stores", {"name": "x"}), 404, "not_found")
    assert_error(await api.post("/v1/stores/store_x/write", {"writes": [tk("a:b#c@d:e")]}),
                 404, "not_found")
    assert_error(await api.post("/v1/bootstrap", {}), 404, "not_found")


async def test_fresh_engine_readyz_turns_200_once_loaded(
        proj: Project, http: ClientSession,
        settings_factory: Callable[..., Settings]) -> None:
    store = await new_store(proj.api)
    rev = await write(proj.api, store, ["doc:1#viewer@user:a"])
    async with running_engine(http, settings_factory(), ready=False) as api:
        started = time.perf_counter()
        statuses = set()
        while True:
            r = await api.get("/readyz", key=None)
            statuses.add(r.status)
            if r.status == 200:
                break
            assert_error(r, 503, "not_ready")
            assert time.perf_counter() - started < 10, "engine never became ready"
            await asyncio.sleep(0.01)
        assert statuses <= {200, 503}
        # ready means loaded: the existing tuple answers at once, without a token
        body = await check(api.with_key(proj.key), store, "doc:1#viewer@user:a")
        assert body["allowed"] is True and body["revision"] == rev


# --- (1) write via control plane, visible on the engine -----------------------------------------


async def test_write_via_control_plane_visible_on_engine_within_1s(
        engine: Api, proj: Project) -> None:
    cp, api = proj.api, engine.with_key(proj.key)
    store = await new_store(cp)
    assert (await check(api, store, "doc:0#viewer@user:a"))["allowed"] is False  # loaded now
    latencies = []
    for i in range(8):
        spec = f"doc:{i}#viewer@user:a"
        started = time.perf_counter()
        await write(cp, store, [spec])
        await until_visible(api, store, spec)
        latencies.append(time.perf_counter() - started)
    # deletes follow the same path
    started = time.perf_counter()
    await write(cp, store, deletes=["doc:3#viewer@user:a"])
    await until_visible(api, store, "doc:3#viewer@user:a", want=False)
    latencies.append(time.perf_counter() - started)
    print(f"\nwrite->visible on a separate engine (no token): max {max(latencies) * 1000:.1f} ms, "
          f"median {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms")
    assert max(latencies) < VISIBLE_WITHIN_S, latencies


async def test_userset_chain_built_by_separate_writes_is_followed(engine: Api,
                                                                  proj: Project) -> None:
    cp, api = proj.api, engine.with_key(proj.key)
    store = await new_store(cp)
    assert (await check(api, store, "doc:1#viewer@user:a"))["allowed"] is False
    await write(cp, store, ["doc:1#viewer@group:g#member"])
    await write(cp, store, ["group:g#member@team:t#member"])
    rev = await write(cp, store, ["team:t#member@user:a"])
    body = await check(api, store, "doc:1#viewer@user:a", rev)
    assert body["allowed"] is True
    assert body["resolution_path"] == ["doc:1#viewer@group:g#member",
                                       "group:g#member@team:t#member", "team:t#member@user:a"]
    rev = await write(cp, store, deletes=["group:g#member@team:t#member"])
    assert (await check(api, store, "doc:1#viewer@user:a", rev))["allowed"] is False


# --- (2) concurrent writers ----------------------------------------------------------------------


async def _concurrent_writes(cp: Api, stores: list[str], tasks: int = 8, calls: int = 30,
                             seed: int = 20261121) -> tuple[dict[str, int], dict[str, set[str]]]:
    """``tasks`` writers x ``calls`` write calls each (writes and deletes mixed, 1 to 4 tuples a
    call) over a shared universe of tuples per store. Returns (highest revision per store,
    tuples touched per store)."""
    universe = [f"doc:{d}#{rel}@user:{u}" for d in range(6) for rel in ("viewer", "editor")
                for u in range(5)]  # 60 tuples: heavy contention on the same rows
    final: dict[str, int] = dict.fromkeys(stores, 0)
    touched: dict[str, set[str]] = {s: set() for s in stores}

    async def writer(n: int) -> None:
        rng = random.Random(seed + n)
        for _ in range(calls):
            store = rng.choice(stores)
            picked = rng.sample(universe, rng.randint(1, 4))
            # the first `cut` are written, the rest deleted (all writes 40% of the time)
            cut = len(picked) if rng.random() < 0.4 else rng.randint(0, len(picked))
            writes, deletes = picked[:cut], picked[cut:]
            rev = await write(cp, store, writes, deletes)
            touched[store].update(picked)
            final[store] = max(final[store], rev)

    await asyncio.gather(*(writer(n) for n in range(tasks)))
    return final, touched


async def stored(db: asyncpg.Pool, store: str) -> set[str]:
    """The store's tuples as committed in PostgreSQL (the source of truth)."""
    rows = await db.fetch("SELECT object, relation, subject FROM tuples WHERE store_id = $1", store)
    return {f"{r['object']}#{r['relation']}@{r['subject']}" for r in rows}


async def _assert_engine_agrees(api: Api, cp: Api, db: asyncpg.Pool, store: str, revision: int,
                                touched: set[str]) -> None:
    """At ``revision`` the engine allows exactly the touched tuples that are stored; then the
    control plane's listing shows that same set."""
    present = await stored(db, store)
    assert present <= touched
    specs = sorted(touched)
    results = await batch(api, store, specs, revision)
    wrong = [(s, r["allowed"]) for s, r in zip(specs, results, strict=True)
             if r["allowed"] is not (s in present)]
    assert not wrong, f"engine disagrees with the stored tuples on {len(wrong)}: {wrong[:10]}"
    assert all(r["revision"] >= revision for r in results)
    for s, r in zip(specs, results, strict=True):
        if r["allowed"]:
            assert r["resolution"] == "direct" and r["resolution_path"] == [s], (s, r)
    assert await listing(cp, store) == present


async def test_concurrent_writers_no_change_skipped(engine: Api, proj: Project,
                                                    db: asyncpg.Pool) -> None:
    cp, api = proj.api, engine.with_key(proj.key)
    store = await new_store(cp)
    # the engine holds the store before the writes start, so it must follow every change
    assert (await check(api, store, "doc:0#viewer@user:0"))["allowed"] is False
    final, touched = await _concurrent_writes(cp, [store])
    r = await cp.get(f"/v1/stores/{store}")
    assert r.status == 200 and r.body["revision"] == final[store], (r.body, final)
    await _assert_engine_agrees(api, cp, db, store, final[store], touched[store])
    # and without a token it is there too, once caught up
    started = time.perf_counter()
    while (await check(api, store, "doc:0#viewer@user:0"))["revision"] < final[store]:
        assert time.perf_counter() - started < VISIBLE_WITHIN_S
        await asyncio.sleep(0.005)


async def test_concurrent_writers_across_stores(engine: Api, proj: Project,
                                                db: asyncpg.Pool) -> None:
    cp, api = proj.api, engine.with_key(proj.key)
    stores = [await new_store(cp, f"s{i}") for i in range(4)]
    for store in stores[:2]:  # two followed from the start, two loaded on demand afterwards
        assert (await check(api, store, "doc:0#viewer@user:0"))["allowed"] is False
    final, touched = await _concurrent_writes(cp, stores, seed=7)
    for store in stores:
        await _assert_engine_agrees(api, cp, db, store, final[store], touched[store])


async def _assert_matches_reference(api: Api, db: asyncpg.Pool, store: str, revision: int,
                                    specs: list[str]) -> None:
    """At ``revision`` the engine answers every check in ``specs`` as ``tests/engine/reference.py`` does
    over the tuples stored in PostgreSQL."""
    tuples = [tk(t) for t in await stored(db, store)]
    results = await batch(api, store, specs, revision)
    wrong = []
    for s, r in zip(specs, results, strict=True):
        t = tk(s)
        want = reference.check(tuples, t["object"], t["relation"], t["user"])
        if r["allowed"] is not want:
            wrong.append((s, r["allowed"], want))
    assert not wrong, f"engine disagrees with the reference evaluator on {len(wrong)}: {wrong[:10]}"


USERSET_UNIVERSE = (
    [f"doc:{d}#viewer@user:{u}" for d in range(3) for u in range(12)]
    + [f"doc:{d}#viewer@group:{g}#member" for d in range(3) for g in range(6)]
    + [f"group:{g}#member@user:{u}" for g in range(6) for u in range(12)]
    + [f"group:{g}#member@group:{h}#member" for g in range(6) for h in range(6) if g != h]
)
USERSET_CHECKS = (
    [f"doc:{d}#viewer@user:{u}" for d in range(3) for u in range(13)]
    + [f"doc:{d}#viewer@group:{g}#member" for d in range(3) for g in range(6)]
    + [f"group:{g}#member@user:{u}" for g in range(6) for u in range(13)]
)


async def _churn(cp: Api, store: str, tasks: int, calls: int, seed: int,
                 after_first: asyncio.Event | None = None) -> int:
    """Concurrent writers over USERSET_UNIVERSE (usersets, nested groups, cycles, nodes with more
    than 8 users); returns the highest revision."""
    final = 0

    async def writer(n: int) -> None:
        nonlocal final
        rng = random.Random(seed + n)
        for i in range(calls):
            picked = rng.sample(USERSET_UNIVERSE, rng.randint(1, 6))
            cut = len(picked) if rng.random() < 0.5 else rng.randint(0, len(picked))
            final = max(final, await write(cp, store, picked[:cut], picked[cut:]))
            if after_first is not None and i == 2:
                after_first.set()

    await asyncio.gather(*(writer(n) for n in range(tasks)))
    return final


async def test_concurrent_userset_churn_matches_reference(engine: Api, proj: Project,
                                                          db: asyncpg.Pool) -> None:
    cp, api = proj.api, engine.with_key(proj.key)
    store = await new_store(cp)
    assert (await check(api, store, "doc:0#viewer@user:0"))["allowed"] is False  # followed
    final = await _churn(cp, store, tasks=8, calls=30, seed=11)
    await _assert_matches_reference(api, db, store, final, USERSET_CHECKS)


async def test_engine_started_during_writes_misses_nothing(
        proj: Project, http: ClientSession, settings_factory: Callable[..., Settings],
        db: asyncpg.Pool) -> None:
    """Listen-then-snapshot start-up: an engine that starts while writes land loses none."""
    cp = proj.api
    store = await new_store(cp)
    started_writing = asyncio.Event()
    writers = asyncio.create_task(_churn(cp, store, tasks=6, calls=25, seed=99,
                                         after_first=started_writing))
    try:
        await started_writing.wait()
        async with running_engine(http, settings_factory()) as e:
            api = e.with_key(proj.key)
            final = await writers
            await _assert_matches_reference(api, db, store, final, USERSET_CHECKS)
    finally:
        if not writers.done():
            writers.cancel()
            await asyncio.gather(writers, return_exceptions=True)


# --- (3) restart catch-up ---------------------------------------------------------------------


async def test_restarted_engine_reflects_latest_state(
        proj: Project, http: ClientSession, settings_factory: Callable[..., Settings],
        db: asyncpg.Pool) -> None:
    cp = proj.api
    store = await new_store(cp)
    first = [f"doc:{i}#viewer@user:{i % 3}" for i in range(20)] + [
        "doc:100#viewer@group:g#member", "group:g#member@user:m1", "group:g#member@user:m2"]
    rev = await write(cp, store, first)
    async with running_engine(http, settings_factory()) as e1:
        api = e1.with_key(proj.key)
        results = await batch(api, store, first, rev)
        assert all(r["allowed"] for r in results), results
        assert (await check(api, store, "doc:100#viewer@user:m1", rev))["allowed"] is True
    # engine down: the world moves on
    deleted = [*first[:5], "group:g#member@user:m1"]
    added = [f"doc:{i}#editor@user:z" for i in range(10)] + ["group:g#member@team:t#member",
                                                              "team:t#member@user:m3"]
    await write(cp, store, deletes=deleted)
    await write(cp, store, added)
    rev = await write(cp, store, ["doc:200#viewer@user:late"], ["doc:6#viewer@user:0"])
    late_store = await new_store(cp, "created while the engine was down")
    late_rev = await write(cp, late_store, ["doc:1#viewer@user:a"])
    present = await stored(db, store)
    everything = sorted(set(first) | set(added) | {"doc:200#viewer@user:late"})
    async with running_engine(http, settings_factory()) as e2:
        api = e2.with_key(proj.key)
        # no consistency token: ready must already mean caught up
        results = await batch(api, store, everything)
        wrong = [(s, r["allowed"]) for s, r in zip(everything, results, strict=True)
                 if r["allowed"] is not (s in present)]
        assert not wrong, wrong
        assert all(r["revision"] == rev for r in results), results[0]
        assert (await check(api, store, "doc:100#viewer@user:m1"))["allowed"] is False
        assert (await check(api, store, "doc:100#viewer@user:m2"))["allowed"] is True
        assert (await check(api, store, "doc:100#viewer@user:m3"))["allowed"] is True
        body = await check(api, late_store, "doc:1#viewer@user:a")
        assert body["allowed"] is True and body["revision"] == late_rev
        # and the new engine follows changes made after its start
        started = time.perf_counter()
        await write(cp, store, ["doc:300#viewer@user:after"])
        await until_visible(api, store, "doc:300#viewer@user:after")
        assert time.perf_counter() - started < VISIBLE_WITHIN_S
    assert await listing(cp, store) == present | {"doc:300#viewer@user:after"}


# --- (4) stores created after the engine started ------------------------------------------------


async def test_store_created_after_engine_start(engine: Api, proj: Project) -> None:
    cp, api = proj.api, engine.with_key(proj.key)
    store = await new_store(cp)
    # right after creation: an empty store, not store_not_found
    body = await check(api, store, "doc:1#viewer@user:a")
    assert body["allowed"] is False and body["revision"] == 0
    rev = await write(cp, store, ["doc:1#viewer@user:a"])
    assert (await check(api, store, "doc:1#viewer@user:a", rev))["allowed"] is True
    # created and written with no check in between: the first check with the token answers
    store2 = await new_store(cp)
    rev2 = await write(cp, store2, ["doc:1#viewer@group:g#member", "group:g#member@user:b"])
    body = await check(api, store2, "doc:1#viewer@user:b", rev2)
    assert body["allowed"] is True and body["resolution"] == "userset"
    # and without a token, within a second
    store3 = await new_store(cp)
    started = time.perf_counter()
    await write(cp, store3, ["doc:1#viewer@user:c"])
    await until_visible(api, store3, "doc:1#viewer@user:c")
    assert time.perf_counter() - started < VISIBLE_WITHIN_S


async def test_other_projects_store_is_not_found_on_engine(engine: Api, proj: Project,
                                                           control_plane: Api) -> None:
    other = await bootstrap_project(control_plane, "other")
    store = await new_store(proj.api)
    rev = await write(proj.api, store, ["doc:1#viewer@user:a"])
    assert (await check(engine.with_key(proj.key), store, "doc:1#viewer@user:a", rev))["allowed"]
    r = await engine.with_key(other.key).post(f"/v1/stores/{store}/check",
                                              {"tuple_key": tk("doc:1#viewer@user:a")})
    assert_error(r, 404, "store_not_found")
