"""Maintenance windows through the API (issue 21 "Incidents and maintenance"; SPEC.md 6
``maintenance.*``): scheduling, starting and completing with their audit events, changes while
scheduled, the order of the statuses, validation, the listing, project bounds and scope, and a
started window shown in ``GET /readyz``'s detail (which stays 200) until it is completed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from control_plane.compliance.service import MaintenanceBoard
from tests.fixtures.database import events
from tests.fixtures.service import (
    Api,
    Project,
    assert_invalid_field,
    bootstrap_project,
    scoped,
    ts,
)


def later(**delta: float) -> str:
    return (datetime.now(UTC) + timedelta(**delta)).isoformat().replace("+00:00", "Z")


async def window(project: Project, **more: Any) -> dict[str, Any]:
    body = {"title": "Database upgrade", "starts_at": later(hours=1), "ends_at": later(hours=3),
            **more}
    r = await project.api.post("/v1/maintenance-windows", body)
    assert r.status == 201, r.body
    return dict(r.body)


async def patch(project: Project, window_id: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await project.api.request("PATCH", f"/v1/maintenance-windows/{window_id}", json=body)
    assert r.status == 200, r.body
    return dict(r.body)


async def refused(project: Project, window_id: str, body: dict[str, Any], field: str) -> None:
    r = await project.api.request("PATCH", f"/v1/maintenance-windows/{window_id}", json=body)
    assert_invalid_field(r, field)


async def window_events(db: asyncpg.Pool, project: Project, window_id: str) -> list[dict[str, Any]]:
    return [e for e in await events(db, project.id) if e["target_id"] == window_id]


def fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "request_id"}


async def in_progress(api: Api) -> list[dict[str, Any]]:
    """The windows ``GET /readyz`` shows (and it answers 200 ready)."""
    r = await api.get("/readyz", key=None)
    assert r.status == 200 and r.body["status"] == "ready", r.body
    shown = r.body["detail"]["maintenance"]
    assert shown["as_of"] is not None
    return list(shown["in_progress"])


async def test_schedule_start_complete_with_events_and_readiness(
        cproject: Project, cdb: asyncpg.Pool, compliance_service: Api) -> None:
    starts, ends = later(hours=1), later(hours=3)
    made = await window(cproject, description="Minor version.", starts_at=starts, ends_at=ends)
    assert made["id"].startswith("mw_") and len(made["id"]) == 29
    assert (made["title"], made["description"], made["status"]) == (
        "Database upgrade", "Minor version.", "scheduled")
    assert (ts(made["starts_at"]), ts(made["ends_at"])) == (ts(starts), ts(ends))
    assert (made["started_at"], made["completed_at"]) == (None, None)
    shown = await cproject.api.get(f"/v1/maintenance-windows/{made['id']}")
    assert shown.status == 200 and fields(shown.body) == fields(made)
    assert made["id"] not in [w["id"] for w in await in_progress(compliance_service)]

    started = await patch(cproject, made["id"], {"status": "in_progress"})
    assert started["status"] == "in_progress" and started["started_at"] is not None
    [listed] = [w for w in await in_progress(compliance_service) if w["id"] == made["id"]]
    assert listed == {"id": made["id"], "started_at": started["started_at"],
                      "ends_at": started["ends_at"]}  # no title: the probe answers anyone
    # Started again: nothing changes, nothing is recorded.
    assert fields(await patch(cproject, made["id"], {"status": "in_progress"})) == fields(started)

    done = await patch(cproject, made["id"], {"status": "completed"})
    assert done["status"] == "completed" and ts(done["completed_at"]) >= ts(done["started_at"])
    assert made["id"] not in [w["id"] for w in await in_progress(compliance_service)]
    assert fields(await patch(cproject, made["id"], {"status": "completed"})) == fields(done)

    recorded = await window_events(cdb, cproject, made["id"])
    assert [e["action"] for e in recorded] == ["maintenance.scheduled", "maintenance.started",
                                              "maintenance.completed"]
    assert {e["target_type"] for e in recorded} == {"maintenance_window"}
    scheduled, begun, completed = (e["metadata"] for e in recorded)
    assert (ts(scheduled["starts_at"]), ts(scheduled["ends_at"])) == (ts(starts), ts(ends))
    assert scheduled["status"] == "scheduled" and scheduled["title"] == "Database upgrade"
    assert (begun["status"], begun["changed"]) == ("in_progress", ["status"])
    assert ts(begun["started_at"]) == ts(started["started_at"])
    assert (completed["status"], completed["changed"]) == ("completed", ["status"])
    assert ts(completed["ends_at"]) == ts(ends)


async def test_changes_while_scheduled_and_running(cproject: Project, cdb: asyncpg.Pool) -> None:
    made = await window(cproject, description="Minor version.")
    starts, ends = later(hours=2), later(hours=5)
    moved = await patch(cproject, made["id"], {"starts_at": starts, "ends_at": ends,
                                               "title": "Upgrade, postponed", "description": None})
    assert (ts(moved["starts_at"]), ts(moved["ends_at"]), moved["title"]) == (
        ts(starts), ts(ends), "Upgrade, postponed")
    assert (moved["status"], moved["description"]) == ("scheduled", None)
    # Started with a new end: one started event naming both.
    sooner = later(hours=4)
    started = await patch(cproject, made["id"], {"status": "in_progress", "ends_at": sooner})
    assert ts(started["ends_at"]) == ts(sooner)
    # A running window may be extended, not moved.
    extended = later(hours=6)
    assert ts((await patch(cproject, made["id"], {"ends_at": extended}))["ends_at"]) == ts(extended)
    await refused(cproject, made["id"], {"starts_at": later(hours=-1)}, "starts_at")
    await patch(cproject, made["id"], {"status": "completed"})
    await refused(cproject, made["id"], {"title": "Too late"}, "title")
    await refused(cproject, made["id"], {"ends_at": later(hours=9)}, "ends_at")

    recorded = await window_events(cdb, cproject, made["id"])
    assert [(e["action"], e["metadata"].get("changed")) for e in recorded] == [
        ("maintenance.scheduled", None),
        ("maintenance.updated", ["description", "ends_at", "starts_at", "title"]),
        ("maintenance.started", ["ends_at", "status"]),
        ("maintenance.updated", ["ends_at"]),
        ("maintenance.completed", ["status"]),
    ]


async def test_statuses_go_in_order(cproject: Project) -> None:
    made = await window(cproject)
    await refused(cproject, made["id"], {"status": "completed"}, "status")
    await refused(cproject, made["id"], {"status": "scheduled"}, "status")
    await patch(cproject, made["id"], {"status": "in_progress"})
    await patch(cproject, made["id"], {"status": "completed"})
    r = await cproject.api.request("PATCH", f"/v1/maintenance-windows/{made['id']}",
                                   json={"status": "in_progress"})
    assert_invalid_field(r, "status")
    assert "cannot go from completed to in_progress" in r.body["error"]["message"]
    assert (await cproject.api.get(f"/v1/maintenance-windows/{made['id']}")).body["status"] == "completed"


@pytest.mark.parametrize(("body", "field"), [
    ({"title": "x", "starts_at": later(hours=2), "ends_at": later(hours=1)}, "ends_at"),
    ({"title": "x", "starts_at": (same := later(hours=2)), "ends_at": same}, "ends_at"),
    ({"title": "x", "starts_at": later(hours=-3), "ends_at": later(hours=-1)}, "ends_at"),
    ({"title": "x", "ends_at": later(hours=1)}, "starts_at"),
    ({"title": "x", "starts_at": later(hours=1)}, "ends_at"),
    ({"title": "", "starts_at": later(hours=1), "ends_at": later(hours=2)}, "title"),
    ({"starts_at": later(hours=1), "ends_at": later(hours=2)}, "title"),
    ({"title": "x", "starts_at": "soon", "ends_at": later(hours=2)}, "starts_at"),
    ({"title": "x", "starts_at": later(hours=1), "ends_at": later(hours=2), "status": "in_progress"},
     "status"),
])
async def test_bad_windows_are_invalid_request_naming_the_field(
        cproject: Project, body: dict[str, Any], field: str) -> None:
    assert_invalid_field(await cproject.api.post("/v1/maintenance-windows", body), field)


async def test_a_window_may_have_begun_before_it_is_recorded(cproject: Project) -> None:
    made = await window(cproject, starts_at=later(hours=-1), ends_at=later(hours=1))
    assert made["status"] == "scheduled"


@pytest.mark.parametrize(("body", "field"), [
    ({"ends_at": later(hours=0.5)}, "ends_at"),  # before the stored start
    ({"starts_at": later(hours=4)}, "starts_at"),  # after the stored end
    ({"ends_at": later(hours=-1)}, "ends_at"),
    ({"status": "cancelled"}, "status"),
    ({"title": None}, "body"),
    ({}, "body"),
])
async def test_bad_patches_are_invalid_request_naming_the_field(
        cproject: Project, body: dict[str, Any], field: str) -> None:
    made = await window(cproject)
    await refused(cproject, made["id"], body, field)


async def test_listing_filters_and_pages(compliance_service: Api) -> None:
    project = await bootstrap_project(compliance_service, "maintenance-list")
    first, second, third = [await window(project) for _ in range(3)]
    await patch(project, second["id"], {"status": "in_progress"})
    await patch(project, third["id"], {"status": "in_progress"})
    await patch(project, third["id"], {"status": "completed"})

    async def ids(query: str) -> list[str]:
        r = await project.api.get(f"/v1/maintenance-windows{query}")
        assert r.status == 200, r.body
        return [w["id"] for w in r.body["data"]]

    assert await ids("") == [first["id"], second["id"], third["id"]]
    assert await ids("?status=scheduled") == [first["id"]]
    assert await ids("?status=in_progress") == [second["id"]]
    assert await ids("?status=completed") == [third["id"]]
    page = await project.api.get("/v1/maintenance-windows?limit=1")
    assert page.body["has_more"] is True
    rest = await project.api.get(f"/v1/maintenance-windows?cursor={page.body['next_cursor']}")
    assert [w["id"] for w in rest.body["data"]] == [second["id"], third["id"]]
    for query, field in (("?status=cancelled", "status"), ("?limit=0", "limit"),
                         ("?overdue=true", "overdue")):
        assert_invalid_field(await project.api.get(f"/v1/maintenance-windows{query}"), field)


async def test_project_bounds_and_scope(cproject: Project, compliance_service: Api) -> None:
    made = await window(cproject)
    other = await bootstrap_project(compliance_service, "maintenance-other")
    for path in (f"/v1/maintenance-windows/{made['id']}", "/v1/maintenance-windows/mw_x",
                 f"/v1/maintenance-windows/mw_{'0' * 26}",
                 f"/v1/maintenance-windows/inc_{'0' * 26}"):
        assert (await other.api.get(path)).status == 404, path
        r = await other.api.request("PATCH", path, json={"status": "in_progress"})
        assert r.status == 404, (path, r.body)
    assert (await other.api.get("/v1/maintenance-windows")).body["data"] == []
    assert (await cproject.api.get(f"/v1/maintenance-windows/{made['id']}")).body["status"] == "scheduled"

    narrow = await scoped(cproject, "audit:read")
    assert (await narrow.get("/v1/maintenance-windows")).status == 403
    assert (await narrow.post("/v1/maintenance-windows", {
        "title": "x", "starts_at": later(hours=1), "ends_at": later(hours=2)})).status == 403
    r = await narrow.request("PATCH", f"/v1/maintenance-windows/{made['id']}",
                             json={"status": "in_progress"})
    assert r.status == 403


class CountingPool:
    """A real pool whose reads are counted (and can be made to fail)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool, self.reads, self.fail = pool, 0, False

    async def fetch(self, *args: Any) -> list[asyncpg.Record]:
        self.reads += 1
        if self.fail:
            raise ConnectionRefusedError("PostgreSQL is away")
        return await self.pool.fetch(*args)


async def test_the_readiness_board_reads_once_per_interval_and_survives_an_outage(
        cproject: Project, cdb: asyncpg.Pool) -> None:
    made = await window(cproject)
    await patch(cproject, made["id"], {"status": "in_progress"})
    pool = CountingPool(cdb)
    board = MaintenanceBoard(ttl=60)
    first = await board.detail(pool)  # type: ignore[arg-type]
    assert made["id"] in [w["id"] for w in first["in_progress"]]
    for _ in range(5):
        assert await board.detail(pool) == first  # type: ignore[arg-type]
    assert pool.reads == 1
    board.forget()
    pool.fail = True
    assert await board.detail(pool) == first  # type: ignore[arg-type]  # what it knew
    assert await board.detail(pool) == first  # type: ignore[arg-type]  # not read again at once
    assert pool.reads == 2
    await patch(cproject, made["id"], {"status": "completed"})
    board.forget()
    pool.fail = False
    after = await board.detail(pool)  # type: ignore[arg-type]
    assert made["id"] not in [w["id"] for w in after["in_progress"]]
    assert after["as_of"] > first["as_of"]
