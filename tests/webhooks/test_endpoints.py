"""Webhook endpoints through the API (DESIGN.md "webhooks"): create, read, list, change, rotate,
delete, each with its audit event; the URL rule at create and update; scopes and projects."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import asyncpg

from control_plane.web.outbound import RESOLVE_TIMEOUT_SECONDS, is_public
from tests.fixtures.database import events
from tests.fixtures.service import (
    ULID,
    Api,
    Project,
    assert_error,
    assert_invalid_field,
    bootstrap_project,
    scoped,
)

SECRET_RE = re.compile(r"^whsec_[A-Za-z0-9+/]{32}$")  # base64 of 24 bytes: 32 characters


async def test_create_answers_the_secret_once_and_records_the_event(hooks_project: Project,
                                                                    db: asyncpg.Pool) -> None:
    api = hooks_project.api
    r = await api.post("/v1/webhook-endpoints", {
        "url": "http://127.0.0.1:9/hooks", "events": ["user.created", "user.created", "user.deleted"],
        "description": "CRM sync"})
    assert r.status == 201, r.body
    created = r.body
    assert re.fullmatch(f"whep_{ULID}", created["id"])
    assert SECRET_RE.match(created["secret"])
    assert created["events"] == ["user.created", "user.deleted"]  # duplicates dropped
    assert (created["status"], created["disabled_reason"]) == ("active", None)
    assert created["description"] == "CRM sync"

    shown = await api.get(f"/v1/webhook-endpoints/{created['id']}")
    assert shown.status == 200
    assert "secret" not in shown.body or shown.body["secret"] is None
    assert {k: shown.body[k] for k in ("id", "url", "events", "status")} == \
        {k: created[k] for k in ("id", "url", "events", "status")}

    stored = await db.fetchval("SELECT secret_sealed FROM webhook_endpoints WHERE id = $1",
                               created["id"])
    assert created["secret"].encode() not in stored  # sealed, not stored as given

    [event] = await events(db, hooks_project.id, "webhook.endpoint.created")
    assert event["target_id"] == created["id"]
    assert event["metadata"]["url"] == "http://127.0.0.1:9/hooks"
    assert created["secret"] not in str(event)


async def test_star_stands_for_everything(hooks_project: Project) -> None:
    r = await hooks_project.api.post("/v1/webhook-endpoints", {
        "url": "http://127.0.0.1:9/", "events": ["user.created", "*"]})
    assert r.status == 201 and r.body["events"] == ["*"]


async def test_list_patch_rotate_delete(hooks_project: Project, db: asyncpg.Pool) -> None:
    api = hooks_project.api
    ids = []
    for n in range(3):
        r = await api.post("/v1/webhook-endpoints", {"url": f"http://127.0.0.1:9/{n}",
                                                     "events": ["*"]})
        ids.append(r.body["id"])
    first = await api.get("/v1/webhook-endpoints?limit=2")
    assert first.status == 200 and first.body["has_more"] is True
    rest = await api.get(f"/v1/webhook-endpoints?limit=2&cursor={first.body['next_cursor']}")
    assert [e["id"] for e in first.body["data"] + rest.body["data"]] == ids
    assert all("secret" not in e or e["secret"] is None for e in first.body["data"])

    changed = await api.request("PATCH", f"/v1/webhook-endpoints/{ids[0]}", json={
        "url": "http://127.0.0.1:9/new", "events": ["organization.created"],
        "description": None, "status": "disabled"})
    assert changed.status == 200, changed.body
    assert (changed.body["url"], changed.body["events"], changed.body["status"]) == \
        ("http://127.0.0.1:9/new", ["organization.created"], "disabled")
    again = await api.request("PATCH", f"/v1/webhook-endpoints/{ids[0]}", json={"status": "active"})
    assert again.body["status"] == "active" and again.body["disabled_reason"] is None
    assert len(await events(db, hooks_project.id, "webhook.endpoint.updated")) == 2

    before = await db.fetchval("SELECT secret_sealed FROM webhook_endpoints WHERE id = $1", ids[1])
    rotated = await api.post(f"/v1/webhook-endpoints/{ids[1]}/rotate-secret")
    assert rotated.status == 200 and SECRET_RE.match(rotated.body["secret"])
    row = await db.fetchrow("SELECT secret_sealed, previous_secret_sealed, "
                            "previous_secret_until - now() AS left FROM webhook_endpoints "
                            "WHERE id = $1", ids[1])
    assert row["previous_secret_sealed"] == before and row["secret_sealed"] != before
    assert 23 * 3600 < row["left"].total_seconds() <= 24 * 3600
    [event] = await events(db, hooks_project.id, "webhook.endpoint.secret_rotated")
    assert event["target_id"] == ids[1]

    deleted = await api.delete(f"/v1/webhook-endpoints/{ids[2]}")
    assert deleted.status == 200 and deleted.body == {"id": ids[2], "deleted": True,
                                                      "request_id": deleted.body["request_id"]}
    assert_error(await api.get(f"/v1/webhook-endpoints/{ids[2]}"), 404, "not_found")
    [event] = await events(db, hooks_project.id, "webhook.endpoint.revoked")
    assert event["target_id"] == ids[2]


async def test_bad_bodies_name_the_field(hooks_project: Project) -> None:
    api = hooks_project.api
    assert_invalid_field(await api.post("/v1/webhook-endpoints", {"url": "ftp://x.example/",
                                                                  "events": ["*"]}), "url")
    assert_invalid_field(await api.post("/v1/webhook-endpoints", {
        "url": "http://127.0.0.1:9/#frag", "events": ["*"]}), "url")
    assert_invalid_field(await api.post("/v1/webhook-endpoints", {
        "url": "http://127.0.0.1:9/", "events": []}), "events")
    assert_invalid_field(await api.post("/v1/webhook-endpoints", {
        "url": "http://127.0.0.1:9/", "events": ["Not An Action"]}), "events.0")
    assert_invalid_field(await api.post("/v1/webhook-endpoints", {
        "url": "http://127.0.0.1:9/", "events": ["*"], "secret": "mine"}), "secret")
    # A name no resolver takes (a label over 63 characters, an empty label, a space) is refused
    # as written, even where private receivers are allowed: it could never be delivered to.
    for host in ("a" * 64 + ".example.com", "hooks..example.com", "hooks_.example.com.",
                 "x" * 250 + ".com"):
        r = await api.post("/v1/webhook-endpoints", {"url": f"https://{host}/", "events": ["*"]})
        if host == "hooks_.example.com.":
            assert r.status == 201, r.body  # "_" and a trailing dot are valid DNS
            continue
        assert_invalid_field(r, "url")
        assert "valid host" in r.body["error"]["message"], r.body
    r = await api.post("/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/", "events": ["*"]})
    assert_invalid_field(await api.request("PATCH", f"/v1/webhook-endpoints/{r.body['id']}",
                                           json={}), "body")


async def test_non_public_receivers_are_refused_by_default(project: Project) -> None:
    """The suite's service runs with the defaults: https only, public addresses only, judged
    as written and once resolved (this machine's own name resolves to a non-public address)."""
    api = project.api
    for url in ("http://hooks.example.com/", "https://127.0.0.1/", "https://10.1.2.3/",
                "https://169.254.169.254/latest", "https://[::1]/", "https://localhost/",
                "https://app.localhost/", "https://[::ffff:127.0.0.1]/", "https://0.0.0.0/"):
        assert_invalid_field(await api.post("/v1/webhook-endpoints", {"url": url, "events": ["*"]}),
                             "url")
    own = socket.gethostname()
    started = time.monotonic()
    infos = await asyncio.get_running_loop().getaddrinfo(own, 443)
    slow = time.monotonic() - started > RESOLVE_TIMEOUT_SECONDS / 2
    resolved = {info[4][0] for info in infos}
    assert resolved and not any(is_public(a) for a in resolved), resolved  # true of any test box
    r = await api.post("/v1/webhook-endpoints", {"url": f"https://{own}/hooks", "events": ["*"]})
    if not (slow and r.status == 201):
        assert_invalid_field(r, "url")
        assert "non-public address" in r.body["error"]["details"]["fields"][0]["message"]
    # else: this machine's resolver answers slower than the create call waits (a root whose DNS
    # server is slow to answer for its own name): the name counts as not resolved yet and is
    # judged again at each attempt, as outbound.resolved_problem documents.
    ok = await api.post("/v1/webhook-endpoints", {"url": "https://203.0.113.7/hooks",
                                                  "events": ["*"]})
    assert ok.status == 400  # TEST-NET-3 is documentation space, not global either
    public = await api.post("/v1/webhook-endpoints", {"url": "https://8.8.8.8/hooks",
                                                      "events": ["*"]})
    assert public.status == 201, public.body
    patched = await api.request("PATCH", f"/v1/webhook-endpoints/{public.body['id']}",
                                json={"url": "https://192.168.1.1/"})
    assert_invalid_field(patched, "url")


async def test_scope_and_project(hooks_project: Project, webhooks_service: Api) -> None:
    api = hooks_project.api
    r = await api.post("/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/", "events": ["*"]})
    endpoint_id = r.body["id"]
    narrow = await scoped(hooks_project, "users:read")
    assert_error(await narrow.post("/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/",
                                                             "events": ["*"]}),
                 403, "insufficient_scope")
    allowed = await scoped(hooks_project, "webhooks:write")
    assert (await allowed.get(f"/v1/webhook-endpoints/{endpoint_id}")).status == 200
    other = await bootstrap_project(webhooks_service, "other")
    for method, path in (("GET", f"/v1/webhook-endpoints/{endpoint_id}"),
                         ("DELETE", f"/v1/webhook-endpoints/{endpoint_id}"),
                         ("POST", f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret"),
                         ("GET", f"/v1/webhook-endpoints/{endpoint_id}/deliveries")):
        assert_error(await other.api.request(method, path), 404, "not_found")
    assert_error(await api.get("/v1/webhook-endpoints/whep_nope"), 404, "not_found")
