"""CLI login routes: the device authorization grant (RFC 8628) and its approval page."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from common.errors import InsufficientScope, InvalidRequest
from common.routing import Reply, RouteTable
from common.schemas import M, parse_body, parse_model
from control_plane.imports import service
from control_plane.imports.page import APPROVAL_PAGE
from control_plane.imports.schemas import (
    Approval,
    ApproveBody,
    DeviceCode,
    DeviceCodeBody,
    DeviceToken,
    DeviceTokenBody,
    DeviceTokenError,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pages import page

routes = RouteTable("cli", "Signing the command-line tool in: the OAuth 2.0 device authorization "
                           "grant (RFC 8628) and the page where an operator approves it.")

_FORM: Final = "application/x-www-form-urlencoded"
_NO_STORE: Final = {"Cache-Control": "no-store", "Pragma": "no-cache"}  # RFC 6749 5.1


async def _form_or_json(call: Call, model: type[M]) -> M:
    """The body as ``model``: form fields (what OAuth clients send) or a JSON object."""
    if call.request.content_type != _FORM:
        return await parse_body(call.request, model)
    try:
        form = await call.request.post()
    except (UnicodeDecodeError, LookupError, ValueError):
        raise InvalidRequest.field("body", "must be form fields in the charset it names") from None
    fields: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
    return parse_model(model, fields)


@endpoint(routes, "POST", "/v1/cli/device/code", auth=auth.Anonymous(), body=DeviceCodeBody,
          errors=[InvalidRequest],
          replies=[Reply(200, "The codes (RFC 8628 3.2).", DeviceCode)])
async def post_device_code(call: Call) -> web.Response:
    """Start a device authorization (``authio login``).

    Form fields or JSON. Show ``user_code`` and ``verification_uri`` to the person, then poll
    ``POST /v1/cli/device/token`` every ``interval`` seconds until approved, denied or
    ``expires_in`` has passed."""
    body = await _form_or_json(call, DeviceCodeBody)
    code = await service.start(call.pool, body=body, settings=call.settings)
    return call.reply(code, headers=_NO_STORE)


@endpoint(routes, "POST", "/v1/cli/device/token", auth=auth.Anonymous(), body=DeviceTokenBody,
          replies=[Reply(200, "Approved: the new key, shown this once.", DeviceToken),
                   Reply(400, "Not (yet) approved: an RFC 8628 3.5 error.", DeviceTokenError)])
async def post_device_token(call: Call) -> web.Response:
    """Poll for the device's key (RFC 8628 3.4): `grant_type`
    `urn:ietf:params:oauth:grant-type:device_code` and the `device_code`, as form fields or JSON.

    400 with an OAuth error body: `authorization_pending` (poll again after `interval`),
    `slow_down` (polled too soon: the interval grows by 5 s), `access_denied`, `expired_token`,
    `invalid_grant` (unknown or already redeemed), `invalid_request`, `unsupported_grant_type`.
    Approved: a new `sk_live_` key of the approving operator's project, answered once."""
    try:
        body = await _form_or_json(call, DeviceTokenBody)
        async with call.connection() as conn:
            token = await service.redeem(conn, call.actor, body=body)
    except InvalidRequest as err:
        return call.reply(DeviceTokenError("invalid_request", err.message), status=400,
                          headers=_NO_STORE)
    except service.DeviceFlowError as err:
        return call.reply(DeviceTokenError(err.error, err.description), status=400,
                          headers=_NO_STORE)
    return call.reply(token, headers=_NO_STORE)


@endpoint(routes, "POST", "/v1/cli/device/approve",
          auth=auth.ApiKey(full_access="Approving a device needs a full-access key."),
          errors=[InvalidRequest, InsufficientScope],
          replies=[Reply(200, "Decided.", Approval)])
async def post_device_approve(call: Call, body: ApproveBody) -> web.Response:
    """Approve (or, with `"decision": "deny"`, refuse) the device showing `user_code`.

    The device's next poll receives a new `sk_live_` key of this key's project with `scopes`
    (default: those the device asked for, else what an import needs: `organizations:write`,
    `users:read`, `users:write`). 400 `invalid_request` naming `user_code` when no device
    waits with that code."""
    async with call.connection() as conn:
        approval = await service.decide(conn, call.actor, body=body)
    return call.reply(approval)


@endpoint(routes, "GET", service.PAGE_PATH, auth=auth.Anonymous(), allow_head=False,
          replies=[Reply(200, "The page.", content_type="text/html")])
async def get_device_page(call: Call) -> web.Response:
    """The approval page `verification_uri` opens: the code (filled in from `user_code` in the
    query), the operator's full-access API key, and Approve and Deny buttons that call
    `POST /v1/cli/device/approve`. The key stays in the page (never stored)."""
    return page(lambda nonce: APPROVAL_PAGE.format(nonce=nonce))
