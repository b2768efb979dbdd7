"""Recovery routes (DESIGN.md "admin portal, SCIM, recovery, operators"): requests filed by the
application for a user who lost every way in, decided by an operator. Reads accept
``users:read`` or ``users:write``; filing and deciding need ``users:write`` (a decision changes
the user's contact and revokes its sessions)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import (
    EmailInUse,
    InvalidEmail,
    InvalidRequest,
    PhoneInUse,
    RecoveryRequestNotFound,
    RecoveryRequestNotPending,
    RecoveryRequestPending,
    UserNotFound,
)
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.recovery import service
from control_plane.recovery.schemas import (
    DecisionBody,
    RecoveryBody,
    RecoveryQuery,
    RecoveryRequest,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page

routes = RouteTable("recovery", "Account recovery: a user who lost every passkey and their "
                                "e-mail let back in at a new destination, once approved.")
READ: Final = auth.ApiKey("users:read", "users:write")
WRITE: Final = auth.ApiKey("users:write")
_REQUEST: Final = "/v1/recovery/requests/{recovery_id}"


@endpoint(routes, "POST", "/v1/recovery/requests", auth=WRITE,
          errors=[InvalidRequest, InvalidEmail, UserNotFound, EmailInUse, PhoneInUse,
                  RecoveryRequestPending],
          replies=[Reply(201, "The request, pending.", RecoveryRequest)])
async def post_recovery_requests(call: Call, body: RecoveryBody) -> web.Response:
    """File a recovery request for ``user_id``: its recovery link is to go to the new ``email``
    or ``phone_number`` (exactly one), which no other user of the project may hold. A user has
    at most one pending request (409 ``recovery_request_pending`` names it)."""
    async with call.connection() as conn:
        created = await service.file_request(conn, call.actor, body)
    return call.reply(created, status=201)


@endpoint(routes, "GET", "/v1/recovery/requests", auth=READ, errors=[InvalidRequest],
          replies=[Reply(200, "A page of requests, oldest first.", Page[RecoveryRequest])])
async def get_recovery_requests(call: Call, query: RecoveryQuery) -> web.Response:
    """List the project's recovery requests, by ``status`` and ``user_id``."""
    listing = Listing(service.LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_requests(call.pool, listing, query))


@endpoint(routes, "GET", _REQUEST, auth=READ, errors=[RecoveryRequestNotFound],
          replies=[Reply(200, "The request.", RecoveryRequest)])
async def get_recovery_request(call: Call) -> web.Response:
    """Show a recovery request."""
    return call.reply(await service.find_request(call.pool, call.project_id,
                                                 call.path("recovery_id")))


@endpoint(routes, "POST", _REQUEST + "/approve", auth=WRITE,
          errors=[RecoveryRequestNotFound, RecoveryRequestNotPending, EmailInUse, PhoneInUse],
          replies=[Reply(200, "Approved: the link is on its way.", RecoveryRequest)])
async def post_recovery_request_approve(call: Call, body: DecisionBody) -> web.Response:
    """Approve a pending request: its destination becomes the user's e-mail address or phone
    number (unverified until the link is used), every session of the user is revoked, and a
    one-time recovery link valid for 24 hours is sent there; using it signs the user in."""
    async with call.connection() as conn:
        decided = await service.approve(conn, call.actor, recovery_id=call.path("recovery_id"),
                                        note=body.note, kms=call.app[KMS], settings=call.settings)
    return call.reply(decided)


@endpoint(routes, "POST", _REQUEST + "/deny", auth=WRITE,
          errors=[RecoveryRequestNotFound, RecoveryRequestNotPending],
          replies=[Reply(200, "Denied.", RecoveryRequest)])
async def post_recovery_request_deny(call: Call, body: DecisionBody) -> web.Response:
    """Deny a pending request; nothing else changes."""
    async with call.connection() as conn:
        decided = await service.deny(conn, call.actor, recovery_id=call.path("recovery_id"),
                                     note=body.note)
    return call.reply(decided)
