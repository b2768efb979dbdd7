"""Data-subject requests through the API (SPEC.md 2 "DSR", 4 rules 2 and 3, 8; DESIGN.md
"compliance"): creation and its validation, the listing's filters, export and deletion
fulfilment, and fulfilling twice."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from tests.fixtures.database import events
from tests.fixtures.identity import email, sign_in
from tests.fixtures.service import Api, Project, assert_invalid_field, bootstrap_project


async def dsr(project: Project, request_type: str = "deletion", address: str | None = None,
              **more: Any) -> dict[str, Any]:
    r = await project.api.post("/v1/compliance/dsr", {"request_type": request_type,
                                                      "user_email": address or email(), **more})
    assert r.status == 201, r.body
    return dict(r.body)


def when(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_creation_starts_the_clock_and_echoes_the_request(cproject: Project,
                                                                cdb: asyncpg.Pool) -> None:
    address = email()
    local, domain = address.split("@")
    made = await dsr(cproject, "export", f"{local}@{domain.upper()}", notes="ticket 4711")
    assert made["dsr_id"].startswith("dsr_") and len(made["dsr_id"]) == 30
    assert (made["request_type"], made["user_email"], made["notes"]) == ("export", address, "ticket 4711")
    assert (made["status"], made["overdue"], made["due_days"]) == ("pending", False, 30)
    assert when(made["due_at"]) - when(made["created_at"]) == timedelta(days=30)
    ccpa = await dsr(cproject, due_days=45.0)  # JSON Schema: a number with no fraction is an integer
    assert when(ccpa["due_at"]) - when(ccpa["created_at"]) == timedelta(days=45)
    assert ccpa["due_days"] == 45
    shown = await cproject.api.get(f"/v1/compliance/dsr/{made['dsr_id']}")
    assert shown.status == 200
    assert {k: shown.body[k] for k in made if k != "request_id"} == {k: v for k, v in made.items()
                                                                    if k != "request_id"}
    [created] = [e for e in await events(cdb, cproject.id, "dsr.created")
                 if e["target_id"] == made["dsr_id"]]
    assert created["metadata"]["request_type"] == "export"


@pytest.mark.parametrize(("body", "field"), [
    ({"request_type": "erasure", "user_email": "a@example.com"}, "request_type"),
    ({"user_email": "a@example.com"}, "request_type"),
    ({"request_type": "deletion", "user_email": "not an address"}, "user_email"),
    ({"request_type": "deletion"}, "user_email"),
    ({"request_type": "deletion", "user_email": "a@example.com", "due_days": 0}, "due_days"),
    ({"request_type": "deletion", "user_email": "a@example.com", "due_days": 91}, "due_days"),
    ({"request_type": "deletion", "user_email": "a@example.com", "due_days": "soon"}, "due_days"),
    ({"request_type": "deletion", "user_email": "a@example.com", "due_days": 30.5}, "due_days"),
    ({"request_type": "deletion", "user_email": "a@example.com", "notes": "x" * 2001}, "notes"),
])
async def test_bad_requests_are_invalid_request_naming_the_field(cproject: Project,
                                                                 body: dict[str, Any],
                                                                 field: str) -> None:
    r = await cproject.api.post("/v1/compliance/dsr", body)
    assert_invalid_field(r, field)


async def test_scope_and_project_bounds(cproject: Project, compliance_service: Api) -> None:
    made = await dsr(cproject)
    key = await cproject.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "reader",
                                                   "scopes": ["users:read"]})
    assert key.status == 201, key.body
    narrow = cproject.api.with_key(key.body["secret"])
    assert (await narrow.get("/v1/compliance/dsr")).status == 403
    other = await bootstrap_project(compliance_service, "compliance-other")
    for path in (f"/v1/compliance/dsr/{made['dsr_id']}", "/v1/compliance/dsr/dsr_x",
                 f"/v1/compliance/dsr/dsr_{'0' * 26}"):
        assert (await other.api.get(path)).status == 404, path
    r = await other.api.post(f"/v1/compliance/dsr/{made['dsr_id']}/fulfill", {})
    assert r.status == 404 and r.body["error"]["code"] == "not_found"


async def test_listing_filters_and_pages(cproject: Project, cdb: asyncpg.Pool) -> None:
    made = [await dsr(cproject, kind) for kind in ("deletion", "export", "deletion", "export")]
    # One is past due (the API cannot make one: due_days is at least 1).
    await cdb.execute("UPDATE dsr_requests SET due_at = now() - interval '1 hour' WHERE id = $1",
                      made[1]["dsr_id"])
    done = await cproject.api.post(f"/v1/compliance/dsr/{made[2]['dsr_id']}/fulfill", {})
    assert done.status == 200, done.body

    async def ids(query: str) -> list[str]:
        r = await cproject.api.get("/v1/compliance/dsr?" + query)
        assert r.status == 200, r.body
        return [d["dsr_id"] for d in r.body["data"]]

    every = [d["dsr_id"] for d in made]
    assert await ids("") == every
    assert await ids("type=export") == [every[1], every[3]]
    assert await ids("status=fulfilled") == [every[2]]
    assert await ids("status=pending&type=deletion") == [every[0]]
    assert await ids("overdue=true") == [every[1]]
    assert await ids("overdue=false") == [every[0], every[2], every[3]]
    first = await cproject.api.get("/v1/compliance/dsr?limit=3")
    assert first.body["has_more"] is True
    rest = await cproject.api.get(f"/v1/compliance/dsr?limit=3&cursor={first.body['next_cursor']}")
    assert [d["dsr_id"] for d in first.body["data"] + rest.body["data"]] == every
    shown = await cproject.api.get(f"/v1/compliance/dsr/{every[1]}")
    assert shown.body["overdue"] is True and shown.body["status"] == "pending"
    for bad in ("status=done", "type=erasure", "overdue=maybe", "colour=red"):
        r = await cproject.api.get("/v1/compliance/dsr?" + bad)
        assert r.status == 400 and r.body["error"]["code"] == "invalid_request", bad


async def test_an_unknown_address_is_fulfilled_as_nothing_held(cproject: Project) -> None:
    deletion, export = await dsr(cproject), await dsr(cproject, "export")
    r = await cproject.api.post(f"/v1/compliance/dsr/{deletion['dsr_id']}/fulfill", {})
    assert r.status == 200, r.body
    assert r.body["user_found"] is False and r.body["dsr"]["status"] == "fulfilled"
    assert set(r.body["deleted"].values()) == {0}
    assert r.body["anonymized"] == {"audit_events": 1, "risk_decisions": 0}  # its own dsr.created
    r = await cproject.api.post(f"/v1/compliance/dsr/{export['dsr_id']}/fulfill",
                                {"output_artifact_url": "https://files.example.com/dsr.json"})
    assert r.status == 200, r.body
    assert r.body["user_found"] is False and r.body["document"]["user"] is None
    assert r.body["document"]["audit_events"] == []


async def test_export_gathers_the_user_and_no_secret(cproject: Project, cdb: asyncpg.Pool) -> None:
    address = email()
    signed = await sign_in(cproject, address)
    recovery = await cproject.api.post("/v1/recovery/requests", {
        "user_id": signed.user_id, "email": email(), "reason": "lost phone"})
    assert recovery.status == 201, recovery.body
    made = await dsr(cproject, "export", address)
    path = f"/v1/compliance/dsr/{made['dsr_id']}/fulfill"
    missing = await cproject.api.post(path, {})
    assert_invalid_field(missing, "output_artifact_url")
    assert (await cproject.api.get(f"/v1/compliance/dsr/{made['dsr_id']}")).body["status"] == "pending"

    url = "https://files.example.com/exports/a.json"
    r = await cproject.api.post(path, {"output_artifact_url": url})
    assert r.status == 200, r.body
    document, digest = r.body["document"], r.body["sha256"]
    assert digest == hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert document["user"]["id"] == signed.user_id and document["user"]["email"] == address
    assert [s["id"] for s in document["sessions"]] == [signed.session_id]
    assert len(document["risk_decisions"]) == 1
    assert [(x["id"], x["reason"]) for x in document["recovery_requests"]] \
        == [(recovery.body["id"], "lost phone")]
    assert {e["action"] for e in document["audit_events"]} >= {"user.created", "auth.signin_attempt"}
    assert all(e["user_id"] == signed.user_id or e["actor_id"] == signed.user_id
               for e in document["audit_events"])
    text = orjson.dumps(document).decode()
    for secret in (signed.access_token, signed.refresh_token, "token_hash", "secret"):
        assert secret not in text
    stored = await cdb.fetchrow("SELECT status, output_artifact_url, output_sha256 FROM dsr_requests "
                                "WHERE id = $1", made["dsr_id"])
    assert tuple(stored) == ("fulfilled", url, digest)
    again = await cproject.api.post(path, {"output_artifact_url": "https://elsewhere.example/b"})
    assert again.status == 200 and again.body == {**r.body, "request_id": again.body["request_id"]}
    assert len(await events(cdb, cproject.id, "dsr.fulfilled")) == 1
