"""Account recovery through the API (issue 23): a request filed for a user who lost every way
in, approved or denied once; approval moves the user's contact to the new destination, revokes
every session (at the edge too) and sends a recovery link that signs the user in there."""

from __future__ import annotations

import re
import secrets

import asyncpg
from redis.asyncio import Redis

from tests.fixtures.database import events
from tests.fixtures.identity import (
    announced_score,
    create_user,
    email,
    latest_link,
    session_call,
    sign_in,
    token_of,
    verify,
)
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import ULID, Api, Project, assert_error, bootstrap_project, scoped

FIELDS = {"id", "user_id", "channel", "destination", "reason", "status", "decision_note",
          "decided_by", "decided_at", "message_id", "created_at", "request_id"}


def phone() -> str:
    return "+1415" + str(secrets.randbelow(10**7)).zfill(7)


async def test_an_approved_request_lets_the_user_in_at_the_new_address_only(
        project: Project, db: asyncpg.Pool, redis: Redis, redis_prefix: str) -> None:
    old, new = email(), email()
    user = await create_user(project.api, old, email_verified=True)
    signed = await sign_in(project, old, count=2)  # the enrollment link, then this one
    assert signed.user_id == user["id"]

    r = await project.api.post("/v1/recovery/requests",
                               {"user_id": user["id"], "email": new, "reason": "ticket 42"})
    assert r.status == 201, r.body
    request = r.body
    assert set(request) == FIELDS
    assert re.fullmatch(rf"rcv_{ULID}", request["id"])
    assert (request["status"], request["channel"], request["destination"], request["reason"]) \
        == ("pending", "email", new, "ticket 42")
    assert request["decided_at"] is None and request["message_id"] is None
    # Filing changes nothing yet: the session works, the address is the old one.
    assert (await session_call(project.api, "GET", "/v1/sessions/me", signed.access_token)).status == 200

    r = await project.api.post(f"/v1/recovery/requests/{request['id']}/approve",
                               {"note": "ID checked on a call"})
    assert r.status == 200, r.body
    approved = r.body
    assert approved["status"] == "approved" and approved["decision_note"] == "ID checked on a call"
    assert approved["decided_at"] is not None and approved["decided_by"].startswith("key_")
    assert approved["message_id"].startswith("msg_")

    shown = (await project.api.get(f"/v1/users/{user['id']}")).body
    assert (shown["email"], shown["email_verified"]) == (new, False)
    # Every session is revoked, at the edge too.
    await announced_score(redis, redis_prefix, signed.session_id)
    assert_error(await session_call(project.api, "GET", "/v1/sessions/me", signed.access_token),
                 401, "no_session")
    r = await project.api.post("/v1/sessions/refresh", {"refresh_token": signed.refresh_token},
                               key=None)
    assert r.status == 401, r.body

    [message] = await mailbox_messages(project.api, new)
    assert message["kind"] == "recovery" and message["id"] == approved["message_id"]
    r = await verify(project.api, project, token_of(await latest_link(project, new)))
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == user["id"]
    assert r.body["user"]["email"] == new and r.body["user"]["email_verified"] is True
    # The link is single use.
    assert_error(await verify(project.api, project, token_of(await latest_link(project, new))),
                 410, "token_consumed")

    [created] = await events(db, project.id, "recovery.request.created")
    assert created["target_id"] == request["id"] and created["user_id"] == user["id"]
    assert created["metadata"]["destination"] == new
    [done] = await events(db, project.id, "recovery.request.approved")
    assert done["target_id"] == request["id"] and done["user_id"] == user["id"]
    assert done["metadata"]["sessions_revoked"] == 1
    assert done["metadata"]["message_id"] == approved["message_id"]
    [changed] = await events(db, project.id, "user.updated")
    assert changed["target_id"] == user["id"] and "email" in changed["metadata"]["changed"]


async def test_a_denied_request_changes_nothing_and_a_decision_is_final(
        project: Project, db: asyncpg.Pool) -> None:
    old, new = email(), email()
    user = await create_user(project.api, old, email_verified=True)
    rid = (await project.api.post("/v1/recovery/requests",
                                  {"user_id": user["id"], "email": new})).body["id"]
    r = await project.api.post(f"/v1/recovery/requests/{rid}/deny", {"note": "not the owner"})
    assert r.status == 200, r.body
    assert (r.body["status"], r.body["decision_note"], r.body["message_id"]) \
        == ("denied", "not the owner", None)
    for action in ("approve", "deny"):
        r = await project.api.post(f"/v1/recovery/requests/{rid}/{action}", {})
        assert_error(r, 409, "recovery_request_not_pending")
        assert r.body["error"]["details"]["status"] == "denied"
    shown = (await project.api.get(f"/v1/users/{user['id']}")).body
    assert (shown["email"], shown["email_verified"]) == (old, True)
    assert await db.fetchval("SELECT count(*) FROM messages WHERE destination = $1", new) == 0
    [denied] = await events(db, project.id, "recovery.request.denied")
    assert denied["target_id"] == rid and denied["user_id"] == user["id"]
    # Another request may follow a decided one.
    r = await project.api.post("/v1/recovery/requests", {"user_id": user["id"], "email": new})
    assert r.status == 201, r.body


async def test_a_phone_number_gets_its_link_by_sms(project: Project) -> None:
    user = await create_user(project.api, email(), email_verified=True)
    number = phone()
    rid = (await project.api.post("/v1/recovery/requests",
                                  {"user_id": user["id"], "phone_number": number})).body["id"]
    r = await project.api.post(f"/v1/recovery/requests/{rid}/approve", {})
    assert r.status == 200, r.body
    [message] = await mailbox_messages(project.api, number)
    assert message["channel"] == "sms" and message["kind"] == "recovery"
    r = await verify(project.api, project, token_of(await latest_link(project, number)))
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == user["id"]
    assert (r.body["user"]["phone_number"], r.body["user"]["phone_verified"]) == (number, True)


async def test_refusals(project: Project, service: Api) -> None:
    user = await create_user(project.api, email())
    other = await create_user(project.api, email())
    path = "/v1/recovery/requests"
    assert_error(await project.api.post(path, {"user_id": user["id"]}), 400, "invalid_request")
    assert_error(await project.api.post(path, {"user_id": user["id"], "email": email(),
                                               "phone_number": phone()}), 400, "invalid_request")
    assert_error(await project.api.post(path, {"user_id": "user_" + "0" * 26, "email": email()}),
                 404, "user_not_found")
    assert_error(await project.api.post(path, {"user_id": user["id"], "email": other["email"]}),
                 409, "email_in_use")
    first = await project.api.post(path, {"user_id": user["id"], "email": email()})
    assert first.status == 201, first.body
    r = await project.api.post(path, {"user_id": user["id"], "email": email()})
    assert_error(r, 409, "recovery_request_pending")
    assert r.body["error"]["details"]["recovery_id"] == first.body["id"]
    # The destination taken by another user between filing and approval.
    r = await project.api.request("PATCH", f"/v1/users/{other['id']}",
                                  json={"email": first.body["destination"]})
    assert r.status == 200, r.body
    assert_error(await project.api.post(f"{path}/{first.body['id']}/approve", {}),
                 409, "email_in_use")
    assert (await project.api.get(f"{path}/{first.body['id']}")).body["status"] == "pending"
    # Another project's request, an unknown and a malformed id: not found.
    theirs = await bootstrap_project(service, "recovery-other")
    for rid in (first.body["id"], "rcv_" + "0" * 26, "nope"):
        assert_error(await theirs.api.get(f"{path}/{rid}"), 404, "recovery_request_not_found")
        assert_error(await theirs.api.post(f"{path}/{rid}/approve", {}), 404,
                     "recovery_request_not_found")
    # Reading takes users:read; filing and deciding take users:write.
    reader = await scoped(project, "users:read")
    assert (await reader.get(f"{path}/{first.body['id']}")).status == 200
    assert_error(await reader.post(path, {"user_id": other["id"], "email": email()}), 403,
                 "insufficient_scope")
    assert_error(await reader.post(f"{path}/{first.body['id']}/deny", {}), 403,
                 "insufficient_scope")


async def test_listing_filters_and_the_user_deleted(project: Project, db: asyncpg.Pool) -> None:
    users = [await create_user(project.api, email()) for _ in range(3)]
    ids = []
    for u in users:
        r = await project.api.post("/v1/recovery/requests", {"user_id": u["id"], "email": email()})
        ids.append(r.body["id"])
    await project.api.post(f"/v1/recovery/requests/{ids[0]}/deny", {})
    r = await project.api.get("/v1/recovery/requests?status=pending&limit=1")
    assert r.status == 200, r.body
    assert [x["id"] for x in r.body["data"]] == [ids[1]]
    r = await project.api.get(f"/v1/recovery/requests?cursor={r.body['next_cursor']}&status=pending")
    assert [x["id"] for x in r.body["data"]] == [ids[2]]
    r = await project.api.get(f"/v1/recovery/requests?user_id={users[0]['id']}")
    assert [(x["id"], x["status"]) for x in r.body["data"]] == [(ids[0], "denied")]
    assert_error(await project.api.get("/v1/recovery/requests?status=lost"), 400, "invalid_request")
    # Requests go with their user.
    assert (await project.api.delete(f"/v1/users/{users[1]['id']}")).status == 200
    assert_error(await project.api.get(f"/v1/recovery/requests/{ids[1]}"), 404,
                 "recovery_request_not_found")
    assert await db.fetchval("SELECT count(*) FROM recovery_requests WHERE user_id = $1",
                             users[1]["id"]) == 0


async def test_a_bad_address_is_invalid_email(project: Project) -> None:
    user = await create_user(project.api, email())
    r = await project.api.post("/v1/recovery/requests", {"user_id": user["id"], "email": "AAA"})
    assert_error(r, 422, "invalid_email")
