"""Incidents through the API (issue 21 "Incidents and maintenance"; SPEC.md 6 ``incident.*``, 8
breach notification): creation with its notification deadline, overdue until notified, updates
and resolution with their audit events, the listing's filters, validation, project bounds and
scope, and a webhook subscriber receiving ``incident.created``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from tests.compliance.helpers import receiver
from tests.fixtures.database import events
from tests.fixtures.service import (
    Api,
    Project,
    assert_invalid_field,
    bootstrap_project,
    eventually,
    scoped,
    ts,
)

FOUR_HOURS, SEVENTY_TWO_HOURS = timedelta(hours=4), timedelta(hours=72)


async def incident(project: Project, severity: str = "sev2", **more: Any) -> dict[str, Any]:
    r = await project.api.post("/v1/incidents", {"severity": severity,
                                                 "title": "Database failover", **more})
    assert r.status == 201, r.body
    return dict(r.body)


async def patch(project: Project, incident_id: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await project.api.request("PATCH", f"/v1/incidents/{incident_id}", json=body)
    assert r.status == 200, r.body
    return dict(r.body)


async def incident_events(db: asyncpg.Pool, project: Project, incident_id: str,
                          action: str | None = None) -> list[dict[str, Any]]:
    return [e for e in await events(db, project.id, action)
            if e["target_id"] == incident_id and e["action"].startswith("incident.")]


def ago(**delta: float) -> datetime:
    return datetime.now(UTC) - timedelta(**delta)


def text(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "request_id"}


async def test_creation_answers_the_incident_and_records_incident_created(
        cproject: Project, cdb: asyncpg.Pool) -> None:
    before = datetime.now(UTC)
    made = await incident(cproject, "sev1", description="Primary lost; replica promoted.")
    assert made["id"].startswith("inc_") and len(made["id"]) == 30
    assert (made["severity"], made["title"], made["description"]) == (
        "sev1", "Database failover", "Primary lost; replica promoted.")
    assert (made["status"], made["personal_data"], made["affected_projects"]) == (
        "open", False, [cproject.id])
    assert before - timedelta(seconds=1) <= ts(made["detected_at"]) <= datetime.now(UTC)
    assert ts(made["notify_by"]) == ts(made["detected_at"]) + FOUR_HOURS
    assert (made["notified_at"], made["overdue"], made["resolved_at"]) == (None, False, None)
    shown = await cproject.api.get(f"/v1/incidents/{made['id']}")
    assert shown.status == 200 and fields(shown.body) == fields(made)

    [created] = await incident_events(cdb, cproject, made["id"])
    assert (created["action"], created["target_type"]) == ("incident.created", "incident")
    meta = created["metadata"]
    assert (meta["severity"], meta["personal_data"], meta["overdue"]) == ("sev1", False, False)
    assert ts(meta["notify_by"]) == ts(made["notify_by"])
    assert meta["affected_projects"] == [cproject.id]


@pytest.mark.parametrize(("severity", "personal_data", "deadline"), [
    ("sev1", False, FOUR_HOURS),
    ("sev2", True, SEVENTY_TWO_HOURS),
    ("sev1", True, FOUR_HOURS),  # both apply: the earlier
    ("sev3", False, None),
    ("sev4", False, None),
])
async def test_the_notification_deadline(cproject: Project, severity: str, personal_data: bool,
                                         deadline: timedelta | None) -> None:
    detected = ago(minutes=30).replace(microsecond=0)
    made = await incident(cproject, severity, personal_data=personal_data,
                          detected_at=text(detected))
    assert ts(made["detected_at"]) == detected
    if deadline is None:
        assert made["notify_by"] is None
    else:
        assert ts(made["notify_by"]) == detected + deadline
    assert made["overdue"] is False


async def test_overdue_until_notified(cproject: Project, cdb: asyncpg.Pool) -> None:
    late = await incident(cproject, "sev1", detected_at=text(ago(hours=5)))
    assert late["overdue"] is True
    # The same age is within the 72 hours of a personal-data breach.
    breach = await incident(cproject, "sev3", personal_data=True, detected_at=text(ago(hours=5)))
    assert breach["overdue"] is False
    overdue = await cproject.api.get("/v1/incidents?overdue=true")
    assert [i["id"] for i in overdue.body["data"]] == [late["id"]]

    told = await patch(cproject, late["id"], {"notified": True})
    assert told["overdue"] is False and told["notified_at"] is not None
    assert ts(told["notified_at"]) > ts(late["detected_at"])
    [updated] = await incident_events(cdb, cproject, late["id"], "incident.updated")
    assert updated["metadata"]["changed"] == ["notified_at"]
    assert updated["metadata"]["overdue"] is False
    # Told again: the first time stands, nothing recorded.
    assert (await patch(cproject, late["id"], {"notified": True}))["notified_at"] == told["notified_at"]
    assert len(await incident_events(cdb, cproject, late["id"], "incident.updated")) == 1
    assert (await cproject.api.get("/v1/incidents?overdue=true")).body["data"] == []
    not_overdue = await cproject.api.get("/v1/incidents?overdue=false")
    assert {i["id"] for i in not_overdue.body["data"]} == {late["id"], breach["id"]}

    # Withdrawn (told by mistake): overdue again; an explicit time, before the deadline.
    assert (await patch(cproject, late["id"], {"notified": False}))["overdue"] is True
    when = ts(late["detected_at"]) + timedelta(hours=3)
    at = await patch(cproject, late["id"], {"notified_at": text(when)})
    assert (ts(at["notified_at"]), at["overdue"]) == (when, False)
    assert (await patch(cproject, late["id"], {"notified_at": None}))["overdue"] is True


async def test_update_and_resolve(cproject: Project, cdb: asyncpg.Pool) -> None:
    made = await incident(cproject, "sev3")
    assert made["notify_by"] is None
    other = f"proj_{'1' * 26}"
    changed = await patch(cproject, made["id"], {
        "severity": "sev1", "title": "  Failover, data loss  ", "description": "Replica lagged.",
        "affected_projects": [cproject.id, other, other]})
    assert (changed["severity"], changed["title"], changed["description"]) == (
        "sev1", "Failover, data loss", "Replica lagged.")
    assert changed["affected_projects"] == [cproject.id, other]
    assert ts(changed["notify_by"]) == ts(made["detected_at"]) + FOUR_HOURS
    assert ts(changed["updated_at"]) > ts(made["updated_at"])
    [updated] = await incident_events(cdb, cproject, made["id"], "incident.updated")
    assert updated["metadata"]["changed"] == ["affected_projects", "description", "notify_by",
                                              "severity", "title"]
    assert (updated["metadata"]["severity"], updated["metadata"]["personal_data"]) == ("sev1", False)
    assert ts(updated["metadata"]["notify_by"]) == ts(changed["notify_by"])
    # The same values again: nothing changes, nothing is recorded.
    same = await patch(cproject, made["id"], {"severity": "sev1", "description": "Replica lagged."})
    assert fields(same) == fields(changed)
    cleared = await patch(cproject, made["id"], {"description": None})
    assert cleared["description"] is None

    resolved = await patch(cproject, made["id"], {"status": "resolved"})
    assert resolved["status"] == "resolved" and resolved["resolved_at"] is not None
    again = await patch(cproject, made["id"], {"status": "resolved"})
    assert fields(again) == fields(resolved)
    [done] = await incident_events(cdb, cproject, made["id"], "incident.resolved")
    assert done["metadata"]["changed"] == ["status"] and done["metadata"]["status"] == "resolved"
    assert [e["action"] for e in await incident_events(cdb, cproject, made["id"])] == [
        "incident.created", "incident.updated", "incident.updated", "incident.resolved"]

    reopen = await cproject.api.request("PATCH", f"/v1/incidents/{made['id']}",
                                        json={"status": "open"})
    assert_invalid_field(reopen, "status")
    # A resolved incident's notification is still recorded (the duty outlives the incident).
    told = await patch(cproject, made["id"], {"notified": True})
    assert told["status"] == "resolved" and told["notified_at"] is not None


async def test_resolving_with_other_changes_is_one_resolved_event(cproject: Project,
                                                                 cdb: asyncpg.Pool) -> None:
    made = await incident(cproject, "sev2")
    done = await patch(cproject, made["id"], {"status": "resolved", "personal_data": True})
    assert ts(done["notify_by"]) == ts(made["detected_at"]) + SEVENTY_TWO_HOURS
    [resolved] = await incident_events(cdb, cproject, made["id"], "incident.resolved")
    assert resolved["metadata"]["changed"] == ["notify_by", "personal_data", "status"]
    assert resolved["metadata"]["personal_data"] is True
    assert await incident_events(cdb, cproject, made["id"], "incident.updated") == []


async def test_listing_filters_and_pages(cproject: Project, compliance_service: Api) -> None:
    project = await bootstrap_project(compliance_service, "incidents-list")
    first = await incident(project, "sev1", detected_at=text(ago(hours=6)))
    second = await incident(project, "sev2")
    third = await incident(project, "sev2")
    await patch(project, third["id"], {"status": "resolved"})

    async def ids(query: str) -> list[str]:
        r = await project.api.get(f"/v1/incidents{query}")
        assert r.status == 200, r.body
        return [i["id"] for i in r.body["data"]]

    assert await ids("") == [first["id"], second["id"], third["id"]]
    assert await ids("?status=open") == [first["id"], second["id"]]
    assert await ids("?status=resolved") == [third["id"]]
    assert await ids("?severity=sev2") == [second["id"], third["id"]]
    assert await ids("?severity=sev2&status=open") == [second["id"]]
    assert await ids("?overdue=true") == [first["id"]]
    assert await ids("?overdue=false&severity=sev1") == []

    page = await project.api.get("/v1/incidents?limit=2")
    assert [i["id"] for i in page.body["data"]] == [first["id"], second["id"]]
    assert page.body["has_more"] is True and page.body["next_cursor"]
    rest = await project.api.get(f"/v1/incidents?limit=2&cursor={page.body['next_cursor']}")
    assert [i["id"] for i in rest.body["data"]] == [third["id"]]
    assert (rest.body["has_more"], rest.body["next_cursor"]) == (False, None)

    for query, field in (("?severity=sev5", "severity"), ("?status=closed", "status"),
                         ("?overdue=maybe", "overdue"), ("?limit=1001", "limit"),
                         ("?sort=id", "sort"), ("?cursor=forged.AAAAAAAAAAAAAAAAAAAAAA", "cursor")):
        assert_invalid_field(await project.api.get(f"/v1/incidents{query}"), field)


@pytest.mark.parametrize(("body", "field"), [
    ({"severity": "sev5", "title": "x"}, "severity"),
    ({"title": "x"}, "severity"),
    ({"severity": "sev1", "title": ""}, "title"),
    ({"severity": "sev1", "title": "   "}, "title"),
    ({"severity": "sev1", "title": "a\x07b"}, "title"),
    ({"severity": "sev1", "title": "x" * 201}, "title"),
    ({"severity": "sev1"}, "title"),
    ({"severity": "sev1", "title": "x", "affected_projects": ["proj_nope"]}, "affected_projects.0"),
    ({"severity": "sev1", "title": "x", "affected_projects": [f"org_{'0' * 26}"]},
     "affected_projects.0"),
    ({"severity": "sev1", "title": "x", "affected_projects": []}, "affected_projects"),
    ({"severity": "sev1", "title": "x", "personal_data": "yes"}, "personal_data"),
    ({"severity": "sev1", "title": "x", "detected_at": "yesterday"}, "detected_at"),
    ({"severity": "sev1", "title": "x", "description": "x" * 5001}, "description"),
    ({"severity": "sev1", "title": "x", "status": "resolved"}, "status"),
])
async def test_bad_incidents_are_invalid_request_naming_the_field(
        cproject: Project, body: dict[str, Any], field: str) -> None:
    assert_invalid_field(await cproject.api.post("/v1/incidents", body), field)


async def test_detected_in_the_future_is_refused(cproject: Project) -> None:
    r = await cproject.api.post("/v1/incidents", {"severity": "sev1", "title": "x",
                                                  "detected_at": text(ago(hours=-1))})
    assert_invalid_field(r, "detected_at", "must not be in the future")


@pytest.mark.parametrize(("body", "field"), [
    ({"notified": True, "notified_at": "2026-01-01T00:00:00Z"}, "notified"),
    ({"notified_at": text(ago(hours=-1))}, "notified_at"),
    ({"notified_at": "2000-01-01T00:00:00Z"}, "notified_at"),  # before detected_at
    ({"severity": "sev0"}, "severity"),
    ({"title": None}, "body"),
    ({"status": "open"}, "status"),
    ({"detected_at": "2026-01-01T00:00:00Z"}, "detected_at"),
    ({}, "body"),
])
async def test_bad_patches_are_invalid_request_naming_the_field(
        cproject: Project, body: dict[str, Any], field: str) -> None:
    made = await incident(cproject)
    r = await cproject.api.request("PATCH", f"/v1/incidents/{made['id']}", json=body)
    assert_invalid_field(r, field)


async def test_project_bounds_and_scope(cproject: Project, compliance_service: Api) -> None:
    made = await incident(cproject)
    other = await bootstrap_project(compliance_service, "incidents-other")
    for path in (f"/v1/incidents/{made['id']}", "/v1/incidents/inc_x",
                 f"/v1/incidents/inc_{'0' * 26}", f"/v1/incidents/mw_{'0' * 26}"):
        assert (await other.api.get(path)).status == 404, path
        r = await other.api.request("PATCH", path, json={"status": "resolved"})
        assert r.status == 404, (path, r.body)
    assert (await other.api.get("/v1/incidents")).body["data"] == []
    assert (await cproject.api.get(f"/v1/incidents/{made['id']}")).body["status"] == "open"

    narrow = await scoped(cproject, "users:read", "webhooks:write")
    assert (await narrow.get("/v1/incidents")).status == 403
    assert (await narrow.get(f"/v1/incidents/{made['id']}")).status == 403
    assert (await narrow.post("/v1/incidents", {"severity": "sev1", "title": "x"})).status == 403
    r = await narrow.request("PATCH", f"/v1/incidents/{made['id']}", json={"status": "resolved"})
    assert r.status == 403
    allowed = await scoped(cproject, "compliance:write")
    assert (await allowed.get(f"/v1/incidents/{made['id']}")).status == 200


async def test_a_subscribed_webhook_receives_incident_created(cproject: Project) -> None:
    async with receiver(200) as (url, bodies):
        hook = await cproject.api.post("/v1/webhook-endpoints",
                                       {"url": url, "events": ["incident.created"]})
        assert hook.status == 201, hook.body
        made = await incident(cproject, "sev1", personal_data=True)
        await patch(cproject, made["id"], {"title": "Renamed"})  # not subscribed

        async def delivered() -> list[dict[str, Any]]:
            r = await cproject.api.get(f"/v1/webhook-endpoints/{hook.body['id']}/deliveries")
            return [d for d in r.body["data"] if d["status"] == "succeeded"]

        [delivery] = await eventually(delivered, what="the incident.created delivery")
        assert delivery["event_type"] == "incident.created"
        [body] = [orjson.loads(raw) for raw in bodies]
        assert (body["type"], body["data"]["action"]) == ("incident.created", "incident.created")
        assert body["data"]["target_id"] == made["id"]
        meta = body["data"]["metadata"]
        assert (meta["severity"], meta["personal_data"]) == ("sev1", True)
        assert ts(meta["notify_by"]) == ts(made["notify_by"])
        assert body["id"] == delivery["event_id"]
        deliveries = await cproject.api.get(f"/v1/webhook-endpoints/{hook.body['id']}/deliveries")
        assert [d["event_type"] for d in deliveries.body["data"]] == ["incident.created"]
