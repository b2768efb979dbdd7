"""API keys: create, list, revoke, scopes (SPEC.md 2, 4, 5.1-5.2, 6; DESIGN.md "API keys",
"lists", "audit writes")."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.service import Api, Project, Response, assert_error, assert_invalid_field, start_app

ULID = r"[0-9a-hjkmnp-tv-z]{26}"
ALL_SCOPES = ["users:read", "users:write", "organizations:write", "authz:check", "authz:write",
              "audit:read", "webhooks:write", "compliance:write", "risk:write", "keys:write"]


async def create(api: Api, scopes: list[str] | None = None, prefix: str = "sk_test_",
                 name: str | None = None) -> Response:
    return await api.post("/v1/api-keys", {"prefix": prefix, "name": name or f"key {secrets.token_hex(3)}",
                                           "scopes": [] if scopes is None else scopes})


async def new_key(api: Api, scopes: list[str] | None = None, prefix: str = "sk_test_") -> dict[str, Any]:
    r = await create(api, scopes, prefix)
    assert r.status == 201, r.body
    return dict(r.body)


async def audit_rows(db: asyncpg.Pool, project_id: str, action: str | None = None) -> list[Any]:
    if action is None:
        return await db.fetch("SELECT * FROM audit_events WHERE project_id = $1 ORDER BY created_at",
                              project_id)
    return await db.fetch(
        "SELECT * FROM audit_events WHERE project_id = $1 AND action = $2 ORDER BY created_at",
        project_id, action,
    )


# --- create -----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["sk_live_", "sk_test_"])
async def test_create_returns_secret_once_with_warning(project: Project, prefix: str) -> None:
    r = await create(project.api, ["authz:check", "users:read"], prefix, name="backend")
    assert r.status == 201, r.body
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    key = r.body
    assert re.fullmatch(rf"key_{ULID}", key["id"]), key
    assert re.fullmatch(re.escape(prefix) + r"[0-9A-Za-z]{43,}", key["secret"]), key["secret"]
    assert key["name"] == "backend"
    assert sorted(key["scopes"]) == ["authz:check", "users:read"]
    assert isinstance(key["warning"], str) and key["warning"].strip()
    assert r.raw.count(key["secret"].encode()) == 1
    assert "secret_hash" not in key
    # The new key authenticates, into the same project.
    me = await project.api.get("/v1/projects/me", key=key["secret"])
    assert me.status == 200 and me.body["id"] == project.id


async def test_secrets_are_unique(project: Project) -> None:
    keys = [await new_key(project.api) for _ in range(5)]
    assert len({k["secret"] for k in keys}) == 5
    assert len({k["id"] for k in keys}) == 5


async def test_empty_scope_list_is_full_access(project: Project) -> None:
    key = await new_key(project.api, [])
    assert key["scopes"] == []
    api = project.api.with_key(key["secret"])
    assert (await api.post("/v1/stores", {"name": "s"})).status == 201
    assert (await create(api, ["keys:write"])).status == 201
    assert (await api.get("/v1/api-keys")).status == 200


@pytest.mark.parametrize(("payload", "field"), [
    ({"prefix": "sk_prod_", "name": "n", "scopes": []}, "prefix"),
    ({"prefix": "pk_live_", "name": "n", "scopes": []}, "prefix"),
    ({"name": "n", "scopes": []}, "prefix"),
    ({"prefix": "sk_test_", "scopes": []}, "name"),
    ({"prefix": "sk_test_", "name": "", "scopes": []}, "name"),
    ({"prefix": "sk_test_", "name": "n", "scopes": "authz:check"}, "scopes"),
    ({"prefix": "sk_test_", "name": "n", "scopes": ["authz:check", 7]}, "scopes"),
    ({"prefix": "sk_test_", "name": "n", "scopes": ["authz:admin"]}, "scopes"),
    ({"prefix": "sk_test_", "name": "n", "scopes": ["authz:check", "everything"]}, "scopes"),
    ({"prefix": "sk_test_", "name": "n", "scopes": ["AUTHZ:CHECK"]}, "scopes"),
    ({"prefix": "sk_test_", "name": "n", "scopes": [], "secret": "sk_test_mine"}, "secret"),
])
async def test_invalid_create_is_invalid_request_and_creates_nothing(
    project: Project, db: asyncpg.Pool, payload: dict[str, Any], field: str
) -> None:
    keys_before = await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1", project.id)
    events_before = len(await audit_rows(db, project.id))
    r = await project.api.post("/v1/api-keys", payload)
    assert_error(r, 400, "invalid_request")
    fields = [f["field"] for f in r.body["error"]["details"]["fields"]]
    assert any(f == field or f.startswith(field + ".") for f in fields), r.body
    assert await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1",
                             project.id) == keys_before
    assert len(await audit_rows(db, project.id)) == events_before


async def test_every_documented_scope_is_accepted(project: Project) -> None:
    key = await new_key(project.api, ALL_SCOPES)
    assert sorted(key["scopes"]) == sorted(ALL_SCOPES)


# --- storage ----------------------------------------------------------------------------------


async def test_secret_is_stored_only_as_sha256(project: Project, db: asyncpg.Pool) -> None:
    key = await new_key(project.api, ["authz:check"], "sk_live_")
    secret = key["secret"]
    row = await db.fetchrow("SELECT * FROM api_keys WHERE id = $1", key["id"])
    assert row is not None
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert row["project_id"] == project.id
    # No column holds the plaintext (nor the part after the prefix).
    whole = await db.fetchval("SELECT row_to_json(k)::text FROM api_keys k WHERE id = $1", key["id"])
    assert secret not in whole and secret[len("sk_live_"):] not in whole
    # Nor does any audit event.
    events = await db.fetchval(
        "SELECT coalesce(string_agg(row_to_json(e)::text, ''), '') FROM audit_events e "
        "WHERE project_id = $1", project.id)
    assert secret[len("sk_live_"):] not in events


# --- list -------------------------------------------------------------------------------------


async def test_list_never_returns_secrets_or_hashes(project: Project) -> None:
    created = [await new_key(project.api, s) for s in (["authz:check"], [], ["keys:write"])]
    r = await project.api.get("/v1/api-keys")
    assert r.status == 200, r.body
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    raw = r.raw.decode()
    for key in [*created, {"secret": project.key}]:
        secret = key["secret"]
        assert secret not in raw and secret[8:] not in raw
        assert hashlib.sha256(secret.encode()).hexdigest() not in raw
    for item in r.body["data"]:
        assert "secret" not in item and "secret_hash" not in item, item
    listed = {item["id"]: item for item in r.body["data"]}
    assert set(listed) == {project.key_id, *(k["id"] for k in created)}
    assert listed[created[0]["id"]]["scopes"] == ["authz:check"]
    assert listed[created[0]["id"]]["name"] == created[0]["name"]
    assert r.body["has_more"] is False and r.body["next_cursor"] is None


async def test_list_shows_only_the_callers_project(project: Project, new_project: Callable[..., Any]) -> None:
    other = await new_project("keys-other")
    theirs = await new_key(other.api)
    r = await project.api.get("/v1/api-keys")
    ids = {item["id"] for item in r.body["data"]}
    assert theirs["id"] not in ids and other.key_id not in ids
    assert project.key_id in ids


async def test_list_pagination_limit_one_walks_every_key_once(project: Project) -> None:
    created = [await new_key(project.api) for _ in range(4)]
    expected = {project.key_id, *(k["id"] for k in created)}
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        path = "/v1/api-keys?limit=1" + (f"&cursor={cursor}" if cursor else "")
        r = await project.api.get(path)
        assert r.status == 200, r.body
        assert len(r.body["data"]) == 1
        seen.append(r.body["data"][0]["id"])
        if not r.body["has_more"]:
            assert r.body["next_cursor"] is None
            break
        cursor = r.body["next_cursor"]
        assert isinstance(cursor, str) and cursor
    assert len(seen) == len(set(seen)), seen
    assert set(seen) == expected
    # Each page is also consistent with a single big page.
    big = await project.api.get("/v1/api-keys?limit=1000")
    assert [item["id"] for item in big.body["data"]] == seen


async def test_list_page_sizes(project: Project) -> None:
    for _ in range(3):
        await new_key(project.api)
    r = await project.api.get("/v1/api-keys?limit=2")
    assert len(r.body["data"]) == 2 and r.body["has_more"] is True
    r2 = await project.api.get(f"/v1/api-keys?limit=2&cursor={r.body['next_cursor']}")
    assert len(r2.body["data"]) == 2 and r2.body["has_more"] is False
    assert r2.body["next_cursor"] is None
    assert not {i["id"] for i in r.body["data"]} & {i["id"] for i in r2.body["data"]}


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=-1", "limit=abc", "limit=1.5",
                                   "limit=", "cursor=garbage!!", "cursor=bm90LWpzb24",
                                   "cursor=W10", "limit=1&cursor=%22%22"])
async def test_bad_limit_or_cursor_is_invalid_request(project: Project, query: str) -> None:
    r = await project.api.get("/v1/api-keys?" + query)
    assert_error(r, 400, "invalid_request")


async def _forged(db: asyncpg.Pool, project_id: str, kind: str, *key: Any,
                  secret: bytes | None = None) -> str:
    """A cursor in the signed format (``control_plane.web.pagination``) holding ``kind`` and ``key``,
    signed with the deployment's real secret unless ``secret`` is given: so the checks behind
    the signature are exercised too."""
    import base64
    import hmac

    if secret is None:
        secret = await db.fetchval("SELECT value FROM service_secrets WHERE name = 'cursor_hmac'")
    payload = orjson.dumps([kind, project_id, *key])
    mac = hmac.new(secret, b"authio/cursor/v1\x00" + payload, hashlib.sha256).digest()[:16]
    return ".".join(base64.urlsafe_b64encode(p).decode().rstrip("=") for p in (payload, mac))


@pytest.mark.parametrize("values", [("api_keys", 5), ("api_keys", True), ("api_keys", None),
                                    ("api_keys", "a", "b"), ("stores", "key_x"), ("api_keys",),
                                    ("api_keys", ["key_x"])])
async def test_forged_cursor_is_invalid_request_not_a_crash(project: Project, db: asyncpg.Pool,
                                                            values: tuple[Any, ...]) -> None:
    """A client-edited cursor is the client's mistake (400), never an internal error (500)."""
    r = await project.api.get("/v1/api-keys?cursor=" + await _forged(db, project.id, *values))
    assert_error(r, 400, "invalid_request")


async def test_cursor_needs_this_deployments_signature(project: Project, db: asyncpg.Pool) -> None:
    for _ in range(2):
        await new_key(project.api)
    genuine = await _forged(db, project.id, "api_keys", project.key_id)
    assert (await project.api.get("/v1/api-keys?cursor=" + genuine)).status == 200
    other = await _forged(db, project.id, "api_keys", project.key_id, secret=secrets.token_bytes(32))
    assert_error(await project.api.get("/v1/api-keys?cursor=" + other), 400, "invalid_request")
    unsigned = genuine.split(".")[0]
    assert_error(await project.api.get("/v1/api-keys?cursor=" + unsigned), 400, "invalid_request")


async def test_timestamps_are_rfc3339_utc_with_z(project: Project) -> None:
    key = await new_key(project.api)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", key["created_at"]), key
    revoked = await project.api.delete(f"/v1/api-keys/{key['id']}")
    assert revoked.body["revoked_at"].endswith("Z"), revoked.body


async def test_cursor_from_another_listing_is_invalid_request(project: Project) -> None:
    for i in range(2):
        await project.api.post("/v1/stores", {"name": f"s{i}"})
    stores = await project.api.get("/v1/stores?limit=1")
    assert stores.body["next_cursor"]
    r = await project.api.get(f"/v1/api-keys?cursor={stores.body['next_cursor']}")
    assert_error(r, 400, "invalid_request")


async def test_limit_bounds_are_accepted(project: Project) -> None:
    assert (await project.api.get("/v1/api-keys?limit=1")).status == 200
    assert (await project.api.get("/v1/api-keys?limit=1000")).status == 200


# --- revoke -----------------------------------------------------------------------------------


async def test_revoke_stops_the_key_at_once_on_the_control_plane(project: Project) -> None:
    key = await new_key(project.api, [])
    api = project.api.with_key(key["secret"])
    assert (await api.get("/v1/projects/me")).status == 200  # now cached
    r = await project.api.delete(f"/v1/api-keys/{key['id']}")
    assert r.status == 200, r.body
    assert r.body["id"] == key["id"]
    assert r.body.get("revoked_at"), r.body
    assert "secret" not in r.body and "secret_hash" not in r.body
    assert_error(await api.get("/v1/projects/me"), 401, "invalid_api_key")
    assert_error(await api.post("/v1/stores", {"name": "x"}), 401, "invalid_api_key")
    # The revoking key itself is untouched.
    assert (await project.api.get("/v1/projects/me")).status == 200


async def _check(api: Api, store_id: str) -> Response:
    return await api.post(f"/v1/stores/{store_id}/check", {
        "tuple_key": {"object": "document:1", "relation": "viewer", "user": "user:anne"}})


async def _until_check_ok(api: Api, store_id: str) -> Response:
    r = await _check(api, store_id)
    for _ in range(100):
        if r.status == 200:
            break
        await asyncio.sleep(0.05)
        r = await _check(api, store_id)
    assert r.status == 200, r.body
    return r


async def _revoked_within(api: Api, store_id: str, seconds: float) -> Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        r = await _check(api, store_id)
        if r.status == 401 or loop.time() > deadline:
            return r
        await asyncio.sleep(0.02)


async def test_revoked_key_is_unknown_to_the_engine_within_one_second(project: Project) -> None:
    store = await project.api.post("/v1/stores", {"name": "revocation"})
    assert store.status == 201, store.body
    key = await new_key(project.api, ["authz:check"])
    checker = project.api.with_key(key["secret"])
    assert (await _until_check_ok(checker, store.body["id"])).body["allowed"] is False

    assert (await project.api.delete(f"/v1/api-keys/{key['id']}")).status == 200
    r = await _revoked_within(checker, store.body["id"], 1.0)
    assert_error(r, 401, "invalid_api_key")


async def test_revocation_reaches_a_separate_engine_process_through_redis(
    project: Project, settings_factory: Callable[..., Settings], http: ClientSession,
) -> None:
    """A separately deployed engine (own cache, TTL far above 1 s) drops the key within 1 s."""
    from engine.app import create_engine_app

    running = await start_app(create_engine_app(settings_factory(api_key_cache_seconds=600)))
    try:
        engine = Api(http, running.base_url)
        store = await project.api.post("/v1/stores", {"name": "remote-revocation"})
        key = await new_key(project.api, ["authz:check"])
        checker = engine.with_key(key["secret"])
        await _until_check_ok(checker, store.body["id"])
        await asyncio.sleep(0.2)  # the revocation subscription is up

        assert (await project.api.delete(f"/v1/api-keys/{key['id']}")).status == 200
        r = await _revoked_within(checker, store.body["id"], 1.0)
        assert_error(r, 401, "invalid_api_key")
    finally:
        await running.stop()


async def test_revoking_twice_is_idempotent(project: Project, db: asyncpg.Pool) -> None:
    key = await new_key(project.api)
    first = await project.api.delete(f"/v1/api-keys/{key['id']}")
    second = await project.api.delete(f"/v1/api-keys/{key['id']}")
    assert first.status == second.status == 200, (first.body, second.body)
    assert first.body["id"] == second.body["id"] == key["id"]
    assert first.body["revoked_at"] == second.body["revoked_at"]
    revoked = [r for r in await audit_rows(db, project.id, "api_key.revoked")
               if r["target_id"] == key["id"]]
    assert len(revoked) == 1, revoked
    listed = await project.api.get("/v1/api-keys?limit=1000")
    item = next(i for i in listed.body["data"] if i["id"] == key["id"])
    assert item["revoked_at"] == first.body["revoked_at"]


async def test_another_projects_key_cannot_be_revoked(
    project: Project, new_project: Callable[..., Any], db: asyncpg.Pool,
) -> None:
    other = await new_project("victim")
    victim = await new_key(other.api)
    r = await project.api.delete(f"/v1/api-keys/{victim['id']}")
    assert_error(r, 404, "not_found")
    r = await project.api.delete(f"/v1/api-keys/{other.key_id}")
    assert_error(r, 404, "not_found")
    # Both still work and are not revoked.
    assert (await other.api.get("/v1/projects/me", key=victim["secret"])).status == 200
    assert (await other.api.get("/v1/projects/me")).status == 200
    assert await db.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", victim["id"]) is None
    assert not await audit_rows(db, project.id, "api_key.revoked")


async def test_unknown_key_id_is_not_found(project: Project) -> None:
    assert_error(await project.api.delete("/v1/api-keys/key_01hzzzzzzzzzzzzzzzzzzzzzzz"), 404,
                 "not_found")
    assert_error(await project.api.delete("/v1/api-keys/nonsense"), 404, "not_found")
    assert_error(await project.api.delete("/v1/api-keys/" + "k" * 5000), 404, "not_found")


@pytest.mark.parametrize("key_id", ["%00", "key_%00", "key_%1F"])
async def test_a_control_character_in_a_key_id_is_invalid_request_naming_it(
    project: Project, key_id: str
) -> None:
    """NUL went to PostgreSQL, which cannot take it (a 500)."""
    assert_invalid_field(await project.api.delete(f"/v1/api-keys/{key_id}"), "key_id",
                         "must not contain control characters")


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/api-keys"), ("POST", "/v1/api-keys"),
                                              ("DELETE", "/v1/api-keys/key_x"),
                                              ("GET", "/v1/projects/me")])
async def test_missing_authorization_is_missing_api_key(service: Api, method: str, path: str) -> None:
    r = await service.request(method, path, json={"prefix": "sk_test_", "name": "n", "scopes": []}
                              if method == "POST" else None)
    assert_error(r, 401, "missing_api_key")


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz"])
async def test_malformed_authorization_is_missing_api_key(service: Api, header: str) -> None:
    r = await service.get("/v1/projects/me", headers={"Authorization": header}, key=None)
    assert_error(r, 401, "missing_api_key")


@pytest.mark.parametrize("token", ["sk_live_" + "A" * 43, "sk_test_nope", "not-a-key", "pk_live_abc"])
async def test_unknown_key_is_invalid_api_key(service: Api, token: str) -> None:
    assert_error(await service.get("/v1/projects/me", key=token), 401, "invalid_api_key")
    assert_error(await service.get("/v1/api-keys", key=token), 401, "invalid_api_key")


async def test_hash_of_a_key_is_not_a_key(project: Project) -> None:
    digest = hashlib.sha256(project.key.encode()).hexdigest()
    assert_error(await project.api.get("/v1/projects/me", key=digest), 401, "invalid_api_key")
    assert_error(await project.api.get("/v1/projects/me", key="sk_live_" + digest), 401,
                 "invalid_api_key")


# --- scopes -----------------------------------------------------------------------------------


async def test_check_only_key_cannot_manage_keys_or_stores(project: Project, db: asyncpg.Pool) -> None:
    key = await new_key(project.api, ["authz:check"])
    api = project.api.with_key(key["secret"])
    before = await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1", project.id)
    assert_error(await create(api, ["authz:check"]), 403, "insufficient_scope")
    assert_error(await create(api, []), 403, "insufficient_scope")
    assert_error(await api.post("/v1/stores", {"name": "nope"}), 403, "insufficient_scope")
    assert_error(await api.get("/v1/api-keys"), 403, "insufficient_scope")
    assert_error(await api.delete(f"/v1/api-keys/{project.key_id}"), 403, "insufficient_scope")
    assert await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1",
                             project.id) == before
    assert await db.fetchval("SELECT revoked_at FROM api_keys WHERE id = $1", project.key_id) is None
    # What it may do still works.
    assert (await api.get("/v1/projects/me")).status == 200
    assert (await api.get("/v1/stores")).status == 200


async def test_no_escalation(project: Project, db: asyncpg.Pool) -> None:
    limited = await new_key(project.api, ["keys:write", "authz:check"])
    api = project.api.with_key(limited["secret"])

    ok = await create(api, ["authz:check"])
    assert ok.status == 201, ok.body
    assert ok.body["scopes"] == ["authz:check"]
    same = await create(api, ["authz:check", "keys:write"])
    assert same.status == 201, same.body

    keys_before = await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1", project.id)
    events_before = len(await audit_rows(db, project.id))
    for scopes in (["authz:write"], [], ["authz:check", "authz:write"], ALL_SCOPES):
        r = await create(api, scopes)
        assert_error(r, 403, "insufficient_scope")
    assert await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1",
                             project.id) == keys_before
    assert len(await audit_rows(db, project.id)) == events_before


async def test_a_created_key_cannot_escalate_further(project: Project) -> None:
    limited = await new_key(project.api, ["keys:write", "users:read"])
    child = await create(project.api.with_key(limited["secret"]), ["keys:write"])
    assert child.status == 201, child.body
    grandchild = await create(project.api.with_key(child.body["secret"]), ["users:read"])
    assert_error(grandchild, 403, "insufficient_scope")


# --- audit ------------------------------------------------------------------------------------


async def test_create_and_revoke_are_audited_with_the_acting_key(project: Project,
                                                                 db: asyncpg.Pool) -> None:
    ua = "authio-tests/api-keys"
    actor = await new_key(project.api, ["keys:write", "authz:check"])
    api = project.api.with_key(actor["secret"])
    r = await api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "audited",
                                        "scopes": ["authz:check"]}, headers={"User-Agent": ua})
    assert r.status == 201, r.body
    created = [e for e in await audit_rows(db, project.id, "api_key.created")
               if e["target_id"] == r.body["id"]]
    assert len(created) == 1, created
    evt = created[0]
    assert evt["actor_id"] == actor["id"]
    assert evt["api_key_id"] == actor["id"]
    assert evt["target_type"] == "api_key"
    assert evt["ip"] == "127.0.0.1" and evt["user_agent"] == ua
    metadata = evt["metadata"] if isinstance(evt["metadata"], dict) else orjson.loads(evt["metadata"])
    assert r.body["secret"] not in orjson.dumps(metadata).decode()

    d = await api.delete(f"/v1/api-keys/{r.body['id']}", headers={"User-Agent": ua})
    assert d.status == 200, d.body
    revoked = [e for e in await audit_rows(db, project.id, "api_key.revoked")
               if e["target_id"] == r.body["id"]]
    assert len(revoked) == 1, revoked
    assert revoked[0]["actor_id"] == actor["id"]
    assert revoked[0]["api_key_id"] == actor["id"]
    assert revoked[0]["ip"] == "127.0.0.1" and revoked[0]["user_agent"] == ua


async def test_denied_create_writes_no_audit_event(project: Project, db: asyncpg.Pool) -> None:
    check_only = await new_key(project.api, ["authz:check"])
    events_before = len(await audit_rows(db, project.id))
    assert_error(await create(project.api.with_key(check_only["secret"]), ["authz:check"]), 403,
                 "insufficient_scope")
    assert_error(await create(project.api, ["bogus:scope"]), 400, "invalid_request")
    assert_error(await project.api.post("/v1/api-keys", data=b"{"), 400, "invalid_request")
    assert len(await audit_rows(db, project.id)) == events_before


async def test_a_narrow_key_cannot_revoke_a_broader_one(project: Project) -> None:
    """No escalation applies to revocation: a keys:write-only key could otherwise lock the
    operator out by revoking the full-access bootstrap key."""
    narrow = await new_key(project.api, ["keys:write", "authz:check"], prefix="sk_live_")
    as_narrow = project.api.with_key(narrow["secret"])
    r = await as_narrow.delete(f"/v1/api-keys/{project.key_id}")
    assert_error(r, 403, "insufficient_scope")
    assert (await project.api.get("/v1/projects/me")).status == 200  # still works
    # Within its own access it may revoke.
    peer = await new_key(project.api, ["authz:check"], prefix="sk_live_")
    assert (await as_narrow.delete(f"/v1/api-keys/{peer['id']}")).status == 200


async def test_a_test_key_acts_on_test_keys_only(project: Project) -> None:
    test_key = await new_key(project.api, [], prefix="sk_test_")
    as_test = project.api.with_key(test_key["secret"])
    assert_error(await create(as_test, [], prefix="sk_live_"), 403, "insufficient_scope")
    assert (await create(as_test, ["authz:check"], prefix="sk_test_")).status == 201
    live = await new_key(project.api, ["authz:check"], prefix="sk_live_")
    assert_error(await as_test.delete(f"/v1/api-keys/{live['id']}"), 403, "insufficient_scope")


@pytest.mark.parametrize("name", ["a\u0000b", "tab\there", "bell\u0007"])
async def test_control_characters_in_a_name_are_invalid_request(project: Project, name: str) -> None:
    r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": name, "scopes": []})
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "name"


@pytest.mark.parametrize("limit", ["\u00b2", "\u0663", "1e3", " 5", "+5"])
async def test_non_ascii_digit_limits_are_invalid_request(project: Project, limit: str) -> None:
    from urllib.parse import quote

    r = await project.api.get(f"/v1/api-keys?limit={quote(limit)}")
    assert_error(r, 400, "invalid_request")


async def test_cursor_carrying_a_nul_is_invalid_request(project: Project, db: asyncpg.Pool) -> None:
    r = await project.api.get(f"/v1/api-keys?cursor={await _forged(db, project.id, 'api_keys', 'key_' + chr(0))}")
    assert_error(r, 400, "invalid_request")
