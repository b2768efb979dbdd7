"""POST /v1/bootstrap (SPEC.md 2 "bootstrap response shapes", 4 rule 1, 5.2-5.3, 6, 7)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.service import BOOTSTRAP_TOKEN, Api, assert_error, combined_app, start_app

HEADER = "x-service-bootstrap-token"
ULID = r"[0-9a-hjkmnp-tv-z]{26}"
UA = "authio-tests/bootstrap (+pytest)"


def body(tag: str | None = None, **over: Any) -> dict[str, Any]:
    tag = tag or secrets.token_hex(4)
    values = {"tenant_name": f"Acme {tag}", "project_name": f"web {tag}",
              "environment": "production"}
    values.update(over)
    return values


async def boot(service: Api, payload: Any, token: str | None = BOOTSTRAP_TOKEN,
               **headers: str) -> Any:
    hdrs = dict(headers)
    if token is not None:
        hdrs[HEADER] = token
    return await service.post("/v1/bootstrap", payload, headers=hdrs, key=None)


async def tenants_named(db: asyncpg.Pool, name: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM tenants WHERE name = $1", name))


async def test_bootstrap_returns_tenant_project_and_live_key(service: Api) -> None:
    payload = body()
    r = await boot(service, payload)
    assert r.status == 201, r.body
    assert r.headers["X-Request-Id"] == r.body["request_id"]

    tenant, project, key = r.body["tenant"], r.body["project"], r.body["api_key"]
    assert re.fullmatch(rf"ten_{ULID}", tenant["id"]), tenant
    assert tenant["name"] == payload["tenant_name"]
    assert re.fullmatch(rf"proj_{ULID}", project["id"]), project
    assert project["name"] == payload["project_name"]
    assert project["environment"] == "production"
    assert re.fullmatch(rf"key_{ULID}", key["id"]), key
    assert re.fullmatch(r"sk_live_[0-9A-Za-z]{43,}", key["secret"]), key["secret"]
    assert isinstance(key["warning"], str) and key["warning"].strip()
    # The plaintext shows once: nowhere else in the response.
    assert r.raw.count(key["secret"].encode()) == 1


async def test_bootstrap_key_works_on_projects_me(service: Api) -> None:
    payload = body(environment="staging")
    r = await boot(service, payload)
    assert r.status == 201, r.body
    me = await service.get("/v1/projects/me", key=r.body["api_key"]["secret"])
    assert me.status == 200, me.body
    assert me.body["id"] == r.body["project"]["id"]
    assert me.body["name"] == payload["project_name"]
    assert me.body["environment"] == "staging"
    assert me.headers["X-Request-Id"] == me.body["request_id"]


async def test_bootstrap_key_has_full_access(service: Api) -> None:
    r = await boot(service, body())
    api = service.with_key(r.body["api_key"]["secret"])
    created = await api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "ci",
                                              "scopes": ["authz:check"]})
    assert created.status == 201, created.body
    store = await api.post("/v1/stores", {"name": "docs"})
    assert store.status == 201, store.body


async def test_each_bootstrap_makes_a_new_isolated_project(service: Api) -> None:
    a = await boot(service, body())
    b = await boot(service, body())
    assert a.status == b.status == 201
    assert a.body["tenant"]["id"] != b.body["tenant"]["id"]
    assert a.body["project"]["id"] != b.body["project"]["id"]
    assert a.body["api_key"]["secret"] != b.body["api_key"]["secret"]
    me = await service.get("/v1/projects/me", key=b.body["api_key"]["secret"])
    assert me.body["id"] == b.body["project"]["id"]


@pytest.mark.parametrize("token", [
    "wrong-token-" + "y" * 32,
    BOOTSTRAP_TOKEN + "x",
    BOOTSTRAP_TOKEN[:-1],
    BOOTSTRAP_TOKEN.upper(),
    "",
    BOOTSTRAP_TOKEN + " x",
])
async def test_wrong_token_is_missing_bootstrap_token(service: Api, db: asyncpg.Pool,
                                                      token: str) -> None:
    payload = body()
    r = await boot(service, payload, token=token)
    assert_error(r, 401, "missing_bootstrap_token")
    assert await tenants_named(db, payload["tenant_name"]) == 0


async def test_missing_header_is_missing_bootstrap_token(service: Api, db: asyncpg.Pool) -> None:
    payload = body()
    r = await boot(service, payload, token=None)
    assert_error(r, 401, "missing_bootstrap_token")
    assert await tenants_named(db, payload["tenant_name"]) == 0


async def test_api_key_is_not_a_bootstrap_token(service: Api) -> None:
    r = await boot(service, body())
    r2 = await service.post("/v1/bootstrap", body(), key=r.body["api_key"]["secret"])
    assert_error(r2, 401, "missing_bootstrap_token")


async def test_wrong_token_is_checked_before_the_body(service: Api) -> None:
    """A stranger learns nothing from body validation."""
    r = await boot(service, {"nonsense": True}, token="nope")
    assert_error(r, 401, "missing_bootstrap_token")
    r = await service.post("/v1/bootstrap", data=b"{broken", headers={HEADER: "nope"}, key=None)
    assert_error(r, 401, "missing_bootstrap_token")


@pytest.mark.parametrize("configured", [None, ""])
async def test_unconfigured_token_is_bootstrap_disabled(
    settings_factory: Callable[..., Settings], http: ClientSession, db: asyncpg.Pool,
    configured: str | None,
) -> None:
    running = await start_app(combined_app(settings_factory(bootstrap_token=configured)))
    try:
        api = Api(http, running.base_url)
        payload = body()
        for token in (BOOTSTRAP_TOKEN, None, ""):
            r = await boot(api, payload, token=token)
            assert_error(r, 503, "bootstrap_disabled")
        assert await tenants_named(db, payload["tenant_name"]) == 0
    finally:
        await running.stop()


@pytest.mark.parametrize(("payload", "field"), [
    ({"project_name": "p", "environment": "e"}, "tenant_name"),
    ({"tenant_name": "t", "environment": "e"}, "project_name"),
    ({"tenant_name": "t", "project_name": "p"}, "environment"),
    ({"tenant_name": "", "project_name": "p", "environment": "e"}, "tenant_name"),
    ({"tenant_name": "   ", "project_name": "p", "environment": "e"}, "tenant_name"),
    ({"tenant_name": "t", "project_name": 5, "environment": "e"}, "project_name"),
    ({"tenant_name": "t" * 201, "project_name": "p", "environment": "e"}, "tenant_name"),
    ({"tenant_name": "t", "project_name": "p", "environment": None}, "environment"),
    ({"tenant_name": "t", "project_name": "p", "environment": "e", "owner": "me"}, "owner"),
])
async def test_invalid_body_is_invalid_request(service: Api, db: asyncpg.Pool,
                                               payload: dict[str, Any], field: str) -> None:
    before = await db.fetchval("SELECT count(*) FROM tenants")
    r = await boot(service, payload)
    assert_error(r, 400, "invalid_request")
    fields = [f["field"] for f in r.body["error"]["details"]["fields"]]
    assert field in fields, r.body
    assert await db.fetchval("SELECT count(*) FROM tenants") == before


@pytest.mark.parametrize("raw", [b"", b"[]", b"not json"])
async def test_non_object_body_is_invalid_request(service: Api, raw: bytes) -> None:
    r = await service.post("/v1/bootstrap", data=raw, headers={HEADER: BOOTSTRAP_TOKEN}, key=None)
    assert_error(r, 400, "invalid_request")


async def test_bootstrap_writes_audit_events_with_ip_and_user_agent(service: Api,
                                                                    db: asyncpg.Pool) -> None:
    r = await boot(service, body(), **{"User-Agent": UA})
    assert r.status == 201, r.body
    project_id, key_id = r.body["project"]["id"], r.body["api_key"]["id"]
    rows = await db.fetch(
        "SELECT * FROM audit_events WHERE project_id = $1 ORDER BY created_at, id", project_id
    )
    by_action = {row["action"]: row for row in rows}
    assert set(by_action) == {"dashboard_operator.bootstrapped", "api_key.created"}, rows
    assert len(rows) == 2, rows

    boot_evt = by_action["dashboard_operator.bootstrapped"]
    assert boot_evt["target_id"] == project_id
    key_evt = by_action["api_key.created"]
    assert key_evt["target_id"] == key_id
    for row in rows:
        assert re.fullmatch(rf"evt_{ULID}", row["id"]), row["id"]
        assert row["ip"] == "127.0.0.1", row
        assert row["user_agent"] == UA, row
        assert row["actor_type"], row
        assert row["created_at"] is not None
    # The secret and the bootstrap token never land in the log.
    dumped = str([dict(row) for row in rows])
    assert r.body["api_key"]["secret"] not in dumped
    assert BOOTSTRAP_TOKEN not in dumped


async def test_failed_bootstrap_writes_no_audit_event(service: Api, db: asyncpg.Pool) -> None:
    before = await db.fetchval(
        "SELECT count(*) FROM audit_events WHERE action = 'dashboard_operator.bootstrapped'"
    )
    assert_error(await boot(service, body(), token="bad"), 401, "missing_bootstrap_token")
    assert_error(await boot(service, {"tenant_name": "x"}), 400, "invalid_request")
    after = await db.fetchval(
        "SELECT count(*) FROM audit_events WHERE action = 'dashboard_operator.bootstrapped'"
    )
    assert after == before


async def test_bootstrap_key_is_stored_as_sha256(service: Api, db: asyncpg.Pool) -> None:
    import hashlib

    r = await boot(service, body())
    secret = r.body["api_key"]["secret"]
    row = await db.fetchrow("SELECT * FROM api_keys WHERE id = $1", r.body["api_key"]["id"])
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert row["prefix"] == "sk_live_"
    assert list(row["scopes"]) == []
    assert row["project_id"] == r.body["project"]["id"]
    assert all(secret not in str(v) for v in row.values())


async def test_a_header_that_is_not_utf8_is_refused_not_a_crash(service: Api) -> None:
    """Raw bytes 0xff 0xfe in the header (aiohttp keeps them as surrogate escapes): refused, not
    a crash, and no bootstrap. Sent over a plain socket, since an HTTP client would re-encode the
    value. The envelope refuses any header that is not UTF-8 text, naming it, before the token
    is compared (tests/common/test_raw_http.py)."""
    import asyncio
    import json
    from urllib.parse import urlsplit

    url = urlsplit(service.base_url)
    payload = json.dumps(body()).encode()
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(b"POST /v1/bootstrap HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + HEADER.encode() + b": \xff\xfe\r\nConnection: close\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, raw = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), response
    error = json.loads(raw)["error"]
    assert error["code"] == "invalid_request", error
    assert error["details"]["fields"] == [{"field": HEADER, "message": "must be UTF-8 text"}]


async def test_control_characters_in_names_are_invalid_request(service: Api) -> None:
    r = await boot(service, body(tenant_name="Acme\u0000"))
    assert_error(r, 400, "invalid_request")


@pytest.mark.parametrize(("trusted", "forwarded", "recorded"), [
    # No trusted proxy: the header is the client's own claim and is ignored.
    ("", "198.51.100.7", "127.0.0.1"),
    # Behind a trusted proxy (the ingress on loopback): the right-most untrusted hop.
    ("127.0.0.1/32", "198.51.100.7, 203.0.113.9", "203.0.113.9"),
    ("127.0.0.0/8,10.0.0.0/8", "198.51.100.7, 203.0.113.9, 10.1.2.3", "203.0.113.9"),
])
async def test_audit_ip_honours_only_trusted_proxies(
    settings_factory: Callable[..., Settings], http: ClientSession, db: asyncpg.Pool,
    trusted: str, forwarded: str, recorded: str,
) -> None:
    from tests.fixtures.service import serving

    async with serving(http, combined_app(settings_factory(trusted_proxies=trusted))) as api:
        payload = body()
        r = await boot(api, payload, **{"X-Forwarded-For": forwarded})
        assert r.status == 201, r.body
    ips = {row["ip"] for row in await db.fetch(
        "SELECT ip FROM audit_events WHERE project_id = $1", r.body["project"]["id"])}
    assert ips == {recorded}
