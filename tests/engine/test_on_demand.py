"""``SERVICE_ENGINE_STORES=on_demand`` (issue 24, past one machine; docs/sharding.md): an engine
replica behind an ingress that shards by ``store_id`` loads a store on its first check, follows
it, and drops it after ``SERVICE_ENGINE_STORE_IDLE_SECONDS`` unused.

Each test runs ``authio serve engine --workers 1`` as a subprocess against the run's database and
Redis, as an operator runs it; the control plane that writes is the session's service. What the
engine holds is read from outside: its OpenTelemetry metrics (``engine.store_metrics``: loads,
drops, stores and tuples in memory), exported over OTLP to a receiver of the test, at the
latest by the final export at a graceful stop, and its log lines (one per store loaded or
dropped in this mode).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import ClientSession

from tests.fixtures.peers import Receiver, receiving
from tests.fixtures.pgproxy import pg_proxy
from tests.fixtures.proxies import nginx_serving
from tests.fixtures.service import (
    ROOT,
    Project,
    ServedProcess,
    eventually,
    free_ports,
    serve_process,
    stop_gracefully,
)

SERVICE = "authio-on-demand-test"


@pytest.fixture
def engine_env(database_url: str, redis_url: str, redis_prefix: str) -> dict[str, str]:
    """An on-demand engine's environment: the run's database and Redis, a fast poll, keys
    remembered for a minute (so a test can take PostgreSQL away after the first check and still
    be authenticated), nothing inherited that would change the service."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL",
                                                                    "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_ENGINE_POLL_SECONDS="0.5", SERVICE_PG_POOL_MAX="3",
               SERVICE_ENGINE_STORES="on_demand", SERVICE_API_KEY_CACHE_SECONDS="60",
               SERVICE_ENGINE_STORE_IDLE_SECONDS="3600")
    return env


@asynccontextmanager
async def on_demand_engine(http: ClientSession, env: dict[str, str],
                           **extra: str) -> AsyncIterator[tuple[ServedProcess, Receiver]]:
    """The engine (one worker, ready) exporting its metrics to a receiver of the test."""
    async with receiving() as receiver, serve_process(
            http, {**env, "OTEL_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,
                   "OTEL_SAMPLER_RATIO": "0.0", "OTEL_SERVICE_NAME": SERVICE, **extra},
            "engine", "--workers", "1") as served:
        yield served, receiver


def last_values(receiver: Receiver) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
    """Each exported (metric, attributes) of the engine at its latest export."""
    found: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    for service, metric, attributes, value in receiver.points:
        if service == SERVICE and metric.startswith("authio.engine."):
            found[metric, tuple(sorted(attributes.items()))] = value
    return found


async def stopped_metrics(served: ServedProcess, receiver: Receiver) -> dict[str, float]:
    """Stop the engine (its last export goes out at exit); its store metrics, flattened as
    ``metric`` or ``metric:value-of-its-one-attribute``."""
    assert await stop_gracefully(served) == 0, served.logs()
    flat = {}
    for (metric, attributes), value in last_values(receiver).items():
        flat[":".join([metric, *(str(v) for _, v in attributes)])] = value
    assert "authio.engine.stores" in flat, receiver.points  # the export happened at all
    return flat


def lines(served: ServedProcess, text: str) -> list[str]:
    return [line for line in served.stderr if text in line]


async def new_store(project: Project, *objects: str) -> tuple[str, int]:
    """A store of ``project`` holding ``<object>#viewer@user:ann`` for each object, written
    through the control plane: (its id, the revision of the write)."""
    r = await project.api.post("/v1/stores", {"name": "on-demand"})
    assert r.status == 201, r.body
    revision = 0
    if objects:
        revision = await write(project, r.body["id"], *objects)
    return r.body["id"], revision


async def write(project: Project, store_id: str, *objects: str) -> int:
    written = await project.api.post(f"/v1/stores/{store_id}/write",
                                     {"writes": [tk(o) for o in objects]})
    assert written.status == 200, written.body
    revision: int = written.body["revision"]
    return revision


def tk(obj: str) -> dict[str, str]:
    return {"object": obj, "relation": "viewer", "user": "user:ann"}


async def check(served: ServedProcess, project: Project, store_id: str, obj: str,
                at_least: int | None = None) -> Any:
    body: dict[str, Any] = {"tuple_key": tk(obj)}
    if at_least is not None:
        body["consistency"] = {"at_least_revision": at_least}
    return await served.api.post(f"/v1/stores/{store_id}/check", body, key=project.key)


# -- tests ---------------------------------------------------------------------------------------


async def test_a_store_is_loaded_by_its_first_check_and_no_other_is(
        http: ClientSession, engine_env: dict[str, str], project: Project) -> None:
    """Ready with no store in memory; the first check loads the store it names; a store never
    checked stays out of memory, even when it is written while the engine runs (its
    notification is heard and ignored)."""
    checked, revision = await new_store(project, "doc:1", "doc:2")
    never, _ = await new_store(project, "doc:1")
    async with on_demand_engine(http, engine_env) as (served, receiver):
        ready = await served.api.get("/readyz")
        assert (ready.status, ready.body["status"]) == (200, "ready")
        await write(project, never, "doc:3")  # heard on the change log: nothing to load
        a = await check(served, project, checked, "doc:1")
        assert (a.status, a.body["allowed"], a.body["revision"]) == (200, True, revision), a.body
        b = await check(served, project, checked, "doc:9")
        assert (b.status, b.body["allowed"]) == (200, False), b.body
        await asyncio.sleep(1.2)  # two polls: neither loads the other store
        assert len(lines(served, f"engine loaded store {checked}")) == 1, served.logs()
        assert lines(served, f"engine loaded store {never}") == [], served.logs()
        metrics = await stopped_metrics(served, receiver)
    assert metrics["authio.engine.store_loads:loaded"] == 1, metrics
    assert metrics["authio.engine.stores"] == 1, metrics
    assert metrics["authio.engine.tuples"] == 2, metrics  # the checked store's two tuples


async def test_concurrent_first_checks_share_one_load(
        http: ClientSession, engine_env: dict[str, str], project: Project) -> None:
    """Forty checks of an unloaded store at once: every one answered from one load."""
    store_id, revision = await new_store(project, *(f"doc:{n}" for n in range(500)))
    async with on_demand_engine(http, engine_env) as (served, receiver):
        answers = await asyncio.gather(*(check(served, project, store_id, f"doc:{n}")
                                         for n in range(40)))
        for a in answers:
            assert (a.status, a.body["allowed"], a.body["revision"]) == (200, True, revision), \
                a.body
        metrics = await stopped_metrics(served, receiver)
    assert metrics["authio.engine.store_loads:loaded"] == 1, metrics
    assert metrics["authio.engine.store_loads:failed"] == 0, metrics
    assert metrics["authio.engine.tuples"] == 500, metrics


async def test_writes_are_followed_and_revisions_hold_for_a_store_just_loaded(
        http: ClientSession, engine_env: dict[str, str], project: Project) -> None:
    """A first check asking for the revision of the write before it is answered at it; one
    asking beyond the store's latest revision is ``revision_ahead`` at once (400, no
    Retry-After), as for a store loaded at start; then a write through the control plane is
    checked at its revision, and seen without asking too (the change log is followed)."""
    fresh, r0 = await new_store(project, "doc:1")
    ahead, a0 = await new_store(project, "doc:1")
    async with on_demand_engine(http, engine_env) as (served, receiver):
        first = await check(served, project, fresh, "doc:1", at_least=r0)
        assert (first.status, first.body["allowed"], first.body["revision"]) == (200, True, r0)

        too_far = await check(served, project, ahead, "doc:1", at_least=a0 + 5)
        assert too_far.status == 400, too_far.body
        assert too_far.body["error"]["code"] == "revision_ahead"
        assert too_far.body["error"]["details"] == {"requested": a0 + 5, "current": a0}
        assert "Retry-After" not in too_far.headers

        r1 = await write(project, fresh, "doc:2")
        seen = await check(served, project, fresh, "doc:2", at_least=r1)
        assert (seen.status, seen.body["allowed"]) == (200, True), seen.body
        assert seen.body["revision"] >= r1
        r2 = await write(project, fresh, "doc:3")

        async def followed() -> bool:
            a = await check(served, project, fresh, "doc:3")
            return bool(a.status == 200 and a.body["allowed"] and a.body["revision"] >= r2)

        await eventually(followed, within=5, what="the write followed without asking")
        beyond = await check(served, project, fresh, "doc:3", at_least=r2 + 1)
        assert (beyond.status, beyond.body["error"]["code"]) == (400, "revision_ahead")
        metrics = await stopped_metrics(served, receiver)
    assert metrics["authio.engine.store_loads:loaded"] == 2, metrics  # fresh and ahead, once each


async def test_an_idle_store_is_dropped_and_reloaded_with_the_writes_made_meanwhile(
        http: ClientSession, engine_env: dict[str, str], project: Project) -> None:
    """With one second of idleness allowed: a store checked every 0.3 s stays; one left alone is
    dropped; writes made while it is out of memory (their notifications ignored) are all in the
    next check, from a new load at the store's current revision."""
    idle, r0 = await new_store(project, "doc:1")
    busy, _ = await new_store(project, "doc:1")
    async with on_demand_engine(http, engine_env,
                                SERVICE_ENGINE_STORE_IDLE_SECONDS="1") as (served, receiver):
        assert (await check(served, project, idle, "doc:1")).body["allowed"] is True
        assert (await check(served, project, busy, "doc:1")).body["allowed"] is True
        for _ in range(8):  # 2.4 s: the idle store goes, the busy one stays
            assert (await check(served, project, busy, "doc:1")).body["allowed"] is True
            await asyncio.sleep(0.3)
        await eventually(lambda: _async(lines(served, f"engine dropped store {idle}")),
                         within=5, what="the idle store dropped")
        assert lines(served, f"engine dropped store {busy}") == [], served.logs()

        r1 = await write(project, idle, "doc:2")
        r2 = await write(project, idle, "doc:3")
        await asyncio.sleep(0.6)  # a poll and the notifications: none loads it
        assert len(lines(served, f"engine loaded store {idle}")) == 1, served.logs()
        back = await check(served, project, idle, "doc:3")
        assert (back.status, back.body["allowed"], back.body["revision"]) == (200, True, r2), \
            back.body
        assert (await check(served, project, idle, "doc:2", at_least=r1)).body["allowed"] is True
        assert len(lines(served, f"engine loaded store {idle}")) == 2, served.logs()
        metrics = await stopped_metrics(served, receiver)
    assert r2 > r1 > r0
    assert metrics["authio.engine.store_drops:idle"] >= 1, metrics
    assert metrics["authio.engine.store_loads:loaded"] == 3, metrics  # idle twice, busy once


async def _async(value: Any) -> Any:
    return value


async def test_a_failed_load_is_503_and_the_next_check_loads_again(
        http: ClientSession, engine_env: dict[str, str], database_url: str,
        project: Project) -> None:
    """PostgreSQL unreachable (a proxy in front of the run's refuses and cuts) when a store is
    first checked: the envelope's 503 with Retry-After, nothing cached; once it is back, a
    check loads the store."""
    first, _ = await new_store(project, "doc:1")
    later, revision = await new_store(project, "doc:1")
    async with pg_proxy(database_url) as proxy:
        env = {**engine_env, "DATABASE_URL": proxy.url(database_url)}
        async with on_demand_engine(http, env) as (served, receiver):
            # The key is remembered from this check on (SERVICE_API_KEY_CACHE_SECONDS=60).
            assert (await check(served, project, first, "doc:1")).body["allowed"] is True
            proxy.go_down()
            refused = await check(served, project, later, "doc:1")
            assert refused.status == 503, refused.body
            assert refused.body["error"]["code"] in ("db_unavailable", "not_ready"), refused.body
            assert refused.headers["Retry-After"] == "1"
            proxy.go_up()

            async def answered() -> Any:
                a = await check(served, project, later, "doc:1")
                return a if a.status == 200 else None

            a = await eventually(answered, within=10, what="the store loaded once PostgreSQL is back")
            assert (a.body["allowed"], a.body["revision"]) == (True, revision)
            metrics = await stopped_metrics(served, receiver)
    assert metrics["authio.engine.store_loads:failed"] >= 1, metrics
    assert metrics["authio.engine.store_loads:loaded"] == 2, metrics


async def test_a_store_just_loaded_that_cannot_catch_up_answers_revision_not_reached(
        http: ClientSession, engine_env: dict[str, str], database_url: str,
        project: Project) -> None:
    """The engine's PostgreSQL links go silent and new ones are refused (a proxy in front of the
    run's) right after a store's first check: a write made meanwhile (through the control plane, which is
    not behind the proxy) is committed but cannot be followed, so a check asking for it is
    ``revision_not_reached``, 503 with ``Retry-After`` and this engine's revision, within the
    bound; once the engine has replaced its links, the same check is answered."""
    store_id, r0 = await new_store(project, "doc:1")
    async with pg_proxy(database_url) as proxy:
        env = {**engine_env, "DATABASE_URL": proxy.url(database_url),
               "SERVICE_CONSISTENCY_TIMEOUT_MS": "1000"}
        async with on_demand_engine(http, env) as (served, _receiver):
            first = await check(served, project, store_id, "doc:1", at_least=r0)
            assert (first.status, first.body["revision"]) == (200, r0), first.body
            proxy.stall()
            proxy.refusing = True  # and no new link either
            r1 = await write(project, store_id, "doc:2")
            late = await check(served, project, store_id, "doc:2", at_least=r1)
            assert late.status == 503, late.body
            assert late.body["error"]["code"] == "revision_not_reached"
            assert late.body["error"]["details"] == {"requested": r1, "current": r0}
            assert late.headers["Retry-After"] == "1"
            proxy.go_up()

            async def caught_up() -> bool:
                a = await check(served, project, store_id, "doc:2", at_least=r1)
                return bool(a.status == 200 and a.body["allowed"])

            await eventually(caught_up, within=40, what="the engine following the log again")


# -- behind deploy/nginx-sharded.conf ------------------------------------------------------------


def _bench_ring() -> Any:
    """``bench/bench_shards.py``'s model of nginx's ring (the simulation's, checked here)."""
    spec = importlib.util.spec_from_file_location("bench_shards", ROOT / "bench" / "bench_shards.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("bench_shards")
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_shards"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module.Ring


async def test_the_sharded_ingress_sends_each_store_to_one_replica_the_ring_predicts(
        http: ClientSession, engine_env: dict[str, str], project: Project,
        nginx_binary: str) -> None:
    """Two on-demand engines behind nginx with ``deploy/nginx-sharded.conf`` (``hash
    $authio_store_id consistent``): a store's checks and batch checks all reach one engine, the
    one ``bench/bench_shards.py``'s ring names for it, and the other never loads it."""
    stores = [(await new_store(project, "doc:1"))[0] for _ in range(8)]
    async with on_demand_engine(http, engine_env) as (first, _r1), \
            on_demand_engine(http, engine_env) as (second, _r2):
        engines = [first, second]
        servers = [e.api.base_url.removeprefix("http://") for e in engines]
        site = (ROOT / "deploy" / "nginx-sharded.conf").read_text()
        for name, server in (("engine-0.authio-engine:8081", servers[0]),
                             ("engine-1.authio-engine:8081", servers[1])):
            assert name in site
            site = site.replace(name, server)
        site = re.sub(r"\n\s*server engine-2\.authio-engine:8081[^;]*;", "", site)
        site = site.replace("control-plane:8080", project.api.base_url.removeprefix("http://"))
        port = free_ports(1)[0]
        assert "listen 80;" in site and "include authio-routes.conf;" in site
        site = site.replace("listen 80;", f"listen 127.0.0.1:{port};").replace(
            "include authio-routes.conf;", f"include {ROOT / 'deploy' / 'authio-routes.conf'};")
        ring = _bench_ring()(servers)
        with nginx_serving(nginx_binary, site, port) as ingress:
            via = project.api.__class__(http, ingress.base_url, project.key)
            for store_id in stores:
                for _ in range(3):
                    a = await via.post(f"/v1/stores/{store_id}/check", {"tuple_key": tk("doc:1")})
                    assert (a.status, a.body["allowed"]) == (200, True), a.body
                    b = await via.post(f"/v1/stores/{store_id}/batch-check",
                                       {"checks": [{"tuple_key": tk("doc:1")}]})
                    assert (b.status, b.body["results"][0]["allowed"]) == (200, True), b.body
            listing = await via.get("/v1/stores")  # everything else: the control plane
            assert listing.status == 200, listing.body
        for store_id in stores:
            owner = ring.server(store_id)
            for i, engine in enumerate(engines):
                loaded = lines(engine, f"engine loaded store {store_id}")
                assert len(loaded) == (1 if i == owner else 0), (store_id, i, owner)
        # Eight stores on two replicas: both got some (all on one: a chance of 2**-7).
        assert {ring.server(s) for s in stores} == {0, 1}


async def test_the_sharded_ingress_hashes_the_store_of_each_kind_of_request(
        http: ClientSession, nginx_binary: str) -> None:
    """``deploy/nginx-sharded.conf``'s key (its two maps, served back by nginx): the path's store
    for checks and batch checks, the ``store_id`` query parameter or else the
    ``Service-Check-Store`` header on ``/v1/edge/``, and nothing (round robin) for the rest."""
    conf = (ROOT / "deploy" / "nginx-sharded.conf").read_text()
    maps = re.findall(r"^map .*?^\}", conf, flags=re.MULTILINE | re.DOTALL)
    assert len(maps) == 2, maps
    port = free_ports(1)[0]
    site = "\n".join(maps) + (f"\nserver {{ listen 127.0.0.1:{port}; "
                              "location / { return 200 \"[$authio_store_id]\"; } }")
    cases = [
        ("POST", "/v1/stores/store_a/check", {}, "[store_a]"),
        ("POST", "/v1/stores/store_a/batch-check", {}, "[store_a]"),
        ("POST", "/v1/stores/store_a/write", {}, "[]"),
        ("GET", "/v1/stores/store_a", {}, "[]"),
        ("GET", "/v1/edge/validate", {}, "[]"),
        ("GET", "/v1/edge/validate?store_id=store_b&object=doc:1&relation=viewer", {}, "[store_b]"),
        ("GET", "/v1/edge/auth/app/page", {"Service-Check-Store": "store_c"}, "[store_c]"),
        ("GET", "/v1/edge/auth?store_id=store_b", {"Service-Check-Store": "store_c"}, "[store_b]"),
    ]
    with nginx_serving(nginx_binary, site, port) as ingress:
        for method, path, headers, key in cases:
            async with http.request(method, ingress.base_url + path, headers=headers) as r:
                assert (r.status, await r.text()) == (200, key), (method, path, headers)
