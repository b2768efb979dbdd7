"""Tenancy routes: bootstrap, the calling key's project, API keys."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.appkeys import AUTHENTICATOR
from common.errors import DomainInUse, InsufficientScope, InvalidEmail, NotFound
from common.routing import Reply, RouteTable
from control_plane.appkeys import CORS_ORIGINS, CURSOR_SECRET, KEYRING, KMS, OUTBOX_WAKE
from control_plane.operators import service as operators
from control_plane.tenancy import service
from control_plane.tenancy.schemas import (
    ApiKey,
    BootstrapBody,
    Bootstrapped,
    CreateApiKey,
    NewApiKey,
    PatchProject,
    Project,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page, PageQuery

routes = RouteTable("tenancy", "Bootstrap, the calling key's project, and API keys.")
KEYS_WRITE: Final = auth.ApiKey("keys:write")


@endpoint(routes, "POST", "/v1/bootstrap", auth=auth.Bootstrap(), errors=[InvalidEmail],
          replies=[Reply(201, "The tenant, project and full-access key (its secret shown once), "
                              "and the first operator when operator_email was given.",
                         Bootstrapped)])
async def post_bootstrap(call: Call, body: BootstrapBody) -> web.Response:
    """Create the first tenant, project and ``sk_live_`` key (SPEC.md 4 rule 1).

    With ``operator_email``, the tenant's first dashboard operator too, in the same transaction:
    an invitation to the operator console (``/console``) is sent there. The bootstrap token is
    checked before the body is read, so a stranger learns nothing from validation."""
    async with call.connection() as conn:
        if body.operator_email is None:
            result = await service.bootstrap(conn, call.actor, body=body)
        else:
            result = await operators.bootstrap(conn, call.actor, body=body, kms=call.app[KMS],
                                               settings=call.settings,
                                               outbox=call.app[OUTBOX_WAKE])
    return call.reply(result, status=201)


@endpoint(routes, "GET", "/v1/projects/me", auth=auth.ApiKey(),
          replies=[Reply(200, "The project.", Project)])
async def get_project(call: Call) -> web.Response:
    """The calling key's project."""
    return call.reply(await service.describe_project(call.pool, call.project_id))


@endpoint(routes, "PATCH", "/v1/projects/me", auth=KEYS_WRITE, errors=[DomainInUse],
          replies=[Reply(200, "The project as changed.", Project)])
async def patch_project(call: Call, body: PatchProject) -> web.Response:
    """Change the project's token settings.

    ``signing_alg`` (``EdDSA`` or ``RS256``; a change rotates to a key of the new algorithm at
    once, the old key staying published for its overlap window), ``domains`` (host names that
    name the project on public endpoints; replaces the set), ``cors_origins`` (origins whose
    pages may call the public endpoints, ``/v1/auth/*`` and ``/v1/sessions/*``, with
    credentials, besides ``webauthn.origins``: exact ``scheme://host[:port]``, https but for
    loopback hosts; replaces the set; this process follows at once, others within 10 s) and
    ``webauthn`` (the passkey relying party)."""
    async with call.connection() as conn:
        changes = await service.update_project(conn, call.actor, kms=call.app[KMS],
                                               settings=call.settings, body=body)
        project = await service.describe_project(conn, call.project_id)
    if "signing_alg" in changes:
        call.app[KEYRING].forget(call.project_id)
    if changes.keys() & {"cors_origins", "webauthn", "domains"}:
        call.app[CORS_ORIGINS].forget(call.project_id)  # other processes: within its TTL
    return call.reply(project)


@endpoint(routes, "POST", "/v1/api-keys", auth=KEYS_WRITE, errors=[InsufficientScope],
          replies=[Reply(201, "The key, with its secret (shown once).", NewApiKey)])
async def post_api_keys(call: Call, body: CreateApiKey) -> web.Response:
    """Create an API key.

    Never with more access than the calling key's; a ``sk_test_`` key creates ``sk_test_`` keys
    only."""
    async with call.connection() as conn:
        key = await service.create_api_key(conn, call.actor, body=body)
    return call.reply(key, status=201)


@endpoint(routes, "GET", "/v1/api-keys", auth=KEYS_WRITE,
          replies=[Reply(200, "A page of keys in creation order.", Page[ApiKey])])
async def get_api_keys(call: Call, query: PageQuery) -> web.Response:
    """List the project's API keys (never their secrets)."""
    page = await service.list_api_keys(
        call.pool, Listing("api_keys", call.project_id, call.app[CURSOR_SECRET]), query)
    return call.reply(page)


@endpoint(routes, "DELETE", "/v1/api-keys/{key_id}", auth=auth.ApiKey(),
          errors=[NotFound, InsufficientScope],
          replies=[Reply(200, "The key, revoked.", ApiKey)])
async def delete_api_key(call: Call) -> web.Response:
    """Revoke an API key: any key with `keys:write`, or the calling key itself, whatever its
    scopes (a signed-out tool revokes its own key, as RFC 7009 lets a client revoke its token).

    Every process refuses it at once (within a second even if the announcement is lost).
    Idempotent; a key may not revoke one with more access than itself."""
    async with call.connection() as conn:
        key = await service.revoke_api_key(conn, call.actor, key_id=call.path("key_id"),
                                           authenticator=call.app[AUTHENTICATOR])
    return call.reply(key)
