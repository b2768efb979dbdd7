"""The fan-out from the audit log and the delivery worker under the faults that matter: a writing
transaction that commits after later ones (never passed), and a process killed in the middle of
a delivery and of a retry schedule (another process finishes, nothing lost)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession, web

from common.ids import new_id
from control_plane.web import outbound
from control_plane.webhooks import repository
from control_plane.webhooks.tasks import FANOUT_BATCH, JITTER, retry_delay
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.identity import email
from tests.fixtures.service import (
    Project,
    bootstrap_project,
    eventually,
    loopback_app,
    serve_process,
)
from tests.webhooks.helpers import deliveries, receiver, subprocess_env, subscribe


async def test_a_late_committing_event_is_never_passed(hooks_project: Project,
                                                       db: asyncpg.Pool) -> None:
    """A transaction that wrote an event and stays open holds the fan-out back: the events
    committed after it wait (none is delivered ahead of it), and once it commits every one of
    them is delivered. A reader on ``(created_at, id)`` would have passed the held event."""
    api = hooks_project.api
    async with receiver() as hooks:
        await subscribe(api, hooks, ["*"])
        [own] = await hooks.wait_for(1)  # the endpoint's own creation committed with it
        assert own.json["type"] == "webhook.endpoint.created"
        hooks.received.clear()
        held_id = new_id("evt")
        async with db.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await conn.execute(
                """INSERT INTO audit_events (id, action, actor_type, actor_id, project_id, metadata)
                   VALUES ($1, 'test.held_open', 'system', 'test', $2, '{}')""",
                held_id, hooks_project.id)
            later = []
            for _ in range(3):
                r = await api.post("/v1/users", {"email": email()})
                later.append(r.body["id"])
            await asyncio.sleep(1.5)  # six fan-out passes
            assert hooks.received == []  # nothing passes the open transaction
            await tx.commit()
        got = await hooks.wait_for(4)
        assert {g.json["id"] for g in got} >= {held_id}
        assert {g.json["data"]["target_id"] for g in got if g.json["type"] == "user.created"} \
            == set(later)


async def test_a_transaction_open_in_another_database_holds_nothing_back(
        hooks_project: Project, database_url: str) -> None:
    """Transaction ids are the whole server's, but another database's transaction cannot write
    this one's log: one held open there (the suite's own database) delays nothing here."""
    async with receiver() as hooks:
        await subscribe(hooks_project.api, hooks, ["user.created"])
        elsewhere = await asyncpg.connect(database_url)
        try:
            await elsewhere.execute("BEGIN")
            assert await elsewhere.fetchval("SELECT pg_current_xact_id()")  # an id, running
            await hooks_project.api.post("/v1/users", {"email": email()})
            [got] = await hooks.wait_for(1, within=15)
            assert got.json["type"] == "user.created"
        finally:
            await elsewhere.close()


def test_retry_delays_follow_the_schedule_with_jitter() -> None:
    delays = (5.0, 300.0)
    assert retry_delay(1, delays, None, rng=lambda: 0.0) == pytest.approx(5 * (1 - JITTER))
    assert retry_delay(1, delays, None, rng=lambda: 1.0) == pytest.approx(5 * (1 + JITTER))
    assert retry_delay(2, delays, None, rng=lambda: 0.5) == pytest.approx(300)
    assert retry_delay(3, delays, None) is None  # spent: 1 + 2 attempts in all
    assert retry_delay(1, delays, 60.0, rng=lambda: 0.5) == 60.0  # a longer Retry-After wins
    assert retry_delay(2, delays, 60.0, rng=lambda: 0.5) == pytest.approx(300)
    assert retry_delay(1, delays, 10 ** 9, rng=lambda: 0.5) == 86_400.0  # bounded


async def test_a_name_resolving_to_this_machine_is_refused_at_the_attempt() -> None:
    """The guard is applied when the request is made, after DNS, whatever the endpoint's URL
    looked like when it was created: this machine's own name resolves to a non-public address
    (loopback or a private network on any test box)."""
    own = socket.gethostname()
    async with receiver() as hooks, outbound.client(timeout_seconds=2, allow_private=False) as s:
        port = hooks.url.split(":")[2].split("/")[0]
        answer = await outbound.post(s, f"https://{own}:{port}/hooks", b"{}", {},
                                     allow_private=False, timeout_seconds=2)
        assert answer.status is None and answer.error is not None
        assert answer.error.startswith("refused:") and "no public address" in answer.error
        assert hooks.received == []
        literal = await outbound.post(s, f"https://127.0.0.1:{port}/hooks", b"{}", {},
                                      allow_private=False, timeout_seconds=2)
        assert literal.error is not None and literal.error.startswith("refused:")


async def test_redirects_are_not_followed_and_answers_are_capped() -> None:
    hits: list[str] = []

    async def redirect(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        if request.path == "/big":
            return web.Response(status=500, body=b"x" * 1_000_000)
        raise web.HTTPTemporaryRedirect("/elsewhere")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    async with loopback_app(app) as port:
        async with outbound.client(timeout_seconds=2, allow_private=True) as s:
            moved = await outbound.post(s, f"http://127.0.0.1:{port}/hooks", b"{}", {},
                                        allow_private=True, timeout_seconds=2)
            assert moved.status == 307 and moved.error is not None
            big = await outbound.post(s, f"http://127.0.0.1:{port}/big", b"{}", {},
                                      allow_private=True, timeout_seconds=2)
            assert big.status == 500 and big.error is not None and len(big.error) < 300
        assert hits == ["/hooks", "/big"]  # never /elsewhere


# --- a process killed mid-delivery ---------------------------------------------------------------


@pytest.fixture(scope="module")
def crash_database_url(database_url: str) -> Iterator[str]:
    """A database for the crash test alone: no in-process service delivers from it."""
    with migrated_database(database_url, "webhooks_crash") as url:
        yield url


async def test_a_killed_process_loses_nothing(http: ClientSession, crash_database_url: str,
                                              redis_url: str, redis_prefix: str) -> None:
    """``kill -9`` while a webhook delivery is in flight and others wait for their retry, and
    while an audit stream's batch is in flight; a new process delivers every event, the ones in
    flight again once their lease ran out (at least once: the same ``webhook-id``), the stream
    in the log's order with no gap, and the events written to the new process too."""
    env = subprocess_env(crash_database_url, redis_url, redis_prefix)
    # The first request of each is held until the process is killed: never recorded.
    async with receiver(answers=[500, 500, 200], hold_first=5) as hooks, \
            receiver(hold_first=5) as streamed:
        async with serve_process(http, env, "control-plane") as a:
            project = await bootstrap_project(a.api, "crash")
            await subscribe(project.api, hooks, ["user.created"])
            r = await project.api.post("/v1/audit/streams", {
                "destination": {"type": "webhook", "url": streamed.url},
                "actions": ["user.created"]})
            assert r.status == 201, r.body
            streamed.secrets.append(r.body["secret"])
            for _ in range(5):
                assert (await project.api.post("/v1/users", {"email": email()})).status == 201
            await asyncio.wait_for(hooks.first.wait(), 20)
            await asyncio.wait_for(streamed.first.wait(), 20)
            a.proc.kill()
            await a.proc.wait()
        async with serve_process(http, env, "control-plane") as b:
            api = b.api.with_key(project.key)
            for _ in range(5):
                assert (await api.post("/v1/users", {"email": email()})).status == 201
            async with database_pool(crash_database_url) as pool:
                in_order = [r["id"] for r in await pool.fetch(
                    "SELECT id FROM audit_events WHERE project_id = $1 AND action = 'user.created' "
                    "ORDER BY tx, id", project.id)]
                wanted = set(in_order)
                assert len(wanted) == 10

                async def all_delivered() -> bool:
                    done = {g.headers["webhook-id"] for g in hooks.received
                            if g.verified[hooks.secrets[0]]}
                    return done >= wanted
                await eventually(all_delivered, within=60, what="every event delivered")

                async def all_streamed() -> bool:
                    seen = [e["id"] for g in streamed.received if g.verified[streamed.secrets[0]]
                            for e in g.json["events"]]
                    return list(dict.fromkeys(seen)) == in_order
                await eventually(all_streamed, within=60, what="the stream, in order, no gap")
                endpoint_id = await pool.fetchval(
                    "SELECT id FROM webhook_endpoints WHERE project_id = $1", project.id)
            found = await deliveries(api, endpoint_id,
                                     until=lambda d: len(d) == 10 and all(
                                         x["status"] == "succeeded" for x in d), within=60)
            assert {d["event_id"] for d in found} == wanted
            bodies = {g.headers["webhook-id"]: orjson.loads(g.body)["id"] for g in hooks.received}
            assert all(k == v for k, v in bodies.items())


def _log_rows_read(plan: dict[str, object]) -> int:
    """The rows every scan of the audit log's partitions returned in an EXPLAIN ANALYZE plan."""
    rows = 0
    if str(plan.get("Relation Name", "")).startswith("audit_events"):
        rows += int(plan["Actual Rows"]) * int(plan.get("Actual Loops", 1))  # type: ignore[call-overload]
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        rows += _log_rows_read(child)
    return rows


async def test_a_fan_out_pass_reads_the_log_from_its_position_only(
        hooks_project: Project, db: asyncpg.Pool) -> None:
    """A pass starts at the fan-out's position in the log's ``(tx, id)`` index: once the events
    are fanned out, a pass reads none of them again (one that joined the position's row read the
    whole log every 0.25 s: 110 ms a pass at 100,000 events, and growing with the log)."""
    async with db.acquire() as conn:
        await conn.execute(
            """INSERT INTO audit_events (id, action, actor_type, actor_id, project_id, metadata)
               SELECT 'evt_' || upper(substr(md5(random()::text), 1, 26)), 'test.bulk', 'system',
                      'test', $1, '{}' FROM generate_series(1, 2000)""", hooks_project.id)

        async def fanned_out() -> bool:
            return bool(await conn.fetchval(
                """SELECT (f.tx, f.event_id) >= (SELECT tx, id FROM audit_events
                                                  ORDER BY tx DESC, id DESC LIMIT 1)
                   FROM webhook_fanout f"""))
        await eventually(fanned_out, within=15)
        [plan] = orjson.loads(await conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + repository.FANOUT, repository.FANOUT_LOCK,
            FANOUT_BATCH))
    assert _log_rows_read(plan["Plan"]) <= 10  # what committed since, not the 2,000
