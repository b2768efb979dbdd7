"""Audit streams into real brokers and storage, each a private instance of the test's own:
NATS JetStream (``nats-server -js``; one message per event, ``Nats-Msg-Id`` the event id, so a
batch sent again is stored once) stopped and started again under a stream, and in operator mode
(a user's ``.creds`` signs in; a user of an account the operator never issued is refused), and
S3 (moto in server mode; one create-only object per batch)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import nats
import nkeys
import orjson
import pytest
from aiobotocore.session import get_session
from nats.aio.client import RawCredentials

from control_plane.audit.streams import s3
from control_plane.audit.streams.base import Batch, Context
from control_plane.web import outbound
from tests.fixtures.identity import email
from tests.fixtures.service import Project, eventually
from tests.webhooks.peers import NatsOperator, moto_s3, nats_server, nkey


async def _users(project: Project, n: int) -> None:
    for _ in range(n):
        assert (await project.api.post("/v1/users", {"email": email()})).status == 201


async def _wanted(db: asyncpg.Pool, project: Project) -> list[str]:
    rows = await db.fetch("SELECT id FROM audit_events WHERE project_id = $1 AND "
                          "action = 'user.created' ORDER BY tx, id", project.id)
    return [r["id"] for r in rows]


async def _jetstream_ids(url: str) -> list[str]:
    nc = await nats.connect(servers=[url])
    try:
        js = nc.jetstream()
        info = await js.stream_info("AUDIT")
        ids: list[str] = []
        if not info.state.messages:
            return ids
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg("AUDIT", seq)
            assert msg.headers is not None and msg.data is not None
            assert msg.headers["Nats-Msg-Id"] == orjson.loads(msg.data)["id"]
            ids.append(msg.headers["Nats-Msg-Id"])
        return ids
    finally:
        await nc.close()


async def test_nats_jetstream_through_a_broker_restart(hooks_project: Project, db: asyncpg.Pool,
                                                       tmp_path: Path) -> None:
    with nats_server(tmp_path / "nats") as server:
        nc = await nats.connect(servers=[server.url])
        await nc.jetstream().add_stream(name="AUDIT", subjects=["audit.>"])
        await nc.close()
        r = await hooks_project.api.post("/v1/audit/streams", {
            "destination": {"type": "nats", "servers": [server.url], "subject": "audit.events",
                            "credentials": "-----BEGIN NATS USER JWT-----"},
            "actions": ["user.created"]})
        assert r.status == 201, r.body
        assert r.body["destination"]["credentials"] == "***"
        stream_id = r.body["id"]
        # The broker takes no credentials: a stream without them.
        r = await hooks_project.api.post("/v1/audit/streams", {
            "destination": {"type": "nats", "servers": [server.url], "subject": "audit.events"},
            "actions": ["user.created"]})
        assert (await hooks_project.api.delete(f"/v1/audit/streams/{stream_id}")).status == 200
        stream_id = r.body["id"]
        await _users(hooks_project, 4)

        async def stored(n: int) -> bool:
            return len(await _jetstream_ids(server.url)) >= n
        await eventually(lambda: stored(4), what="4 messages in JetStream")

        server.stop()
        await _users(hooks_project, 2)  # while the broker is away

        async def failing() -> bool:
            shown = await hooks_project.api.get(f"/v1/audit/streams/{stream_id}")
            return shown.body["status"] == "failing" and bool(shown.body["last_error"])
        await eventually(failing, what="the stream failing")
        server.start()  # same port, same store
        wanted = await _wanted(db, hooks_project)

        async def all_in() -> bool:
            return await _jetstream_ids(server.url) == wanted
        await eventually(all_in, within=40, what="every event once, in order, after the restart")
        shown = await hooks_project.api.get(f"/v1/audit/streams/{stream_id}")
        assert (shown.body["status"], shown.body["lag"]) == ("active", 0)


async def test_nats_credentials_in_operator_mode(hooks_project: Project, db: asyncpg.Pool,
                                                 tmp_path: Path) -> None:
    """A stream with a user's ``.creds`` publishes to a server that takes only its operator's
    users; one whose user an unknown account issued is refused by the server and publishes
    nothing."""
    operator = NatsOperator()
    creds = operator.creds()
    with nats_server(tmp_path / "nats", operator) as server:
        nc = await nats.connect(servers=[server.url], user_credentials=RawCredentials(creds))
        try:
            js = nc.jetstream()
            await js.add_stream(name="AUDIT", subjects=["audit.>"])
            stranger = operator.creds(issuer=nkey(nkeys.PREFIX_BYTE_ACCOUNT))
            r = await hooks_project.api.post("/v1/audit/streams", {
                "destination": {"type": "nats", "servers": [server.url],
                                "subject": "audit.refused", "credentials": stranger},
                "actions": ["user.created"]})
            assert r.status == 201, r.body
            refused_id = r.body["id"]
            r = await hooks_project.api.post("/v1/audit/streams", {
                "destination": {"type": "nats", "servers": [server.url],
                                "subject": "audit.events", "credentials": creds},
                "actions": ["user.created"]})
            assert r.status == 201, r.body
            assert r.body["destination"]["credentials"] == "***"
            stream_id = r.body["id"]
            await _users(hooks_project, 4)
            wanted = await _wanted(db, hooks_project)

            consumer = await js.pull_subscribe("audit.>", stream="AUDIT")  # as the same user
            got: list[tuple[str, str]] = []

            async def all_in() -> bool:
                with contextlib.suppress(nats.errors.TimeoutError):
                    for msg in await consumer.fetch(10, timeout=0.5):
                        assert msg.headers is not None
                        assert msg.headers["Nats-Msg-Id"] == orjson.loads(msg.data)["id"]
                        got.append((msg.subject, msg.headers["Nats-Msg-Id"]))
                        await msg.ack()
                return len(got) >= len(wanted)
            await eventually(all_in, what="4 messages through a JetStream consumer")
            assert got == [("audit.events", event_id) for event_id in wanted]

            async def refused() -> dict[str, object] | None:
                shown = await hooks_project.api.get(f"/v1/audit/streams/{refused_id}")
                return shown.body if shown.body["status"] == "failing" else None
            shown = await eventually(refused, what="the stranger's stream failing")
            assert "Authorization Violation" in str(shown["last_error"]), shown
            assert (await js.stream_info("AUDIT")).state.messages == len(wanted)

            async def caught_up() -> bool:
                shown = (await hooks_project.api.get(f"/v1/audit/streams/{stream_id}")).body
                return (shown["status"], shown["lag"]) == ("active", 0)
            await eventually(caught_up, what="the stream acknowledged, lag 0")
        finally:
            await nc.close()


@pytest.fixture
async def s3_endpoint() -> AsyncIterator[str]:
    with moto_s3() as url:
        async with get_session().create_client(
                "s3", region_name="us-east-1", endpoint_url=url, aws_access_key_id="test",
                aws_secret_access_key="test") as client:
            await client.create_bucket(Bucket="audit-archive")
        yield url


async def _objects(url: str) -> dict[str, bytes]:
    async with get_session().create_client(
            "s3", region_name="us-east-1", endpoint_url=url, aws_access_key_id="test",
            aws_secret_access_key="test") as client:
        listed = await client.list_objects_v2(Bucket="audit-archive")
        out = {}
        for item in listed.get("Contents", []):
            got = await client.get_object(Bucket="audit-archive", Key=item["Key"])
            out[item["Key"]] = await got["Body"].read()
        return out


async def test_s3_one_object_per_batch(hooks_project: Project, db: asyncpg.Pool,
                                       s3_endpoint: str) -> None:
    r = await hooks_project.api.post("/v1/audit/streams", {
        "destination": {"type": "s3", "bucket": "audit-archive", "prefix": "authio/",
                        "endpoint_url": s3_endpoint, "access_key_id": "test",
                        "secret_access_key": "test-secret"},
        "actions": ["user.created"]})
    assert r.status == 201, r.body
    shown = r.body["destination"]
    assert (shown["access_key_id"], shown["secret_access_key"]) == ("***", "***")
    stream_id = r.body["id"]
    await _users(hooks_project, 4)
    wanted = await _wanted(db, hooks_project)

    async def all_in() -> bool:
        objects = await _objects(s3_endpoint)
        lines = [orjson.loads(line) for key in sorted(objects, key=lambda k: k.rsplit("/", 1)[1])
                 for line in objects[key].splitlines()]
        return [e["id"] for e in lines] == wanted
    await eventually(all_in, what="4 events in 2 objects")
    objects = await _objects(s3_endpoint)
    assert len(objects) == 2
    for key, body in objects.items():
        prefix, stream, year, month, day, name = key.split("/")
        first = orjson.loads(body.splitlines()[0])
        assert (prefix, stream) == ("authio", stream_id)
        assert name == f"{first['id']}.jsonl"  # the batch's first event names the object
        assert f"{year}-{month}-{day}" == first["created_at"][:10]
        assert name.removesuffix(".jsonl") in wanted


async def test_s3_a_batch_sent_again_is_stored_once(s3_endpoint: str) -> None:
    """A batch whose acknowledgement was lost is sent again: its object exists (create-only
    write, 412), which counts as acknowledged; the object is the first write's."""
    config = {"type": "s3", "bucket": "audit-archive", "endpoint_url": s3_endpoint,
              "access_key_id": "test", "secret_access_key": "test"}
    event = {"id": "evt_01m8hy64kb2r17xq3ne34cqr7p", "created_at": "2026-11-28T20:00:00.000000Z",
             "action": "user.created"}
    async with outbound.client(timeout_seconds=5, allow_private=True) as http:
        ctx = Context(http, True, 5)
        await s3.send(ctx, config, Batch("strm_x", "strm_x:evt", [event]))
        await s3.send(ctx, config, Batch("strm_x", "strm_x:evt", [{**event, "action": "changed"}]))
    [(key, body)] = (await _objects(s3_endpoint)).items()
    assert key == "strm_x/2026/11/28/evt_01m8hy64kb2r17xq3ne34cqr7p.jsonl"
    assert orjson.loads(body)["action"] == "user.created"
