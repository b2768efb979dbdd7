"""Users through HTTP: idempotent creation with one enrollment message, listing with the total
count header, show, update, delete (SPEC.md 2 "User", 4 rule 5, 7; issue 4)."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession
from redis.asyncio import Redis

from common.settings import Settings
from tests.fixtures.database import events, messages
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
from tests.fixtures.service import (
    ULID,
    Api,
    Project,
    Response,
    assert_error,
    assert_invalid_field,
    combined_app,
    scoped,
    serving,
    ts,
)

USER_FIELDS = {"id", "email", "email_verified", "phone_number", "phone_verified", "name",
               "metadata", "created_at", "updated_at", "last_sign_in_at"}


def phone() -> str:
    return "+1415" + str(secrets.randbelow(10**7)).zfill(7)


# --- create -----------------------------------------------------------------------------------


async def test_new_user_is_created_with_one_enrollment_message_and_event(
    project: Project, db: asyncpg.Pool
) -> None:
    address = email()
    r = await project.api.post("/v1/users", {"email": address, "name": "Ada Lovelace",
                                             "email_verified": True})
    assert r.status == 201, r.body
    user = r.body
    assert r.headers["X-Request-Id"] == user["request_id"]
    assert set(user) == USER_FIELDS | {"created", "request_id"}
    assert user["created"] is True
    assert re.fullmatch(rf"user_{ULID}", user["id"])
    assert user["email"] == address and user["name"] == "Ada Lovelace"
    assert user["email_verified"] is True and user["phone_number"] is None
    assert user["metadata"] == {} and user["last_sign_in_at"] is None
    assert abs((ts(user["created_at"]) - datetime.now(UTC)).total_seconds()) < 60
    assert await messages(db, project.id, address, "enrollment") == 1
    token = await db.fetchrow(
        "SELECT * FROM magic_link_tokens WHERE project_id = $1 AND destination = $2",
        project.id, address)
    assert token["purpose"] == "enrollment" and token["user_id"] == user["id"]
    assert token["channel"] == "email"
    created = await events(db, project.id, "user.created")
    assert len(created) == 1
    assert created[0]["target_type"] == "user" and created[0]["target_id"] == user["id"]
    assert created[0]["user_id"] == user["id"]
    assert created[0]["actor_type"] == "api_key" and created[0]["actor_id"] == project.key_id
    assert created[0]["metadata"]["user_email"] == address


async def test_defaults_name_and_email_verified(project: Project) -> None:
    user = await create_user(project.api)
    assert user["name"] == "" and user["email_verified"] is False


async def test_existing_user_is_returned_with_nothing_else_happening(
    project: Project, db: asyncpg.Pool
) -> None:
    address = email()
    first = await create_user(project.api, address, name="First")
    events_before = await events(db, project.id)
    # Same address in other letter case, other fields: the existing user, untouched.
    again = await project.api.post("/v1/users", {"email": address.upper(), "name": "Second",
                                                 "email_verified": True})
    assert again.status == 200, again.body
    assert again.body["created"] is False
    assert again.body["id"] == first["id"] and again.body["name"] == "First"
    assert again.body["email"] == address and again.body["email_verified"] is False
    assert await messages(db, project.id, address, "enrollment") == 1
    assert await events(db, project.id) == events_before


async def test_concurrent_creations_make_one_user_and_one_message(
    project: Project, db: asyncpg.Pool
) -> None:
    address = email()
    results = await asyncio.gather(*(project.api.post("/v1/users", {"email": address})
                                     for _ in range(8)))
    statuses = sorted(r.status for r in results)
    assert statuses == [200] * 7 + [201], [r.body for r in results]
    assert len({r.body["id"] for r in results}) == 1
    assert await messages(db, project.id, address, "enrollment") == 1
    assert len(await events(db, project.id, "user.created")) == 1


async def test_enrollment_link_signs_the_user_in(project: Project) -> None:
    address = email()
    user = await create_user(project.api, address)
    link = await latest_link(project, address)
    r = await verify(project.api, project, token_of(link))
    assert r.status == 200, r.body
    assert r.body["user"]["id"] == user["id"]
    assert r.body["user"]["last_sign_in_at"] is not None


@pytest.mark.parametrize("address", ["not-an-email", "a@", "@example.com", "a b@example.com",
                                     "a@@example.com", "x" * 330 + "@example.com"])
async def test_invalid_email_is_invalid_email_and_creates_nothing(
    project: Project, db: asyncpg.Pool, address: str
) -> None:
    r = await project.api.post("/v1/users", {"email": address})
    assert_error(r, 422, "invalid_email")
    assert await db.fetchval("SELECT count(*) FROM users WHERE project_id = $1", project.id) == 0
    assert await events(db, project.id, "user.created") == []


@pytest.mark.parametrize(("payload", "field"), [
    ({}, "email"),
    ({"email": 7}, "email"),
    ({"email": "a@example.com", "name": 7}, "name"),
    ({"email": "a@example.com", "name": "x" * 201}, "name"),
    ({"email": "a@example.com", "name": "bad\nname"}, "name"),
    ({"email": "a@example.com", "email_verified": "true"}, "email_verified"),
    ({"email": "a@example.com", "phone_number": "4155550100"}, "phone_number"),
    ({"email": "a@example.com", "phone_number": "+0155550100"}, "phone_number"),
    ({"email": "a@example.com", "phone_number": "+1 415 555 0100"}, "phone_number"),
    ({"email": "a@example.com", "metadata": []}, "metadata"),
    ({"email": "a@example.com", "metadata": "x"}, "metadata"),
    ({"email": "a@example.com", "metadata": {"blob": "x" * 17_000}}, "metadata"),
    ({"email": "a@example.com", "password": "hunter2"}, "password"),
])
async def test_invalid_body_is_invalid_request_naming_the_field(
    project: Project, db: asyncpg.Pool, payload: dict[str, Any], field: str
) -> None:
    r = await project.api.post("/v1/users", payload)
    assert_error(r, 400, "invalid_request")
    assert field in [f["field"] for f in r.body["error"]["details"]["fields"]], r.body
    assert await db.fetchval("SELECT count(*) FROM users WHERE project_id = $1", project.id) == 0


NUL = "\u0000"


@pytest.mark.parametrize(("metadata", "field"), [
    ({"a": {"b": "x" + NUL}}, "metadata.a.b"),
    ({"list": [1, "ok", NUL]}, "metadata.list.2"),
    ({"a" + NUL: 1}, "metadata"),  # a key: the object holding it is named
])
async def test_a_nul_in_metadata_is_invalid_request_naming_it(
    project: Project, db: asyncpg.Pool, metadata: dict[str, Any], field: str
) -> None:
    """PostgreSQL's jsonb cannot hold NUL: it reached the insert and answered 500."""
    address = email()
    r = await project.api.post("/v1/users", {"email": address, "metadata": metadata})
    assert_invalid_field(r, field)
    assert await messages(db, project.id, address, "enrollment") == 0
    user = await create_user(project.api)
    r = await project.api.request("PATCH", f"/v1/users/{user['id']}", json={"metadata": metadata})
    assert_invalid_field(r, field)
    assert (await project.api.get(f"/v1/users/{user['id']}")).body["metadata"] == {}


@pytest.mark.parametrize("depth", [33, 300, 1000])
async def test_metadata_nested_too_deep_is_invalid_request(project: Project, depth: int) -> None:
    """Past 254 levels the size check could not serialize it (orjson's limit): a 500."""
    deep = b'{"a":' * depth + b"1" + b"}" * depth  # metadata nesting `depth` objects
    r = await project.api.post("/v1/users", data=b'{"email": "%s", "metadata": %s}' % (
        email().encode(), deep))
    assert_invalid_field(r, "metadata", "must nest at most 32 levels")
    user = await create_user(project.api)
    r = await project.api.request("PATCH", f"/v1/users/{user['id']}",
                                  data=b'{"metadata": %s}' % deep)
    assert_invalid_field(r, "metadata", "must nest at most 32 levels")


async def test_metadata_nested_32_levels_is_stored(project: Project) -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(31):
        inner["a"] = {}
        inner = inner["a"]
    user = await create_user(project.api, metadata=deep)
    assert user["metadata"] == deep


@pytest.mark.parametrize("user_id", ["%00", "user_%00", "user_%7F"])
async def test_a_control_character_in_a_user_id_is_invalid_request_naming_it(
    project: Project, user_id: str
) -> None:
    for r in (await project.api.get(f"/v1/users/{user_id}"),
              await project.api.request("PATCH", f"/v1/users/{user_id}", json={"name": "x"}),
              await project.api.delete(f"/v1/users/{user_id}"),
              await project.api.get(f"/v1/users/{user_id}/memberships")):
        assert_invalid_field(r, "user_id", "must not contain control characters")


async def test_phone_and_metadata_are_stored(project: Project) -> None:
    number = phone()
    meta = {"plan": "pro", "nested": {"n": 1, "list": [1, "a", None]}}
    user = await create_user(project.api, phone_number=number, metadata=meta)
    assert user["phone_number"] == number and user["metadata"] == meta
    assert user["phone_verified"] is False
    shown = await project.api.get(f"/v1/users/{user['id']}")
    assert shown.body["metadata"] == meta


async def test_metadata_up_to_16_kib_is_accepted(project: Project) -> None:
    meta = {"blob": "x" * (16 * 1024 - len(orjson.dumps({"blob": ""})))}
    assert len(orjson.dumps(meta)) == 16 * 1024
    await create_user(project.api, metadata=meta)


async def test_phone_taken_by_another_user_is_phone_in_use_and_rolls_back(
    project: Project, db: asyncpg.Pool
) -> None:
    number = phone()
    await create_user(project.api, phone_number=number)
    address = email()
    r = await project.api.post("/v1/users", {"email": address, "phone_number": number})
    assert_error(r, 409, "phone_in_use")
    assert await db.fetchval("SELECT count(*) FROM users WHERE project_id = $1", project.id) == 1
    assert await messages(db, project.id, address, "enrollment") == 0
    assert len(await events(db, project.id, "user.created")) == 1


# --- list -------------------------------------------------------------------------------------


async def test_list_pages_through_every_user_once(project: Project) -> None:
    created = [await create_user(project.api) for _ in range(5)]
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        r = await project.api.get("/v1/users?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        assert set(r.body) == {"data", "next_cursor", "has_more", "request_id"}
        seen += [u["id"] for u in r.body["data"]]
        for u in r.body["data"]:
            assert set(u) == USER_FIELDS
        if not r.body["has_more"]:
            assert r.body["next_cursor"] is None
            break
        cursor = r.body["next_cursor"]
    assert seen == [u["id"] for u in created]


async def test_total_count_header_only_when_asked(project: Project, new_project: Callable[..., Any]) -> None:
    other = await new_project("users-count-other")
    await create_user(other.api)
    for _ in range(3):
        await create_user(project.api)
    plain = await project.api.get("/v1/users?limit=1")
    assert plain.status == 200 and "Service-Total-Count" not in plain.headers
    asked = await project.api.get("/v1/users?limit=1", headers={"Service-Total-Count": "true"})
    assert asked.status == 200, asked.body
    assert asked.headers["Service-Total-Count"] == "3"
    assert len(asked.body["data"]) == 1 and asked.body["has_more"] is True
    declined = await project.api.get("/v1/users", headers={"Service-Total-Count": "false"})
    assert "Service-Total-Count" not in declined.headers


async def test_list_filters_by_email_case_insensitively(project: Project) -> None:
    target = await create_user(project.api, "Mixed.Case@Example.com")
    await create_user(project.api)
    r = await project.api.get("/v1/users?email=mixed.case@example.COM")
    assert r.status == 200, r.body
    assert [u["id"] for u in r.body["data"]] == [target["id"]]
    none = await project.api.get("/v1/users?email=nobody@example.com")
    assert none.body["data"] == []
    assert_error(await project.api.get("/v1/users?email=not-an-email"), 422, "invalid_email")


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=x", "cursor=forged.cursor"])
async def test_list_rejects_bad_paging(project: Project, query: str) -> None:
    assert_error(await project.api.get(f"/v1/users?{query}"), 400, "invalid_request")


async def test_list_shows_only_the_callers_project(
    project: Project, new_project: Callable[..., Any]
) -> None:
    other = await new_project("users-other")
    theirs = await create_user(other.api)
    mine = await create_user(project.api)
    r = await project.api.get("/v1/users")
    assert [u["id"] for u in r.body["data"]] == [mine["id"]]
    assert theirs["id"] not in r.raw.decode()


# --- show, update -----------------------------------------------------------------------------


async def test_show_user(project: Project) -> None:
    user = await create_user(project.api, name="Grace")
    r = await project.api.get(f"/v1/users/{user['id']}")
    assert r.status == 200, r.body
    assert {k: r.body[k] for k in USER_FIELDS} == {k: user[k] for k in USER_FIELDS}


async def test_unknown_malformed_and_foreign_ids_are_user_not_found(
    project: Project, new_project: Callable[..., Any], db: asyncpg.Pool
) -> None:
    other = await new_project("users-foreign")
    theirs = await create_user(other.api)
    for user_id in (theirs["id"], "user_" + "0" * 26, "nope", "org_" + "0" * 26):
        assert_error(await project.api.get(f"/v1/users/{user_id}"), 404, "user_not_found")
        assert_error(await project.api.request("PATCH", f"/v1/users/{user_id}", json={"name": "x"}),
                     404, "user_not_found")
        assert_error(await project.api.delete(f"/v1/users/{user_id}"), 404, "user_not_found")
    still = await other.api.get(f"/v1/users/{theirs['id']}")
    assert still.status == 200 and still.body["name"] == ""
    for project_id in (project.id, other.id):
        assert await events(db, project_id, "user.updated") == []
        assert await events(db, project_id, "user.deleted") == []


async def patch(api: Api, user_id: str, body: Any) -> Response:
    return await api.request("PATCH", f"/v1/users/{user_id}", json=body)


async def test_patch_changes_fields_and_records_their_names(
    project: Project, db: asyncpg.Pool
) -> None:
    user = await create_user(project.api, name="Old", metadata={"a": 1})
    number = phone()
    r = await patch(project.api, user["id"], {"name": "New", "phone_number": number,
                                               "metadata": {"b": 2}})
    assert r.status == 200, r.body
    assert r.body["name"] == "New" and r.body["phone_number"] == number
    assert r.body["metadata"] == {"b": 2}  # replaced, not merged
    assert r.body["email"] == user["email"]
    assert ts(r.body["updated_at"]) >= ts(user["updated_at"])
    updated = await events(db, project.id, "user.updated")
    assert len(updated) == 1
    assert updated[0]["target_id"] == user["id"] and updated[0]["user_id"] == user["id"]
    assert updated[0]["metadata"]["changed"] == ["metadata", "name", "phone_number"]
    # Names, never values.
    assert "New" not in orjson.dumps(updated[0]["metadata"]).decode()
    assert number not in orjson.dumps(updated[0]["metadata"]).decode()


async def test_patch_that_changes_nothing_records_nothing(project: Project, db: asyncpg.Pool) -> None:
    user = await create_user(project.api, name="Same")
    r = await patch(project.api, user["id"], {"name": "Same", "email": user["email"]})
    assert r.status == 200, r.body
    assert r.body["updated_at"] == user["updated_at"]
    assert await events(db, project.id, "user.updated") == []


async def test_patch_email_unverifies_it_and_conflicts_are_email_in_use(
    project: Project, db: asyncpg.Pool
) -> None:
    user = await create_user(project.api, email_verified=True)
    other = await create_user(project.api)
    r = await patch(project.api, user["id"], {"email": other["email"].upper()})
    assert_error(r, 409, "email_in_use")
    new_address = email()
    r = await patch(project.api, user["id"], {"email": new_address})
    assert r.status == 200, r.body
    assert r.body["email"] == new_address and r.body["email_verified"] is False
    r = await patch(project.api, user["id"], {"email_verified": True})
    assert r.body["email_verified"] is True
    changed = [e["metadata"]["changed"] for e in await events(db, project.id, "user.updated")]
    assert changed == [["email", "email_verified"], ["email_verified"]]


async def test_patch_phone_conflict_and_clear(project: Project, db: asyncpg.Pool) -> None:
    number = phone()
    await create_user(project.api, phone_number=number)
    user = await create_user(project.api, phone_number=phone())
    assert_error(await patch(project.api, user["id"], {"phone_number": number}), 409, "phone_in_use")
    r = await patch(project.api, user["id"], {"phone_number": None})
    assert r.status == 200, r.body
    assert r.body["phone_number"] is None
    assert [e["metadata"]["changed"] for e in await events(db, project.id, "user.updated")] == [
        ["phone_number"]]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "body"),
    ({"name": None}, "body"),
    ({"email": None}, "body"),
    ({"metadata": None}, "body"),
    ({"email_verified": None}, "body"),
    ({"email": "nope", "name": None}, "body"),  # a misplaced null comes first
    ({"name": 5}, "name"),
    ({"phone_number": "555"}, "phone_number"),
    ({"metadata": {"x": "y" * 17_000}}, "metadata"),
    ({"id": "user_x"}, "id"),
])
async def test_invalid_patch_is_invalid_request(
    project: Project, body: dict[str, Any], field: str
) -> None:
    user = await create_user(project.api)
    r = await patch(project.api, user["id"], body)
    assert_error(r, 400, "invalid_request")
    fields = [f["field"] for f in r.body["error"]["details"]["fields"]]
    assert field in fields, r.body


async def test_patch_invalid_email_is_invalid_email(project: Project) -> None:
    user = await create_user(project.api)
    assert_error(await patch(project.api, user["id"], {"email": "nope"}), 422, "invalid_email")


# --- delete -----------------------------------------------------------------------------------


async def test_delete_removes_user_memberships_and_revokes_sessions(
    project: Project, db: asyncpg.Pool, redis: Redis, redis_prefix: str
) -> None:
    address = email()
    user = await create_user(project.api, address)
    org = await project.api.post("/v1/organizations", {"name": "Acme", "slug": f"acme-{secrets.token_hex(3)}"})
    assert org.status == 201, org.body
    m = await project.api.post(f"/v1/organizations/{org.body['id']}/memberships",
                               {"user_id": user["id"]})
    assert m.status == 201, m.body
    signed = await verify(project.api, project, token_of(await latest_link(project, address)))
    assert signed.status == 200, signed.body
    access, session_id = signed.body["access_token"], signed.body["session"]["id"]
    assert (await session_call(project.api, "GET", "/v1/sessions/me", access)).status == 200

    r = await project.api.delete(f"/v1/users/{user['id']}")
    assert r.status == 200, r.body
    assert r.body["id"] == user["id"] and r.body["deleted"] is True
    assert_error(await project.api.get(f"/v1/users/{user['id']}"), 404, "user_not_found")
    assert await db.fetchval("SELECT count(*) FROM memberships WHERE user_id = $1", user["id"]) == 0
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", user["id"]) == 0
    deleted = await events(db, project.id, "user.deleted")
    assert len(deleted) == 1
    assert deleted[0]["target_id"] == user["id"] and deleted[0]["metadata"]["sessions_revoked"] == 1
    # Revoked at the edge: the session id is in the Redis revocation set.
    await announced_score(redis, redis_prefix, session_id)
    assert_error(await session_call(project.api, "GET", "/v1/sessions/me", access), 401, "no_session")
    # Deleting again: gone.
    assert_error(await project.api.delete(f"/v1/users/{user['id']}"), 404, "user_not_found")
    assert len(await events(db, project.id, "user.deleted")) == 1


async def test_deleted_users_email_can_be_enrolled_again(project: Project, db: asyncpg.Pool) -> None:
    address = email()
    first = await create_user(project.api, address)
    assert (await project.api.delete(f"/v1/users/{first['id']}")).status == 200
    second = await create_user(project.api, address)
    assert second["id"] != first["id"] and second["created"] is True
    assert await messages(db, project.id, address, "enrollment") == 2


# --- scopes -----------------------------------------------------------------------------------


async def test_scopes_are_enforced(project: Project, db: asyncpg.Pool) -> None:
    user = await create_user(project.api)
    reader = await scoped(project, "users:read")
    assert (await reader.get("/v1/users")).status == 200
    assert (await reader.get(f"/v1/users/{user['id']}")).status == 200
    assert_error(await reader.post("/v1/users", {"email": email()}), 403, "insufficient_scope")
    assert_error(await patch(reader, user["id"], {"name": "x"}), 403, "insufficient_scope")
    assert_error(await reader.delete(f"/v1/users/{user['id']}"), 403, "insufficient_scope")
    unrelated = await scoped(project, "authz:check", "organizations:write")
    assert_error(await unrelated.get("/v1/users"), 403, "insufficient_scope")
    assert_error(await unrelated.get(f"/v1/users/{user['id']}"), 403, "insufficient_scope")
    assert_error(await unrelated.post("/v1/users", {"email": email()}), 403, "insufficient_scope")
    writer = await scoped(project, "users:write")
    assert (await writer.post("/v1/users", {"email": email()})).status == 201
    assert (await writer.get(f"/v1/users/{user['id']}")).status == 200
    assert await db.fetchval("SELECT count(*) FROM users WHERE project_id = $1", project.id) == 2


async def test_missing_and_invalid_key(project: Project) -> None:
    assert_error(await project.api.get("/v1/users", key=None), 401, "missing_api_key")
    assert_error(await project.api.post("/v1/users", {"email": email()}, key="sk_test_nope"),
                 401, "invalid_api_key")


async def test_the_last_contact_cannot_be_cleared(
    project: Project, http: ClientSession, settings_factory: Callable[..., Settings]
) -> None:
    number = phone()
    # An SMS sign-in makes a phone-only user. Its own app, with a per-IP send limit that the
    # rest of the suite (all from 127.0.0.1) cannot exhaust.
    settings = settings_factory(magic_link_rate_per_ip="100000/minute")
    async with serving(http, combined_app(settings)) as api:
        signed = await sign_in(project, number, api=api)
    user_id = signed.user_id
    r = await patch(project.api, user_id, {"phone_number": None})
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "phone_number"
    assert (await project.api.get(f"/v1/users/{user_id}")).body["phone_number"] == number
