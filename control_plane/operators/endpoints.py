"""Dashboard operator routes (DESIGN.md "admin portal, SCIM, recovery, operators"): add, list
and remove the operators of the calling key's tenant. ``keys:write``: an operator can mint and
revoke the tenant's keys in the console, so making one is as strong as key management."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import InvalidEmail, InvalidRequest, OperatorExists, OperatorNotFound
from common.http import request_id
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS, OUTBOX_WAKE
from control_plane.operators import service
from control_plane.operators.schemas import AddOperator, Operator
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Page, PageQuery

routes = RouteTable("operators", "Dashboard operators of the tenant: the people who sign in to "
                                 "the operator console at /console.")
KEYS_WRITE: Final = auth.ApiKey("keys:write")


def _tenant(call: Call) -> str:
    key = call.actor.api_key
    assert key is not None
    return key.tenant_id


@endpoint(routes, "POST", "/v1/operators", auth=KEYS_WRITE,
          errors=[InvalidRequest, InvalidEmail, OperatorExists],
          replies=[Reply(201, "The operator; an invitation to the console is on its way.",
                         Operator)])
async def post_operators(call: Call, body: AddOperator) -> web.Response:
    """Add a dashboard operator to the calling key's tenant.

    The operator signs in to the console (`/console`) by a link sent to `email`; the first
    message, sent now, is an invitation to it. 409 `operator_exists` when the address is an
    operator of the tenant already (compared case-insensitively)."""
    async with call.connection() as conn:
        operator = await service.add_operator(
            conn, call.actor, tenant_id=_tenant(call), email=body.email, name=body.name,
            kms=call.app[KMS], settings=call.settings, outbox=call.app[OUTBOX_WAKE])
    return call.reply(operator, status=201)


@endpoint(routes, "GET", "/v1/operators", auth=KEYS_WRITE, errors=[InvalidRequest],
          replies=[Reply(200, "A page of operators in the order they were added.",
                         Page[Operator])])
async def get_operators(call: Call, query: PageQuery) -> web.Response:
    """List the dashboard operators of the calling key's tenant."""
    page = await service.list_operators(call.pool, _tenant(call), query,
                                        secret=call.app[CURSOR_SECRET])
    return call.reply(page)


@endpoint(routes, "DELETE", "/v1/operators/{operator_id}", auth=KEYS_WRITE,
          errors=[OperatorNotFound],
          replies=[Reply(204, "Removed: the operator's console sessions are revoked.",
                         content_type=None)])
async def delete_operator(call: Call) -> web.Response:
    """Remove a dashboard operator: its console sessions end at once, and it can no longer
    sign in to the console."""
    async with call.connection() as conn:
        await service.remove_operator(conn, call.actor, tenant_id=_tenant(call),
                                      operator_id=call.path("operator_id"))
    return web.Response(status=204, headers={"X-Request-Id": request_id(call.request)})
