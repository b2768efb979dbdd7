"""Admin portal setup links (issue 23; SPEC.md 3, 5 rule 7, 7): made by an API key for an
organization of its project, stored hashed, opened once within their lifetime; the portal
session they start, and the refusals ``token_consumed``, ``token_expired`` and
``token_invalid_or_expired`` (410), in JSON or, for a browser, as a page."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from common.auth import token_digest
from control_plane.portal import tasks
from tests.fixtures.database import events
from tests.fixtures.identity import make_org
from tests.fixtures.service import ULID, Api, Project, assert_error, bootstrap_project, scoped, ts
from tests.portal.helpers import (
    BROWSER_ACCEPT,
    make_link,
    open_link,
    opened,
    portal_call,
    session_cookie,
    token_of,
)

LINK_FIELDS = {"id", "link", "organization_id", "intent", "expires_at", "created_at", "request_id"}


async def test_a_link_is_made_for_an_organization_and_its_token_stored_hashed(
        portal_service: Api, portal_project: Project, db: asyncpg.Pool) -> None:
    org = await make_org(portal_project)
    before = datetime.now(UTC)
    r = await portal_project.api.post("/v1/portal/links",
                                      {"organization_id": org["id"], "intent": "scim"})
    assert r.status == 201, r.body
    link = r.body
    assert set(link) == LINK_FIELDS
    assert re.fullmatch(rf"plk_{ULID}", link["id"])
    assert (link["organization_id"], link["intent"]) == (org["id"], "scim")
    assert re.fullmatch(rf"{re.escape(portal_service.base_url)}/portal\?token=ptk_[A-Za-z0-9_-]{{43}}",
                        link["link"]), link["link"]
    # Five minutes by default, by the database's clock.
    lifetime = ts(link["expires_at"]) - before
    assert timedelta(minutes=4, seconds=55) < lifetime < timedelta(minutes=5, seconds=5), lifetime

    token = token_of(link["link"])
    row = await db.fetchrow("SELECT * FROM portal_links WHERE id = $1", link["id"])
    assert row["token_hash"] == token_digest(token)
    assert token.encode() not in b"".join(
        v if isinstance(v, bytes) else str(v).encode() for v in row.values())
    assert row["consumed_at"] is None and row["session_hash"] is None

    [event] = await events(db, portal_project.id, "portal.link.created")
    assert (event["actor_type"], event["actor_id"]) == ("api_key", portal_project.key_id)
    assert (event["target_type"], event["target_id"]) == ("organization", org["id"])
    assert event["metadata"]["portal_link_id"] == link["id"]
    assert event["metadata"]["intent"] == "scim" and event["metadata"]["ttl_seconds"] == 300
    assert token not in str(event)


async def test_making_a_link_takes_organizations_write(portal_project: Project) -> None:
    org = await make_org(portal_project)
    body = {"organization_id": org["id"], "intent": "domain_verification"}
    reader = await scoped(portal_project, "users:read", "users:write")
    r = await reader.post("/v1/portal/links", body)
    assert_error(r, 403, "insufficient_scope")
    assert r.body["error"]["details"]["required_scopes"] == ["organizations:write"]
    writer = await scoped(portal_project, "organizations:write")
    assert (await writer.post("/v1/portal/links", body)).status == 201
    assert_error(await portal_project.api.post("/v1/portal/links", body, key=None),
                 401, "missing_api_key")


async def test_an_organization_of_another_project_is_not_found(
        portal_service: Api, portal_project: Project) -> None:
    other = await bootstrap_project(portal_service, "other")
    theirs = await make_org(other)
    for org_id in (theirs["id"], "org_" + "0" * 26):
        r = await portal_project.api.post("/v1/portal/links",
                                          {"organization_id": org_id, "intent": "scim"})
        assert_error(r, 404, "organization_not_found")
    r = await portal_project.api.post("/v1/portal/links",
                                      {"organization_id": "acme", "intent": "scim"})
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "organization_id"


@pytest.mark.parametrize(("ttl", "status"), [(59, 400), (60, 201), (86_400, 201), (86_401, 400),
                                             (600.0, 201), (90.5, 400), ("300", 400)])
async def test_the_lifetime_is_bounded(portal_project: Project, ttl: object, status: int) -> None:
    org = await make_org(portal_project)
    r = await portal_project.api.post("/v1/portal/links", {
        "organization_id": org["id"], "intent": "scim", "ttl_seconds": ttl})
    assert r.status == status, r.body
    if status == 201:
        lifetime = ts(r.body["expires_at"]) - ts(r.body["created_at"])
        assert abs(lifetime.total_seconds() - float(ttl)) < 5, lifetime  # type: ignore[arg-type]
    else:
        assert r.body["error"]["details"]["fields"][0]["field"] == "ttl_seconds"


async def test_a_link_opens_the_portal_once(portal_service: Api, portal_project: Project,
                                            db: asyncpg.Pool) -> None:
    org = await make_org(portal_project)
    link = await make_link(portal_project, org["id"])
    r = await open_link(portal_service, link["link"], accept=BROWSER_ACCEPT)
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/html")
    assert r.headers["Cache-Control"] == "no-store"
    assert r.headers["Referrer-Policy"] == "no-referrer"
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert "frame-ancestors 'none'" in csp
    assert "<script src=\"/portal/static/portal.js" in r.raw.decode()
    assert "<script>" not in r.raw.decode()  # no inline script
    cookie = session_cookie(r)
    assert cookie.startswith("pts_")
    row = await db.fetchrow("SELECT * FROM portal_links WHERE id = $1", link["id"])
    assert row["consumed_at"] is not None and row["session_hash"] == token_digest(cookie)
    session_left = row["session_expires_at"] - row["consumed_at"]
    assert session_left == timedelta(hours=1)

    # Opened again, by anyone: used up. In JSON, and as a page for a browser.
    again = await open_link(portal_service, link["link"])
    assert_error(again, 410, "token_consumed")
    assert "Set-Cookie" not in again.headers
    page = await open_link(portal_service, link["link"], accept=BROWSER_ACCEPT)
    assert page.status == 410 and page.headers["Content-Type"].startswith("text/html")
    text = page.raw.decode()
    assert "This setup link was already used" in text and "token_consumed" in text
    assert page.headers["X-Request-Id"] in text
    assert page.headers["Cache-Control"] == "no-store"
    assert "Set-Cookie" not in page.headers

    state = await portal_call(portal_service, "GET", "/v1/portal/state", cookie)
    assert state.status == 200, state.body
    assert state.body["organization"] == {"id": org["id"], "name": org["name"]}
    assert state.body["intent"] == "domain_verification" and state.body["domains"] == []
    assert state.body["scim"] is None

    [event] = await events(db, portal_project.id, "portal.link.opened")
    assert (event["actor_type"], event["actor_id"]) == ("portal", link["id"])
    assert (event["target_type"], event["target_id"]) == ("organization", org["id"])
    assert event["ip"] == "127.0.0.1" and event["api_key_id"] is None


async def test_two_openings_at_once_start_one_session(portal_service: Api,
                                                      portal_project: Project) -> None:
    org = await make_org(portal_project)
    link = await make_link(portal_project, org["id"])
    answers = await asyncio.gather(*(open_link(portal_service, link["link"]) for _ in range(8)))
    assert sorted(r.status for r in answers) == [200] + [410] * 7
    assert {r.body["error"]["code"] for r in answers if r.status == 410} == {"token_consumed"}


async def test_a_link_past_its_lifetime_is_expired(portal_service: Api, portal_project: Project,
                                                   db: asyncpg.Pool) -> None:
    org = await make_org(portal_project)
    link = await make_link(portal_project, org["id"], ttl_seconds=60)
    moved = await db.execute("UPDATE portal_links SET expires_at = now() - interval '1 second' "
                             "WHERE id = $1", link["id"])
    assert moved == "UPDATE 1"
    assert_error(await open_link(portal_service, link["link"]), 410, "token_expired")
    page = await open_link(portal_service, link["link"], accept=BROWSER_ACCEPT)
    assert page.status == 410 and "This setup link has expired" in page.raw.decode()
    # Expired is not used up: it stays expired.
    assert_error(await open_link(portal_service, link["link"]), 410, "token_expired")


async def test_an_unknown_token_is_invalid_or_expired(portal_service: Api,
                                                      portal_project: Project) -> None:
    for token in ("ptk_" + "A" * 43, "nonsense", "ptk_"):
        r = await portal_service.get(f"/portal?token={token}", key=None)
        assert_error(r, 410, "token_invalid_or_expired")
    page = await portal_service.get("/portal?token=ptk_x", key=None,
                                    headers={"Accept": BROWSER_ACCEPT})
    assert page.status == 410 and "This setup link is not valid" in page.raw.decode()


async def test_a_link_purged_a_day_after_it_ended_is_invalid_or_expired(
        portal_service: Api, portal_project: Project, db: asyncpg.Pool) -> None:
    """Why an unknown token is not told from an expired one: a day after a link ended it is
    deleted, and its token is then unknown too."""
    org = await make_org(portal_project)
    link = await make_link(portal_project, org["id"])
    await db.execute("UPDATE portal_links SET expires_at = now() - interval '25 hours', "
                     "created_at = now() - interval '26 hours' WHERE id = $1", link["id"])
    assert_error(await open_link(portal_service, link["link"]), 410, "token_expired")
    deleted = await tasks.purge(db)
    assert deleted["portal_links"] >= 1
    assert await db.fetchval("SELECT count(*) FROM portal_links WHERE id = $1", link["id"]) == 0
    assert_error(await open_link(portal_service, link["link"]), 410, "token_invalid_or_expired")


async def test_the_portal_calls_need_a_live_session(portal_service: Api, portal_project: Project,
                                                    db: asyncpg.Pool) -> None:
    portal = await opened(portal_service, portal_project)
    body = {"domain": "example.com"}
    for cookie in (None, "pts_" + "x" * 43, ""):
        for method, path, json in (("GET", "/v1/portal/state", None),
                                   ("POST", "/v1/portal/domains", body),
                                   ("POST", "/v1/portal/domains/verify", body)):
            r = await portal_call(portal_service, method, path, cookie, json=json)
            assert_error(r, 410, "token_invalid_or_expired")
    # The setup token is not a session, nor is an API key.
    r = await portal_call(portal_service, "GET", "/v1/portal/state", token_of(portal.link["link"]))
    assert_error(r, 410, "token_invalid_or_expired")
    r = await portal_service.get("/v1/portal/state", key=portal_project.key)
    assert_error(r, 410, "token_invalid_or_expired")

    assert (await portal_call(portal_service, "GET", "/v1/portal/state", portal.cookie)).status == 200
    await db.execute("UPDATE portal_links SET session_expires_at = now() - interval '1 second' "
                     "WHERE id = $1", portal.link["id"])
    for method, path, json in (("GET", "/v1/portal/state", None),
                               ("POST", "/v1/portal/domains", body),
                               ("POST", "/v1/portal/domains/verify", body)):
        r = await portal_call(portal_service, method, path, portal.cookie, json=json)
        assert_error(r, 410, "token_invalid_or_expired")
    # An invalid body is not looked at without a session.
    r = await portal_call(portal_service, "POST", "/v1/portal/domains", portal.cookie,
                          json={"domain": 7})
    assert_error(r, 410, "token_invalid_or_expired")


async def test_a_deleted_organization_ends_its_sessions(portal_service: Api,
                                                        portal_project: Project) -> None:
    portal = await opened(portal_service, portal_project)
    r = await portal_project.api.delete(f"/v1/organizations/{portal.org['id']}")
    assert r.status in (200, 204), r.body
    r = await portal_call(portal_service, "GET", "/v1/portal/state", portal.cookie)
    assert_error(r, 410, "token_invalid_or_expired")


async def test_a_link_is_for_its_intent_only(portal_service: Api, portal_project: Project) -> None:
    portal = await opened(portal_service, portal_project, "scim")
    r = await portal_call(portal_service, "POST", "/v1/portal/domains", portal.cookie,
                          json={"domain": "example.com"})
    assert_error(r, 403, "forbidden")
    assert r.body["error"]["details"] == {"reason": "intent", "intent": "scim"}


async def test_a_save_from_another_origin_is_refused(portal_service: Api,
                                                     portal_project: Project) -> None:
    portal = await opened(portal_service, portal_project)
    r = await portal_call(portal_service, "POST", "/v1/portal/domains", portal.cookie,
                          json={"domain": "example.com"},
                          headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert_error(r, 403, "forbidden")
    assert r.body["error"]["details"]["reason"] == "cross_origin"
    r = await portal_call(portal_service, "POST", "/v1/portal/domains", portal.cookie,
                          json={"domain": "example.com"}, headers={"Content-Type": "text/plain"})
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "Content-Type"


async def test_the_page_without_a_token_resumes_from_the_cookie(portal_service: Api) -> None:
    r = await portal_service.get("/portal", key=None)
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    assert "Set-Cookie" not in r.headers
    for path, media in (("/portal/static/portal.js", "text/javascript"),
                        ("/portal/static/portal.css", "text/css")):
        r = await portal_service.get(path, key=None)
        assert r.status == 200 and r.headers["Content-Type"].startswith(media), r.headers
        assert r.raw
