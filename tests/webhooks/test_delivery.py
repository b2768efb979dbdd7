"""Webhook deliveries end to end: events written through the API reach a real receiver, signed
(verified by ``standardwebhooks``), with the body and headers of DESIGN.md; retries, Retry-After,
410, a spent schedule, recover, replay, rotation; only what an endpoint subscribed to, and only
what was written after it was created."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import asyncpg

from control_plane.webhooks.tasks import purge
from tests.fixtures.database import events
from tests.fixtures.identity import email
from tests.fixtures.service import Project, assert_error, eventually, ts
from tests.webhooks.helpers import deliveries, receiver, subscribe

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$")


async def _user(project: Project) -> str:
    r = await project.api.post("/v1/users", {"email": email()})
    assert r.status == 201, r.body
    return str(r.body["id"])


async def test_an_event_arrives_signed_as_the_audit_log_lists_it(hooks_project: Project) -> None:
    api = hooks_project.api
    async with receiver() as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        user_id = await _user(hooks_project)
        [got] = await hooks.wait_for(1)
        assert got.verified == {hooks.secrets[0]: True}
        listed = await api.get(f"/v1/audit/events?type=user.created&user={user_id}")
        [event] = listed.body["data"]
        assert got.json == {"id": event["id"], "type": "user.created",
                            "timestamp": event["created_at"], "data": event}
        assert got.headers["webhook-id"] == event["id"]
        assert abs(int(got.headers["webhook-timestamp"]) - datetime.now(UTC).timestamp()) < 60
        assert got.headers["content-type"] == "application/json"
        assert TRACEPARENT.match(got.headers["traceparent"]), got.headers
        [delivery] = await deliveries(api, endpoint["id"],
                                      until=lambda d: bool(d) and d[0]["status"] == "succeeded")
        assert delivery["event_id"] == event["id"] and delivery["event_type"] == "user.created"
        assert delivery["next_attempt_at"] is None
        [attempt] = delivery["attempts"]
        assert attempt["status_code"] == 200 and attempt["error"] is None
        assert attempt["duration_ms"] >= 0 and ts(attempt["at"])
        await asyncio.sleep(1.0)
        assert len(hooks.received) == 1  # not sent twice


async def test_only_subscribed_events_written_after_the_endpoint(hooks_project: Project) -> None:
    api = hooks_project.api
    before = await _user(hooks_project)  # written before any endpoint exists
    async with receiver() as users, receiver() as everything:
        await subscribe(api, users, ["user.deleted"])
        await subscribe(api, everything, ["*"])
        doomed = await _user(hooks_project)
        assert (await api.delete(f"/v1/users/{doomed}")).status == 200
        [deleted] = await users.wait_for(1)
        assert deleted.json["type"] == "user.deleted" and deleted.json["data"]["target_id"] == doomed
        got = await everything.wait_for(2)
        types = [g.json["type"] for g in got]
        assert "user.created" in types and "user.deleted" in types
        assert before not in {g.json["data"]["target_id"] for g in got}
        await asyncio.sleep(1.0)
        assert len(users.received) == 1


async def test_retries_keep_the_id_and_honour_retry_after(hooks_project: Project) -> None:
    api = hooks_project.api
    async with receiver(answers=[500, 503, 200], retry_after="2") as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        await _user(hooks_project)
        got = await hooks.wait_for(3, within=30)
        assert len({g.headers["webhook-id"] for g in got}) == 1
        assert all(g.verified[hooks.secrets[0]] for g in got)
        # The schedule says 0.3 s; the 503's (and the 500's) Retry-After of 2 s wins.
        assert got[1].at - got[0].at >= 1.9 and got[2].at - got[1].at >= 1.9
        [delivery] = await deliveries(api, endpoint["id"],
                                      until=lambda d: bool(d) and d[0]["status"] == "succeeded")
        assert [a["status_code"] for a in delivery["attempts"]] == [500, 503, 200]
        assert delivery["attempts"][0]["error"].startswith("HTTP 500")


async def test_a_spent_schedule_fails_then_recover_sends_again(hooks_project: Project,
                                                               db: asyncpg.Pool) -> None:
    api = hooks_project.api
    async with receiver(answers=[500]) as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        since = datetime.now(UTC) - timedelta(seconds=5)
        await _user(hooks_project)
        [delivery] = await deliveries(api, endpoint["id"],
                                      until=lambda d: bool(d) and d[0]["status"] == "failed")
        assert len(delivery["attempts"]) == 4  # 1 + the schedule's 3 retries
        assert delivery["next_attempt_at"] is None
        assert len(hooks.received) == 4
        hooks.answers = [200]
        r = await api.post(f"/v1/webhook-endpoints/{endpoint['id']}/recover",
                           {"since": since.isoformat()})
        assert r.status == 200 and r.body["requeued"] == 1, r.body
        [delivery] = await deliveries(api, endpoint["id"],
                                      until=lambda d: d[0]["status"] == "succeeded")
        assert len(delivery["attempts"]) == 5 and len(hooks.received) == 5
        nothing = await api.post(f"/v1/webhook-endpoints/{endpoint['id']}/recover",
                                 {"since": since.isoformat()})
        assert nothing.body["requeued"] == 0
        status = await db.fetchval("SELECT status FROM webhook_endpoints WHERE id = $1",
                                   endpoint["id"])
        assert status == "active"  # failures for five days disable; four do not


async def test_410_disables_the_endpoint_at_once(hooks_project: Project) -> None:
    api = hooks_project.api
    async with receiver(answers=[410]) as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        await _user(hooks_project)
        [delivery] = await deliveries(api, endpoint["id"],
                                      until=lambda d: bool(d) and d[0]["status"] == "failed")
        assert [a["status_code"] for a in delivery["attempts"]] == [410]
        shown = await api.get(f"/v1/webhook-endpoints/{endpoint['id']}")
        assert (shown.body["status"], shown.body["disabled_reason"]) == ("disabled", "gone")
        await _user(hooks_project)  # nothing for a disabled endpoint
        assert_error(await api.post(f"/v1/webhook-deliveries/{delivery['id']}/replay"),
                     400, "invalid_request")
        await asyncio.sleep(1.0)
        assert len(hooks.received) == 1


async def test_replay_sends_the_same_message_again(hooks_project: Project,
                                                   db: asyncpg.Pool) -> None:
    api = hooks_project.api
    async with receiver() as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        await _user(hooks_project)
        [first] = await hooks.wait_for(1)
        [delivery] = await deliveries(api, endpoint["id"],
                                      until=lambda d: bool(d) and d[0]["status"] == "succeeded")
        r = await api.post(f"/v1/webhook-deliveries/{delivery['id']}/replay")
        assert r.status == 200 and r.body["id"] == delivery["id"], r.body
        assert r.body["status"] == "pending"
        got = await hooks.wait_for(2)
        assert got[1].headers["webhook-id"] == first.headers["webhook-id"]
        assert got[1].json == first.json and got[1].verified[hooks.secrets[0]]
        [event] = await events(db, hooks_project.id, "webhook.delivery.replayed")
        assert event["target_id"] == delivery["id"]
        assert event["metadata"]["endpoint_id"] == endpoint["id"]
    assert_error(await api.post("/v1/webhook-deliveries/dlv_00000000000000000000000000/replay"),
                 404, "not_found")


async def test_after_a_rotation_both_secrets_verify(hooks_project: Project) -> None:
    api = hooks_project.api
    async with receiver() as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        old = hooks.secrets[0]
        r = await api.post(f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret")
        new = r.body["secret"]
        hooks.secrets.append(new)
        await _user(hooks_project)
        [got] = await hooks.wait_for(1)
        assert got.verified == {old: True, new: True}
        assert len(got.headers["webhook-signature"].split(" ")) == 2


async def test_a_deleted_endpoint_receives_nothing_more(hooks_project: Project,
                                                        db: asyncpg.Pool) -> None:
    api = hooks_project.api
    async with receiver(answers=[500]) as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        await _user(hooks_project)
        await hooks.wait_for(1)
        assert (await api.delete(f"/v1/webhook-endpoints/{endpoint['id']}")).status == 200
        count = len(hooks.received)
        await asyncio.sleep(1.5)  # past the next retry
        assert len(hooks.received) <= count + 1  # at most the attempt already under way
        assert await db.fetchval("SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1",
                                 endpoint["id"]) == 0


async def test_five_days_of_nothing_but_failures_disable_the_endpoint(
        hooks_project: Project, db: asyncpg.Pool) -> None:
    """An endpoint failing since more than five days ago (its first failure moved back in the
    database: nobody waits five days) is disabled by its next failure, with the reason
    ``failing``; one success in between would have cleared it."""
    api = hooks_project.api
    async with receiver(answers=[500], retry_after="2") as hooks:  # retries 2 s apart
        endpoint = await subscribe(api, hooks, ["user.created"])
        await _user(hooks_project)
        await hooks.wait_for(1)

        async def failing() -> bool:  # the first failure recorded
            return await db.fetchval("SELECT failing_since IS NOT NULL FROM webhook_endpoints "
                                     "WHERE id = $1", endpoint["id"])
        await eventually(failing, what="the first failure recorded")
        await db.execute("UPDATE webhook_endpoints SET failing_since = now() - interval '5 days 1 minute' "
                         "WHERE id = $1", endpoint["id"])

        async def disabled() -> bool:
            r = await api.get(f"/v1/webhook-endpoints/{endpoint['id']}")
            return (r.body["status"], r.body["disabled_reason"]) == ("disabled", "failing")
        await eventually(disabled, what="the endpoint disabled as failing")
    async with receiver() as fine:
        endpoint = await subscribe(api, fine, ["user.created"])
        await _user(hooks_project)
        await fine.wait_for(1)
        await deliveries(api, endpoint["id"],
                         until=lambda d: bool(d) and d[0]["status"] == "succeeded")
        assert await db.fetchval("SELECT failing_since FROM webhook_endpoints WHERE id = $1",
                                 endpoint["id"]) is None


async def test_deliveries_done_a_month_ago_are_purged(hooks_project: Project,
                                                      db: asyncpg.Pool) -> None:
    """The purge the workers run every housekeeping interval, run here at once."""
    api = hooks_project.api
    async with receiver() as hooks:
        endpoint = await subscribe(api, hooks, ["user.created"])
        await _user(hooks_project)
        await _user(hooks_project)
        done = await deliveries(api, endpoint["id"], until=lambda d: len(d) == 2 and all(
            x["status"] == "succeeded" for x in d))
    old, recent = done[1]["id"], done[0]["id"]
    await db.execute("UPDATE webhook_deliveries SET created_at = now() - interval '31 days' "
                     "WHERE id = $1", old)
    assert (await purge(db))["webhook_deliveries"] >= 1
    left = [d["id"] for d in (await api.get(
        f"/v1/webhook-endpoints/{endpoint['id']}/deliveries")).body["data"]]
    assert left == [recent]
