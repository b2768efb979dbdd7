"""The session state table of SPEC.md 3 through HTTP: select-org, switch-org, refresh (rotation
and reuse detection), revoke (with the Redis revocation set and its channel), me."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientSession
from redis.asyncio import Redis

from common.auth import token_digest
from common.settings import Settings
from tests.fixtures.database import events
from tests.fixtures.identity import SignedIn, add_member, announced_score, email, make_org, session_call, sign_in
from tests.fixtures.service import Api, Project, assert_error, combined_app, serving


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


async def member_of(project: Project, orgs: int, *, api: Api | None = None) -> tuple[SignedIn, list[dict[str, Any]]]:
    """A user with ``orgs`` active memberships, signed in."""
    to = email()
    user = (await project.api.post("/v1/users", {"email": to, "name": "Member"})).body
    made = []
    for n in range(orgs):
        org = await make_org(project)
        await add_member(project, org["id"], user["id"], role="admin" if n == 0 else "member")
        made.append(org)
    return await sign_in(project, to, api=api, count=2), made


# --- no session -------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [None, {}, {"organization_id": 7}])
@pytest.mark.parametrize("path", ["/v1/sessions/select-org", "/v1/sessions/switch-org"])
async def test_no_session_comes_before_body_validation(service: Api, path: str, body: Any) -> None:
    r = await session_call(service, "POST", path, None, json=body)
    assert_error(r, 401, "no_session")


async def test_cookie_setting_endpoints_take_json_only(service: Api, project: Project) -> None:
    """Login CSRF: a form on another site can post text/plain without a preflight."""
    s, (org,) = await member_of(project, 1, api=service)
    form = {"Content-Type": "text/plain", "Origin": "https://evil.example"}
    r = await service.post("/v1/sessions/refresh", data=orjson.dumps({"refresh_token": s.refresh_token}),
                           headers=form, key=None)
    assert_error(r, 400, "invalid_request")
    r = await service.post("/v1/sessions/select-org", data=orjson.dumps({"organization_id": org["id"]}),
                           headers={**form, "Authorization": f"Bearer {s.access_token}"}, key=None)
    assert_error(r, 400, "invalid_request")
    r = await service.post(f"/v1/auth/magic-link/verify?project_id={project.id}",
                           data=b'{"token":"=","token":"x"}', headers=form, key=None)
    assert_error(r, 400, "invalid_request")
    assert "Set-Cookie" not in r.headers
    assert (await refresh(service, s.refresh_token)).status == 200  # unharmed


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/sessions/select-org"), ("POST", "/v1/sessions/switch-org"),
    ("POST", "/v1/sessions/revoke"), ("GET", "/v1/sessions/me"), ("POST", "/v1/sessions/refresh"),
])
async def test_session_endpoints_without_a_session(service: Api, method: str, path: str) -> None:
    body = {"organization_id": "org_01jd0000000000000000000000"} if "org" in path else None
    r = await session_call(service, method, path, None, json=body)
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "missing"


async def test_a_garbage_or_tampered_token_is_no_session(service: Api, project: Project) -> None:
    s = await sign_in(project, email(), api=service)
    assert_error(await session_call(service, "GET", "/v1/sessions/me", "not.a.jwt"), 401, "no_session")
    head, _payload, sig = s.access_token.split(".")
    claims = claims_of(s.access_token)
    claims["sub"] = "user_01jd0000000000000000000000"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    r = await session_call(service, "GET", "/v1/sessions/me", f"{head}.{forged}.{sig}")
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "token_invalid"
    # An API key is not a session.
    assert_error(await session_call(service, "GET", "/v1/sessions/me", project.key), 401, "no_session")


async def test_me_by_bearer_and_by_cookie(service: Api, project: Project) -> None:
    s = await sign_in(project, email(), api=service)
    r = await session_call(service, "GET", "/v1/sessions/me", s.access_token)
    assert r.status == 200, r.body
    assert r.body["session"]["id"] == s.session_id and r.body["user"]["id"] == s.user_id
    assert r.body["session"]["status"] == "active"
    r = await service.get("/v1/sessions/me", key=None,
                          headers={"Cookie": f"service_session={s.access_token}"})
    assert r.status == 200 and r.body["session"]["id"] == s.session_id


# --- select-org and switch-org ------------------------------------------------------------------


async def test_select_org_once_then_switch(service: Api, project: Project, db: asyncpg.Pool) -> None:
    s, (first, second) = await member_of(project, 2, api=service)
    assert s.body["session"]["organization_id"] is None
    # switch-org needs a first selection
    r = await session_call(service, "POST", "/v1/sessions/switch-org", s.access_token,
                           {"organization_id": second["id"]})
    assert_error(r, 409, "no_org_selected")

    r = await session_call(service, "POST", "/v1/sessions/select-org", s.access_token,
                           {"organization_id": first["id"]})
    assert r.status == 200, r.body
    assert r.body["session"]["organization_id"] == first["id"] and r.body["session"]["role"] == "admin"
    assert "refresh_token" not in r.body  # the refresh token did not change
    token = r.body["access_token"]
    assert r.headers["Set-Cookie"].startswith(f"service_session={token};")
    c = claims_of(token)
    assert c["act_org"] == first["id"] and c["act_role"] == "admin" and c["sid"] == s.session_id

    # selecting again: the same org is harmless, another one is a switch
    again = await session_call(service, "POST", "/v1/sessions/select-org", token,
                               {"organization_id": first["id"]})
    assert again.status == 200
    r = await session_call(service, "POST", "/v1/sessions/select-org", token,
                           {"organization_id": second["id"]})
    assert_error(r, 409, "org_already_selected")

    r = await session_call(service, "POST", "/v1/sessions/switch-org", token,
                           {"organization_id": second["id"]})
    assert r.status == 200, r.body
    c = claims_of(r.body["access_token"])
    assert c["act_org"] == second["id"] and c["act_role"] == "member"
    [event] = await events(db, project.id, "session.org_switched")
    assert event["target_id"] == s.session_id and event["user_id"] == s.user_id
    assert event["metadata"]["from_organization_id"] == first["id"]
    assert event["metadata"]["to_organization_id"] == second["id"]
    me = await session_call(service, "GET", "/v1/sessions/me", r.body["access_token"])
    assert me.body["session"]["organization_id"] == second["id"]


async def test_not_a_member(service: Api, project: Project, new_project: Callable[..., Any]) -> None:
    s, (_org,) = await member_of(project, 1, api=service)
    stranger_org = await make_org(project)
    other = await new_project("other")
    foreign_org = await make_org(other)
    token = s.access_token
    for org_id in (stranger_org["id"], foreign_org["id"], "org_01jd0000000000000000000000", "nope"):
        r = await session_call(service, "POST", "/v1/sessions/switch-org", token,
                               {"organization_id": org_id})
        assert_error(r, 403, "not_a_member")


# --- refresh ----------------------------------------------------------------------------------


async def refresh(api: Api, token: str) -> Any:
    return await api.post("/v1/sessions/refresh", {"refresh_token": token}, key=None)


async def test_refresh_rotates_the_refresh_token(service: Api, project: Project) -> None:
    s = await sign_in(project, email(), api=service)
    r = await refresh(service, s.refresh_token)
    assert r.status == 200, r.body
    assert r.body["refresh_token"].startswith("rt_") and r.body["refresh_token"] != s.refresh_token
    assert r.body["session"]["id"] == s.session_id
    old, new = claims_of(s.access_token), claims_of(r.body["access_token"])
    assert new["exp"] == new["iat"] + 900 and new["iat"] >= old["iat"] and new["sid"] == old["sid"]
    assert r.headers["Set-Cookie"].startswith("service_session=")
    # the new refresh token works in turn
    assert (await refresh(service, r.body["refresh_token"])).status == 200


async def test_refresh_without_or_with_an_unknown_token(service: Api) -> None:
    r = await service.post("/v1/sessions/refresh", {}, key=None)
    assert_error(r, 401, "no_session")
    r = await refresh(service, "rt_" + secrets.token_urlsafe(32))
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "unknown_refresh_token"
    r = await service.post("/v1/sessions/refresh", {"refresh_token": "x", "extra": 1}, key=None)
    assert_error(r, 400, "invalid_request")


async def test_reusing_a_rotated_refresh_token_revokes_the_session(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
    redis: Redis, db: asyncpg.Pool,
) -> None:
    settings = settings_factory(refresh_reuse_grace_seconds=0)
    async with serving(http, combined_app(settings)) as api:
        s = await sign_in(project, email(), api=api)
        r1 = await refresh(api, s.refresh_token)
        assert r1.status == 200
        stolen = await refresh(api, s.refresh_token)  # the first token, presented again
        assert_error(stolen, 401, "no_session")
        assert stolen.body["error"]["details"]["reason"] == "refresh_token_reused"
        # The whole session is gone: its newest refresh token and its access tokens.
        r = await refresh(api, r1.body["refresh_token"])
        assert_error(r, 401, "no_session")
        assert r.body["error"]["details"]["reason"] == "session_revoked"
        r = await session_call(api, "GET", "/v1/sessions/me", r1.body["access_token"])
        assert_error(r, 401, "no_session")
        assert r.body["error"]["details"]["reason"] == "session_revoked"
        score = await announced_score(redis, settings.redis_prefix, s.session_id)
        assert score >= claims_of(r1.body["access_token"])["exp"]
        [event] = [e for e in await events(db, project.id, "session.revoked")
                   if e["target_id"] == s.session_id]
        assert event["metadata"]["reason"] == "refresh_token_reused"


async def test_the_predecessor_is_forgiven_within_the_grace(service: Api, project: Project) -> None:
    s = await sign_in(project, email(), api=service)
    r1 = await refresh(service, s.refresh_token)
    assert r1.status == 200
    # The response was lost: the client retries with the token it still has, and gets the same
    # new refresh token (issue 10: one pair for every presentation within the grace).
    retry = await refresh(service, s.refresh_token)
    assert retry.status == 200, retry.body
    assert retry.body["refresh_token"] == r1.body["refresh_token"] != s.refresh_token
    assert (await refresh(service, retry.body["refresh_token"])).status == 200


async def test_grace_covers_only_the_immediate_predecessor(service: Api, project: Project) -> None:
    s = await sign_in(project, email(), api=service)
    r1 = await refresh(service, s.refresh_token)
    r2 = await refresh(service, r1.body["refresh_token"])
    assert r2.status == 200
    r = await refresh(service, s.refresh_token)  # two generations old
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "refresh_token_reused"


async def test_concurrent_refreshes_rotate_once_each(service: Api, project: Project,
                                                     db: asyncpg.Pool) -> None:
    s = await sign_in(project, email(), api=service)
    results = await asyncio.gather(*(refresh(service, s.refresh_token) for _ in range(5)))
    # Serialised on the session: the first rotates, the others present the predecessor within
    # the grace and get the same successor (two tabs, one pair: issue 10).
    assert [r.status for r in results] == [200] * 5, [r.body for r in results]
    assert len({r.body["refresh_token"] for r in results}) == 1
    assert await db.fetchval(
        "SELECT count(*) FROM refresh_tokens WHERE session_id = $1", s.session_id) == 2
    # Each tab later refreshes with the pair it got: the first rotates it, the second is
    # forgiven within the grace and answered the same new pair; the session lives on.
    first = await refresh(service, results[0].body["refresh_token"])
    second = await refresh(service, results[4].body["refresh_token"])
    assert first.status == second.status == 200, (first.body, second.body)
    assert first.body["refresh_token"] == second.body["refresh_token"]
    assert (await refresh(service, second.body["refresh_token"])).status == 200


async def test_two_holders_of_one_token_cannot_take_turns(service: Api, project: Project,
                                                         db: asyncpg.Pool) -> None:
    """A stolen refresh token used within the grace gets the victim's own answer (one pair, never
    two chains: issue 10), and the two holders cannot take turns beyond it: presenting a rotated
    token after the grace is reuse, which revokes the session."""
    s = await sign_in(project, email(), api=service)
    victim = await refresh(service, s.refresh_token)  # presents P, receives C1
    thief = await refresh(service, s.refresh_token)  # P again within the grace: C1 too
    assert victim.status == thief.status == 200
    assert thief.body["refresh_token"] == victim.body["refresh_token"]
    onward = await refresh(service, victim.body["refresh_token"])  # C1 rotates to C2
    assert onward.status == 200, onward.body
    # The grace runs out (time travel: C1 was presented an hour ago).
    await db.execute(
        "UPDATE refresh_tokens SET used_at = now() - interval '1 hour' WHERE token_hash = $1",
        token_digest(victim.body["refresh_token"]))
    r = await refresh(service, thief.body["refresh_token"])
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "refresh_token_reused"
    r = await refresh(service, onward.body["refresh_token"])
    assert_error(r, 401, "no_session")
    assert r.body["error"]["details"]["reason"] == "session_revoked"


async def test_a_token_rotated_before_successors_were_derived_gets_one_new_generation(
        service: Api, project: Project, db: asyncpg.Pool) -> None:
    """Tokens rotated before migration 0005 have a random successor, not the derived one: within
    the grace they get a new generation once, and the same one on every later presentation
    (never a second insert of the same token, which would be a 500)."""
    s = await sign_in(project, email(), api=service)
    first = await refresh(service, s.refresh_token)
    assert first.status == 200
    await db.execute("UPDATE refresh_tokens SET token_hash = $2 WHERE token_hash = $1",
                     token_digest(first.body["refresh_token"]), secrets.token_bytes(32))
    answers = [await refresh(service, s.refresh_token) for _ in range(3)]
    assert [a.status for a in answers] == [200] * 3, [a.body for a in answers]
    assert len({a.body["refresh_token"] for a in answers}) == 1
    assert await db.fetchval(
        "SELECT count(*) FROM refresh_tokens WHERE session_id = $1", s.session_id) == 3
    assert (await refresh(service, answers[0].body["refresh_token"])).status == 200


async def test_refresh_drops_an_org_whose_membership_ended(service: Api, project: Project) -> None:
    s, (org,) = await member_of(project, 1, api=service)
    assert s.body["session"]["organization_id"] == org["id"]
    m = (await project.api.get(f"/v1/organizations/{org['id']}/memberships")).body["data"][0]
    r = await project.api.delete(f"/v1/organizations/{org['id']}/memberships/{m['id']}")
    assert r.status == 200, r.body
    r = await refresh(service, s.refresh_token)
    assert r.status == 200, r.body
    assert r.body["session"]["organization_id"] is None
    assert "act_org" not in claims_of(r.body["access_token"])


# --- revoke -----------------------------------------------------------------------------------


async def test_revoke_ends_the_session_everywhere(
    service: Api, project: Project, redis: Redis, settings_factory: Callable[..., Settings],
    db: asyncpg.Pool,
) -> None:
    prefix = settings_factory().redis_prefix
    s, (first, _second) = await member_of(project, 2, api=service)
    selected = await session_call(service, "POST", "/v1/sessions/select-org", s.access_token,
                                  {"organization_id": first["id"]})
    org_token = selected.body["access_token"]
    pubsub = redis.pubsub()
    await pubsub.subscribe(f"{prefix}session_revocations")
    try:
        r = await session_call(service, "POST", "/v1/sessions/revoke", org_token)
        assert r.status == 200, r.body
        assert r.body["revoked"] is True and r.body["session"]["status"] == "revoked"
        assert "service_session=" in r.headers["Set-Cookie"] and "Max-Age=0" in r.headers["Set-Cookie"]
        # Other revocations may be announced meanwhile (other tests, a rebuild): wait for ours.
        deadline, heard = time.monotonic() + 5, []
        while s.session_id.encode() not in heard and time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                heard.append(message["data"].split(b" ")[0])  # "<session id> <revoked at>"
        assert s.session_id.encode() in heard, heard
    finally:
        await pubsub.aclose()
    # Every org context of the session is revoked: the token without org and the one with it.
    for token in (s.access_token, org_token):
        r = await session_call(service, "GET", "/v1/sessions/me", token)
        assert_error(r, 401, "no_session")
    assert_error(await refresh(service, s.refresh_token), 401, "no_session")
    key = f"{prefix}revoked_sessions"
    score = await announced_score(redis, prefix, s.session_id)
    latest_exp = max(claims_of(t)["exp"] for t in (s.access_token, org_token))
    assert score >= latest_exp
    ttl = await redis.ttl(key)
    assert ttl >= latest_exp - int(time.time())
    assert [e["target_id"] for e in await events(db, project.id, "session.revoked")] == [s.session_id]


async def test_deleting_a_user_revokes_their_sessions(service: Api, project: Project,
                                                      redis: Redis,
                                                      settings_factory: Callable[..., Settings]) -> None:
    s = await sign_in(project, email(), api=service)
    r = await project.api.delete(f"/v1/users/{s.user_id}")
    assert r.status == 200, r.body
    assert_error(await session_call(service, "GET", "/v1/sessions/me", s.access_token), 401, "no_session")
    await announced_score(redis, settings_factory().redis_prefix, s.session_id)


async def test_access_token_lifetime_follows_the_setting(
    http: ClientSession, settings_factory: Callable[..., Settings], project: Project,
) -> None:
    settings = settings_factory(access_token_ttl_seconds=60)
    async with serving(http, combined_app(settings)) as api:
        s = await sign_in(project, email(), api=api)
        c = claims_of(s.access_token)
        assert c["exp"] - c["iat"] == 60 and s.body["expires_in"] == 60
        assert "Max-Age=60" in s.response.headers["Set-Cookie"]
