"""Compliance routes (DESIGN.md "compliance"): data-subject requests, incidents and maintenance
windows (API key, ``compliance:write``)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import InvalidRequest, NotFound
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, MAINTENANCE_BOARD
from control_plane.compliance import service
from control_plane.compliance.schemas import (
    Dsr,
    DsrBody,
    DsrQuery,
    FulfilBody,
    Fulfilment,
    Incident,
    IncidentBody,
    IncidentPatch,
    IncidentQuery,
    MaintenanceWindow,
    WindowBody,
    WindowPatch,
    WindowQuery,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page

routes = RouteTable("compliance", "Data-subject requests (GDPR, CCPA): a user's data deleted or "
                                  "exported, on a due date. Incidents with their notification "
                                  "deadlines, and maintenance windows.")
WRITE: Final = auth.ApiKey("compliance:write")
_DSR: Final = "/v1/compliance/dsr/{dsr_id}"
_INCIDENT: Final = "/v1/incidents/{incident_id}"
_WINDOW: Final = "/v1/maintenance-windows/{window_id}"


@endpoint(routes, "POST", "/v1/compliance/dsr", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(201, "The request, pending, with its due date.", Dsr)])
async def post_dsr(call: Call, body: DsrBody) -> web.Response:
    """Record a data-subject request: ``deletion`` or ``export`` of what the project holds
    about the end user of ``user_email``, due ``due_days`` (default 30; 45 for CCPA) after
    this call. An address the project does not know is accepted all the same."""
    async with call.connection() as conn:
        created = await service.create_dsr(conn, call.actor, body)
    return call.reply(created, status=201)


@endpoint(routes, "GET", "/v1/compliance/dsr", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(200, "A page of requests, oldest first.", Page[Dsr])])
async def get_dsrs(call: Call, query: DsrQuery) -> web.Response:
    """List the project's data-subject requests, by ``status``, ``type`` and ``overdue``."""
    listing = Listing(service.LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_dsrs(call.pool, listing, query))


@endpoint(routes, "GET", _DSR, auth=WRITE, errors=[NotFound],
          replies=[Reply(200, "The request.", Dsr)])
async def get_dsr(call: Call) -> web.Response:
    """Show one data-subject request: its status, due date, and what fulfilling it did."""
    return call.reply(await service.describe(call.pool, call.project_id, call.path("dsr_id")))


@endpoint(routes, "POST", f"{_DSR}/fulfill", auth=WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "Fulfilled: what was deleted and anonymized, or the export's "
                              "document and SHA-256.", Fulfilment),
                   Reply(202, "A deletion another process is finishing: how far it is.",
                         Fulfilment)])
async def post_dsr_fulfill(call: Call, body: FulfilBody) -> web.Response:
    """Fulfil a data-subject request, once: a deletion removes the user's rows and the tuples
    naming it in every store (the engine stops granting them) at once, and anonymizes its
    history (audit events, risk decisions, the stores' change logs); an export answers the JSON
    document of everything held about the user and records it for ``output_artifact_url``.
    Calling it again answers the first result."""
    done = await service.fulfil(call.pool, call.actor, call.path("dsr_id"), body)
    return call.reply(done, status=200 if done.dsr.status == "fulfilled" else 202)


# --- incidents ---------------------------------------------------------------------------------


@endpoint(routes, "POST", "/v1/incidents", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(201, "The incident, open, with its notification deadline.", Incident)])
async def post_incident(call: Call, body: IncidentBody) -> web.Response:
    """Open an incident: its ``severity`` (``sev1`` the highest), what happened, whether
    personal data was affected, the projects it affects (default: this one), and when it was
    detected (default: now). Its ``notify_by`` is ``detected_at`` + 4 hours for ``sev1``, + 72
    hours for a personal-data breach (the earlier when both apply)."""
    async with call.connection() as conn:
        created = await service.create_incident(conn, call.actor, body)
    return call.reply(created, status=201)


@endpoint(routes, "GET", "/v1/incidents", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(200, "A page of incidents, oldest first.", Page[Incident])])
async def get_incidents(call: Call, query: IncidentQuery) -> web.Response:
    """List the project's incidents, by ``status``, ``severity`` and ``overdue``."""
    listing = Listing(service.INCIDENTS_LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_incidents(call.pool, listing, query))


@endpoint(routes, "GET", _INCIDENT, auth=WRITE, errors=[NotFound],
          replies=[Reply(200, "The incident.", Incident)])
async def get_incident(call: Call) -> web.Response:
    """Show one incident: its deadline, whether it is overdue, whether it is resolved."""
    return call.reply(await service.describe_incident(call.pool, call.project_id,
                                                      call.path("incident_id")))


@endpoint(routes, "PATCH", _INCIDENT, auth=WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "The incident as changed.", Incident)])
async def patch_incident(call: Call, body: IncidentPatch) -> web.Response:
    """Change an incident; ``status`` ``resolved`` resolves it (again: no change), ``notified``
    or ``notified_at`` records the notification that stops it being overdue."""
    async with call.connection() as conn:
        changed = await service.update_incident(conn, call.actor,
                                                incident_id=call.path("incident_id"), body=body)
    return call.reply(changed)


# --- maintenance windows -----------------------------------------------------------------------


@endpoint(routes, "POST", "/v1/maintenance-windows", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(201, "The window, scheduled.", MaintenanceWindow)])
async def post_maintenance_window(call: Call, body: WindowBody) -> web.Response:
    """Schedule a maintenance window from ``starts_at`` to ``ends_at``."""
    async with call.connection() as conn:
        created = await service.schedule_window(conn, call.actor, body)
    return call.reply(created, status=201)


@endpoint(routes, "GET", "/v1/maintenance-windows", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(200, "A page of windows, oldest first.", Page[MaintenanceWindow])])
async def get_maintenance_windows(call: Call, query: WindowQuery) -> web.Response:
    """List the project's maintenance windows, by ``status``."""
    listing = Listing(service.WINDOWS_LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_windows(call.pool, listing, query))


@endpoint(routes, "GET", _WINDOW, auth=WRITE, errors=[NotFound],
          replies=[Reply(200, "The window.", MaintenanceWindow)])
async def get_maintenance_window(call: Call) -> web.Response:
    """Show one maintenance window."""
    return call.reply(await service.describe_window(call.pool, call.project_id,
                                                    call.path("window_id")))


@endpoint(routes, "PATCH", _WINDOW, auth=WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "The window as changed.", MaintenanceWindow)])
async def patch_maintenance_window(call: Call, body: WindowPatch) -> web.Response:
    """Start (``status`` ``in_progress``) or complete (``completed``) a window, or change its
    title, description or times. A started window shows in ``GET /readyz``'s detail until it
    is completed."""
    async with call.connection() as conn:
        changed = await service.update_window(conn, call.actor,
                                              window_id=call.path("window_id"), body=body)
    call.app[MAINTENANCE_BOARD].forget()
    return call.reply(changed)
