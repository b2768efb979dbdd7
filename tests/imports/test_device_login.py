"""The device authorization grant behind ``authio login`` (RFC 8628; DESIGN.md "CLI login and
import"), through HTTP as the CLI and the approval page use it."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from aiohttp import ClientSession

from tests.fixtures.database import events
from tests.fixtures.service import Api, Project, assert_error, assert_invalid_field, scoped

GRANT = "urn:ietf:params:oauth:grant-type:device_code"


async def _code(service: Api, **body: Any) -> dict[str, Any]:
    r = await service.post("/v1/cli/device/code", body or {}, key=None)
    assert r.status == 200, r.body
    assert r.headers["Cache-Control"] == "no-store"
    return dict(r.body)


async def _poll(service: Api, device_code: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    r = await service.post("/v1/cli/device/token",
                           {"grant_type": GRANT, "device_code": device_code, **extra}, key=None)
    return r.status, r.body


async def _rewind(db: asyncpg.Pool, device_code: str, *, seconds: int = 60,
                  expire: bool = False) -> None:
    """Move the request's last poll (and, with ``expire``, its deadline) into the past: the
    stand-in for waiting out the interval."""
    import hashlib
    digest = hashlib.sha256(device_code.encode()).digest()
    await db.execute(
        "UPDATE device_authorizations SET last_polled_at = last_polled_at - make_interval(secs"
        " => $2), expires_at = CASE WHEN $3 THEN now() - interval '1 second' ELSE expires_at END"
        " WHERE device_code_hash = $1", digest, seconds, expire)


async def test_approved_device_gets_a_key_once(service: Api, project: Project,
                                               db: asyncpg.Pool) -> None:
    code = await _code(service)
    assert code["interval"] == 5 and code["expires_in"] == 900
    assert code["verification_uri"] == f"http://localhost:{service.base_url.rsplit(':', 1)[1]}" \
                                       "/device" or code["verification_uri"].endswith("/device")
    user_code = code["user_code"]
    assert len(user_code) == 9 and user_code[4] == "-" and user_code.replace("-", "").isalpha()
    assert code["verification_uri_complete"].endswith(f"/device?user_code={user_code}")

    status, body = await _poll(service, code["device_code"])
    assert (status, body["error"]) == (400, "authorization_pending")

    # The operator types the code in any case, without the hyphen.
    approved = await project.api.post("/v1/cli/device/approve",
                                      {"user_code": user_code.replace("-", "").lower()})
    assert approved.status == 200, approved.body
    assert approved.body["status"] == "approved" and approved.body["project_id"] == project.id
    assert approved.body["scopes"] == ["organizations:write", "users:read", "users:write"]

    await _rewind(db, code["device_code"])
    status, token = await _poll(service, code["device_code"])
    assert status == 200, token
    assert token["token_type"] == "Bearer" and token["project_id"] == project.id
    assert token["access_token"].startswith("sk_live_") and token["key_id"].startswith("key_")

    cli = service.with_key(token["access_token"])
    made = await cli.post("/v1/users", {"email": "imported@example.com", "email_verified": True})
    assert made.status == 201, made.body
    assert_error(await cli.get("/v1/audit/events"), 403, "insufficient_scope")  # import scopes only

    status, again = await _poll(service, code["device_code"])  # a code is redeemed once
    assert (status, again["error"]) == (400, "invalid_grant")

    [created] = [e for e in await events(db, project.id, "api_key.created")
                 if e["target_id"] == token["key_id"]]
    assert created["actor_id"] == project.key_id  # the approving key granted it
    assert created["metadata"]["via"] == "device_authorization"
    assert token["access_token"] not in str(created)
    [decided] = await events(db, project.id, "cli.device.approved")
    assert decided["metadata"]["scopes"] == approved.body["scopes"]


async def test_polling_too_fast_is_slowed_down(service: Api, db: asyncpg.Pool) -> None:
    """RFC 8628 3.5: a poll sooner than the interval is ``slow_down``, and the interval grows
    by 5 s each time."""
    code = await _code(service)
    assert (await _poll(service, code["device_code"]))[1]["error"] == "authorization_pending"
    assert (await _poll(service, code["device_code"]))[1]["error"] == "slow_down"  # 10 s now
    await _rewind(db, code["device_code"], seconds=6)
    assert (await _poll(service, code["device_code"]))[1]["error"] == "slow_down"  # 15 s now
    await _rewind(db, code["device_code"], seconds=16)
    assert (await _poll(service, code["device_code"]))[1]["error"] == "authorization_pending"


async def test_denied_and_expired(service: Api, project: Project, db: asyncpg.Pool) -> None:
    denied = await _code(service)
    r = await project.api.post("/v1/cli/device/approve",
                               {"user_code": denied["user_code"], "decision": "deny"})
    assert r.status == 200 and r.body["status"] == "denied" and r.body["scopes"] == []
    assert (await _poll(service, denied["device_code"]))[1]["error"] == "access_denied"
    assert_invalid_field(await project.api.post("/v1/cli/device/approve",
                                                {"user_code": denied["user_code"]}), "user_code")
    assert await events(db, project.id, "cli.device.denied")

    late = await _code(service)
    await _rewind(db, late["device_code"], expire=True)
    assert (await _poll(service, late["device_code"]))[1]["error"] == "expired_token"
    r = await project.api.post("/v1/cli/device/approve", {"user_code": late["user_code"]})
    assert_invalid_field(r, "user_code")


async def test_the_token_endpoint_speaks_oauth(service: Api, http: ClientSession) -> None:
    """Form fields as OAuth clients send them, and OAuth error bodies for every refusal."""
    code = await _code(service)
    async with http.post(f"{service.base_url}/v1/cli/device/token", data={
            "grant_type": GRANT, "device_code": code["device_code"],
            "client_id": "authio-cli"}) as r:
        assert r.status == 400 and (await r.json())["error"] == "authorization_pending"
        assert r.headers["Cache-Control"] == "no-store"
    async with http.post(f"{service.base_url}/v1/cli/device/code",
                         data={"client_id": "my-tool", "scope": "users:write"}) as r:
        assert r.status == 200
        other = await r.json()
    status, body = await _poll(service, other["device_code"], client_id="authio-cli")
    assert (status, body["error"]) == (400, "invalid_grant")  # issued to my-tool
    status, body = await _poll(service, "not-a-code")
    assert (status, body["error"]) == (400, "invalid_grant")
    r = await service.post("/v1/cli/device/token", {"grant_type": "password",
                                                    "device_code": code["device_code"]}, key=None)
    assert (r.status, r.body["error"]) == (400, "unsupported_grant_type")
    r = await service.post("/v1/cli/device/token", {"grant_type": GRANT}, key=None)
    assert (r.status, r.body["error"]) == (400, "invalid_request")
    assert "device_code" in r.body["error_description"]
    assert_invalid_field(await service.post("/v1/cli/device/code", {"scope": "everything"},
                                            key=None), "scope")


async def test_the_device_asks_for_scopes_and_the_approver_decides(
        service: Api, project: Project, db: asyncpg.Pool) -> None:
    asked = await _code(service, scope="users:read")
    r = await project.api.post("/v1/cli/device/approve", {"user_code": asked["user_code"]})
    assert r.body["scopes"] == ["users:read"]
    narrowed = await _code(service)
    r = await project.api.post("/v1/cli/device/approve", {"user_code": narrowed["user_code"],
                                                          "scopes": ["users:write"]})
    assert r.body["scopes"] == ["users:write"]
    assert_invalid_field(await project.api.post("/v1/cli/device/approve", {
        "user_code": narrowed["user_code"], "scopes": []}), "scopes")  # never full access
    await _rewind(db, narrowed["device_code"])
    status, token = await _poll(service, narrowed["device_code"])
    assert status == 200 and token["scope"] == "users:write"


async def test_only_a_full_access_key_approves(service: Api, project: Project) -> None:
    code = await _code(service)
    narrow = await scoped(project, "keys:write", "users:write")
    assert_error(await narrow.post("/v1/cli/device/approve", {"user_code": code["user_code"]}),
                 403, "insufficient_scope")
    assert_error(await service.post("/v1/cli/device/approve", {"user_code": code["user_code"]},
                                    key=None), 401, "missing_api_key")
    assert_invalid_field(await project.api.post("/v1/cli/device/approve",
                                                {"user_code": "AEIO-UAEI"}), "user_code")


async def test_a_key_may_revoke_itself_and_only_itself(project: Project) -> None:
    """What ``authio logout`` does with a key that has no ``keys:write``."""
    a = await project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "cli",
                                                "scopes": ["users:write"]})
    b = await project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "other",
                                                "scopes": ["users:write"]})
    cli = project.api.with_key(a.body["secret"])
    assert_error(await cli.delete(f"/v1/api-keys/{b.body['id']}"), 403, "insufficient_scope")
    r = await cli.delete(f"/v1/api-keys/{a.body['id']}")
    assert r.status == 200 and r.body["revoked_at"] is not None
    assert_error(await cli.get("/v1/users"), 401, "invalid_api_key")


@pytest.mark.parametrize("path", ["/device", "/device?user_code=QRST-VWXZ"])
async def test_the_approval_page_is_served(service: Api, http: ClientSession, path: str) -> None:
    async with http.get(service.base_url + path) as r:
        assert r.status == 200 and r.content_type == "text/html"
        assert "script-src 'nonce-" in r.headers["Content-Security-Policy"]
        text = await r.text()
    assert '<label for="user_code">' in text and '<label for="api_key">' in text
    assert "QRST" not in text  # the page fills the code itself: nothing from the URL is echoed
