"""Audit streams through the API (DESIGN.md "audit streams"): the whole log of a project, in
order and in batches (3 events here), to a signed webhook, Datadog's logs intake and Splunk's
HTTP Event Collector (local receivers checking each one's documented request shape); a failing
batch retried with exactly the same events and nothing after it sent first; pause and resume;
credentials never shown."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import orjson
import pytest

from tests.fixtures.database import events
from tests.fixtures.identity import email
from tests.fixtures.service import Project, assert_error, assert_invalid_field, eventually
from tests.webhooks.helpers import Received, receiver

BATCH = 3  # helpers.SETTINGS["stream_batch_size"]


async def _users(project: Project, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = await project.api.post("/v1/users", {"email": email()})
        assert r.status == 201, r.body
        ids.append(r.body["id"])
    return ids


async def _created_events(db: asyncpg.Pool, project: Project) -> list[str]:
    """The project's ``user.created`` event ids in the log's order."""
    rows = await db.fetch("SELECT id FROM audit_events WHERE project_id = $1 AND "
                          "action = 'user.created' ORDER BY tx, id", project.id)
    return [r["id"] for r in rows]


def _streamed(received: list[Received]) -> list[dict[str, Any]]:
    return [e for g in received for e in g.json["events"]]


async def _stream(project: Project, destination: dict[str, Any], **more: Any) -> dict[str, Any]:
    r = await project.api.post("/v1/audit/streams", {"destination": destination, **more})
    assert r.status == 201, r.body
    return dict(r.body)


async def test_a_webhook_stream_carries_the_log_in_order_signed(hooks_project: Project,
                                                                db: asyncpg.Pool) -> None:
    async with receiver() as hooks:
        stream = await _stream(hooks_project, {"type": "webhook", "url": hooks.url},
                               actions=["user.created"], description="SIEM")
        assert stream["id"].startswith("strm_") and stream["secret"].startswith("whsec_")
        assert stream["destination"] == {"type": "webhook", "url": hooks.url}
        assert (stream["status"], stream["actions"], stream["lag"]) == ("active", ["user.created"], 0)
        hooks.secrets.append(stream["secret"])
        path = f"/v1/audit/streams/{stream['id']}"
        # Written while paused, so that they are all there when it resumes: full batches.
        await hooks_project.api.request("PATCH", path, json={"status": "paused"})
        await _users(hooks_project, 7)
        await hooks_project.api.request("PATCH", path, json={"status": "active"})
        wanted = await _created_events(db, hooks_project)

        async def all_in() -> bool:
            return [e["id"] for e in _streamed(hooks.received)] == wanted
        await eventually(all_in, what="the 7 events, in order")
        assert [len(g.json["events"]) for g in hooks.received] == [3, 3, 1]
        for got in hooks.received:
            assert got.json["stream_id"] == stream["id"]
            assert got.headers["webhook-id"] == f"{stream['id']}:{got.json['events'][0]['id']}"
            assert got.verified == {stream["secret"]: True}
        listed = await hooks_project.api.get("/v1/audit/events?type=user.created&limit=1")
        assert _streamed(hooks.received)[-1] == listed.body["data"][0]  # as the API lists it

        shown = await hooks_project.api.get(f"/v1/audit/streams/{stream['id']}")
        assert shown.status == 200 and shown.body.get("secret") is None
        assert shown.body["lag"] == 0 and shown.body["last_delivered_at"] is not None
        assert shown.body["last_error"] is None
        [created] = await events(db, hooks_project.id, "audit.stream.created")
        assert stream["secret"] not in orjson.dumps(created).decode()


async def test_a_stream_that_caught_up_takes_the_next_event_at_once(
        hooks_project: Project, caplog: pytest.LogCaptureFixture) -> None:
    """A stream with nothing new looks again after 0.25 s (0.75 s once quiet for 30 s), not
    after its lease (16 s here): the next event arrives within seconds, and the idle passes
    between log no error (they failed once, each stream then waiting out its lease). Only this
    stream's records count: the suite's other services run their own workers in this process."""
    caplog.set_level(logging.ERROR, logger="authio.audit")
    async with receiver() as hooks:
        stream = await _stream(hooks_project, {"type": "webhook", "url": hooks.url},
                               actions=["user.created"])
        hooks.secrets.append(stream["secret"])
        await _users(hooks_project, 1)
        await hooks.wait_for(1)
        await asyncio.sleep(1.0)  # caught up: idle passes run
        await _users(hooks_project, 1)
        await hooks.wait_for(2, within=5.0)
    assert [r.getMessage() for r in caplog.records
            if r.name == "authio.audit" and stream["id"] in r.getMessage()] == []


async def test_a_failing_batch_is_retried_alone_and_unchanged(hooks_project: Project,
                                                              db: asyncpg.Pool) -> None:
    async with receiver(answers=[503, 500, 200], retry_after="1") as hooks:
        stream = await _stream(hooks_project, {"type": "webhook", "url": hooks.url},
                               actions=["user.created"])
        path = f"/v1/audit/streams/{stream['id']}"
        await hooks_project.api.request("PATCH", path, json={"status": "paused"})
        await _users(hooks_project, 2)  # both in the first batch
        await hooks_project.api.request("PATCH", path, json={"status": "active"})
        await hooks.wait_for(1)

        async def failing() -> Any:
            # The worker records the 503 after the receiver answered it (a loaded box shows the
            # gap); it stays failing until the third attempt, 1 s and more later.
            shown = await hooks_project.api.get(f"/v1/audit/streams/{stream['id']}")
            return shown if shown.body["status"] == "failing" else None
        shown = await eventually(failing, within=5, what="the stream marked failing")
        assert "503" in shown.body["last_error"]
        assert shown.body["lag"] >= 2
        await _users(hooks_project, 4)  # written while the first batch fails
        wanted = await _created_events(db, hooks_project)

        async def all_in() -> bool:
            return wanted == [e["id"] for e in _streamed(hooks.received[2:])]
        await eventually(all_in, within=30, what="every event after the retries")
        first, second, third = hooks.received[:3]
        assert first.body == second.body == third.body  # exactly the same events, never more
        assert first.headers["webhook-id"] == third.headers["webhook-id"]
        assert [e["id"] for e in third.json["events"]] == wanted[:2]
        shown = await hooks_project.api.get(f"/v1/audit/streams/{stream['id']}")
        assert (shown.body["status"], shown.body["last_error"], shown.body["lag"]) == \
            ("active", None, 0)


async def test_pause_and_resume_lose_nothing(hooks_project: Project, db: asyncpg.Pool) -> None:
    async with receiver() as hooks:
        stream = await _stream(hooks_project, {"type": "webhook", "url": hooks.url},
                               actions=["user.created"])
        path = f"/v1/audit/streams/{stream['id']}"
        paused = await hooks_project.api.request("PATCH", path, json={"status": "paused"})
        assert paused.status == 200 and paused.body["status"] == "paused"
        await _users(hooks_project, 4)
        await asyncio.sleep(1.0)
        assert hooks.received == []
        shown = await hooks_project.api.get(path)
        assert shown.body["lag"] == 4
        resumed = await hooks_project.api.request("PATCH", path, json={"status": "active"})
        assert resumed.body["status"] == "active"
        wanted = await _created_events(db, hooks_project)

        async def all_in() -> bool:
            return [e["id"] for e in _streamed(hooks.received)] == wanted
        await eventually(all_in, what="the events written while paused")
        assert len(await events(db, hooks_project.id, "audit.stream.updated")) == 2


async def test_datadog_logs_intake(hooks_project: Project) -> None:
    async with receiver(answers=[202]) as intake:
        base = intake.url.removesuffix("/hooks")
        stream = await _stream(hooks_project, {
            "type": "datadog", "api_key": "dd-secret-key", "site": "datadoghq.eu",
            "url": f"{base}/api/v2/logs"}, actions=["user.created"])
        assert stream["destination"] == {"type": "datadog", "api_key": "***",
                                         "site": "datadoghq.eu", "url": f"{base}/api/v2/logs"}
        assert stream.get("secret") is None
        [user] = await _users(hooks_project, 1)
        [got] = await intake.wait_for(1)
        assert got.headers["dd-api-key"] == "dd-secret-key"
        assert got.headers["content-type"] == "application/json"
        [log] = got.json
        assert log["ddsource"] == "authio" and log["service"] == "authio-audit"
        assert log["evt"]["name"] == "user.created" and log["evt"]["id"] == log["audit"]["id"]
        assert log["audit"]["target_id"] == user and log["date"] == log["audit"]["created_at"]
        assert f"project:{hooks_project.id}" in log["ddtags"]
        listed = await hooks_project.api.get("/v1/audit/streams")
        assert "dd-secret-key" not in listed.raw.decode()


async def test_splunk_http_event_collector(hooks_project: Project) -> None:
    async with receiver() as hec:
        base = hec.url.removesuffix("/hooks")
        stream = await _stream(hooks_project, {"type": "splunk_hec", "url": base,
                                               "token": "hec-token", "index": "audit"},
                               actions=["user.created"])
        assert stream["destination"]["token"] == "***"
        await _users(hooks_project, 2)

        async def both_events() -> list[Any]:  # in one batch, or two when the box is slow
            lines = [orjson.loads(line) for got in hec.received for line in got.body.split(b"\n")]
            return lines if len(lines) >= 2 else []
        lines = await eventually(both_events, what="the two users' events at the collector")
        assert len(lines) == 2
        assert {got.headers["authorization"] for got in hec.received} == {"Splunk hec-token"}
        for line in lines:
            assert line["sourcetype"] == "_json" and line["index"] == "audit"
            assert line["event"]["action"] == "user.created" and isinstance(line["time"], float)


async def test_bad_streams_are_refused(hooks_project: Project, project: Project) -> None:
    api = hooks_project.api
    assert_invalid_field(await api.post("/v1/audit/streams", {"destination": {"type": "kafka"}}),
                         "destination")
    r = await api.post("/v1/audit/streams", {"destination": {"type": "datadog"}})
    assert_invalid_field(r, "destination.datadog.api_key")
    r = await api.post("/v1/audit/streams", {"destination": {"type": "webhook",
                                                             "url": "http://127.0.0.1:9/"},
                                             "actions": []})
    assert_invalid_field(r, "actions")
    r = await api.post("/v1/audit/streams", {"destination": {
        "type": "nats", "servers": ["nats://" + "n" * 64 + ".example.com:4222"],
        "subject": "audit"}})
    assert_invalid_field(r, "destination.servers.0")  # no resolver takes a 64-character label
    # The suite's service keeps the default rule: https and public addresses only.
    r = await project.api.post("/v1/audit/streams", {"destination": {
        "type": "splunk_hec", "url": "https://127.0.0.1:8088", "token": "t"}})
    assert_invalid_field(r, "destination.url")
    assert_error(await api.get("/v1/audit/streams/strm_nope"), 404, "not_found")
    narrow = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "reader",
                                                     "scopes": ["audit:read"]})
    reader = project.api.with_key(narrow.body["secret"])
    assert_error(await reader.post("/v1/audit/streams", {"destination": {
        "type": "webhook", "url": "https://hooks.example.com/"}}), 403, "insufficient_scope")
    assert (await reader.get("/v1/audit/streams")).status == 200


async def test_delete_stops_the_stream(hooks_project: Project) -> None:
    async with receiver() as hooks:
        stream = await _stream(hooks_project, {"type": "webhook", "url": hooks.url},
                               actions=["user.created"])
        r = await hooks_project.api.delete(f"/v1/audit/streams/{stream['id']}")
        assert r.status == 200 and r.body["deleted"] is True
        await _users(hooks_project, 2)
        await asyncio.sleep(1.0)
        assert hooks.received == []
        assert_error(await hooks_project.api.get(f"/v1/audit/streams/{stream['id']}"), 404,
                     "not_found")
