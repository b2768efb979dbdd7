"""Compliance routes (DESIGN.md "compliance"): data-subject requests (API key,
``compliance:write``)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import InvalidRequest, NotFound
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET
from control_plane.compliance import service
from control_plane.compliance.schemas import Dsr, DsrBody, DsrQuery, FulfilBody, Fulfilment
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page

routes = RouteTable("compliance", "Data-subject requests (GDPR, CCPA): a user's data deleted or "
                                  "exported, on a due date.")
WRITE: Final = auth.ApiKey("compliance:write")
_DSR: Final = "/v1/compliance/dsr/{dsr_id}"


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
    """Fulfil a data-subject request, once: a deletion removes the user's rows at once and
    anonymizes its history (audit events, risk decisions); an export answers the JSON document
    of everything held about the user and records it for ``output_artifact_url``. Calling it
    again answers the first result."""
    done = await service.fulfil(call.pool, call.actor, call.path("dsr_id"), body)
    return call.reply(done, status=200 if done.dsr.status == "fulfilled" else 202)
