"""Import tool routes: the device authorization grant (RFC 8628) and its approval page, and the
multi-tenant importer's live-mode credentials."""

from __future__ import annotations

import logging
from typing import Any, Final

from aiohttp import web

from common.errors import InsufficientScope, InvalidRequest, NotFound, ServiceUnavailable
from common.routing import Reply, RouteTable
from common.schemas import M, parse_body, parse_model
from control_plane.appkeys import KMS
from control_plane.imports import service
from control_plane.imports.page import APPROVAL_PAGE
from control_plane.imports.schemas import (
    Approval,
    ApproveBody,
    CredentialBody,
    DeviceCode,
    DeviceCodeBody,
    DeviceToken,
    DeviceTokenBody,
    DeviceTokenError,
    ImportCredential,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pages import page
from control_plane.web.streaming import stream_body, streamed_response

log = logging.getLogger("authio.imports")

routes = RouteTable("cli", "The import tool: signing it in (the OAuth 2.0 device authorization "
                           "grant, RFC 8628, and the page where an operator approves it) and the "
                           "multi-tenant importer's live-mode credentials.")

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


IMPORTS_WRITE: Final = auth.ApiKey("users:write")
_CREDENTIAL_PATH: Final = "/v1/imports/credentials/{credential_id}"


@endpoint(routes, "POST", "/v1/imports/credentials", auth=IMPORTS_WRITE, errors=[InvalidRequest],
          replies=[Reply(201, "Stored, sealed, for 24 hours at most.", ImportCredential)])
async def post_import_credential(call: Call, body: CredentialBody) -> web.Response:
    """Hand the service an origin project's management token for a live multi-tenant import
    (`authio import descope --live-token ... --source-project-id ...`).

    The token is envelope-encrypted at once and never shown again; the credential is deleted
    by `DELETE` or, at the latest, 24 hours after it was stored."""
    async with call.connection() as conn:
        credential = await service.create_credential(conn, call.actor, body=body,
                                                     kms=call.app[KMS])
    return call.reply(credential, status=201)


@endpoint(routes, "GET", _CREDENTIAL_PATH + "/export", auth=IMPORTS_WRITE, allow_head=False,
          errors=[NotFound, InvalidRequest, ServiceUnavailable],
          replies=[Reply(200, "The origin project's tenants and users, "
                              '`{"tenants": [...], "users": [...], "total": n}`, streamed.',
                         content_type="application/json", envelope=False)])
async def get_import_credential_export(call: Call) -> web.StreamResponse:
    """Read the origin project through the credential: its tenants, then its users page by
    page, as one JSON document the multi-tenant importer takes as `--input`.

    404 for an unknown or expired credential; 400 `invalid_request` naming `token` when the
    origin refuses it; 503 when the origin cannot be read. A failure once the answer has
    started cuts the transfer short (the document is then incomplete JSON)."""
    chunks = service.open_export(call.pool, call.project_id,
                                 credential_id=call.path("credential_id"),
                                 kms=call.app[KMS], settings=call.settings)
    response = streamed_response(call.request, "application/json")
    return await stream_body(call.request, response, chunks, what="live import export",
                             logger=log)


@endpoint(routes, "DELETE", _CREDENTIAL_PATH, auth=IMPORTS_WRITE, errors=[NotFound],
          replies=[Reply(200, "Deleted.", ImportCredential)])
async def delete_import_credential(call: Call) -> web.Response:
    """Forget a live-import credential now (what `authio import` does once it has the export)."""
    async with call.connection() as conn:
        credential = await service.forget_credential(conn, call.actor,
                                                     credential_id=call.path("credential_id"))
    return call.reply(credential)
