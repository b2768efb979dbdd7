"""Signing-key routes: the public JWKS, and listing and rotating a project's keys
(``keys:write``)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KEYRING, KMS
from control_plane.signing_keys import repository, service
from control_plane.signing_keys.schemas import Jwks, RotateBody, SigningKey
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page, PageQuery, page_by_id
from control_plane.web.public_project import HEADER as PROJECT_HEADER

routes = RouteTable("signing_keys", "The keys that sign access tokens, and their JWK Set.")
KEYS_WRITE: Final = auth.ApiKey("keys:write")
JWKS_MAX_AGE_SECONDS: Final = 600  # SPEC.md 5.4 / 8: verifiers cache the JWKS about 10 minutes


@endpoint(routes, "GET", "/v1/auth/.well-known/jwks.json", auth=auth.Public(),
          headers={"If-None-Match": "The ETag of a JWK Set fetched before: 304 when unchanged."},
          replies=[Reply(200, "The project's JWK Set (RFC 7517).", Jwks, headers={
                             "ETag": "Strong ETag of the set.",
                             "Cache-Control": "public, max-age=600"}),
                   Reply(304, "Unchanged since the ETag in If-None-Match.", content_type=None)])
async def get_jwks(call: Call) -> web.StreamResponse:
    """The project's public signing keys (JWKS).

    Active, pending and still-published retired keys. Cache it about 10 minutes; a verifier that
    meets an unknown ``kid`` (after an emergency rotation) should fetch it again."""
    keys = await service.published_jwks(call.pool, call.app[KMS], call.project_id)
    etag = service.jwks_etag(keys)
    headers = {"Cache-Control": f"public, max-age={JWKS_MAX_AGE_SECONDS}", "ETag": f'"{etag}"',
               "Vary": PROJECT_HEADER}
    wanted = call.request.if_none_match
    if wanted and any(t.value in (etag, "*") for t in wanted):
        return web.Response(status=304, headers=headers)
    return call.reply(Jwks(keys), headers=headers)


@endpoint(routes, "GET", "/v1/signing-keys", auth=KEYS_WRITE,
          replies=[Reply(200, "A page of keys in creation order.", Page[SigningKey])])
async def get_signing_keys(call: Call, query: PageQuery) -> web.Response:
    """List the project's stored signing keys (never private material)."""
    page = await page_by_id(
        call.pool, Listing("signing_keys", call.project_id, call.app[CURSOR_SECRET]), query,
        table="signing_keys", columns=repository.LIST_COLUMNS, row=repository.signing_key,
        id_column="kid",
    )
    return call.reply(page)


@endpoint(routes, "POST", "/v1/signing-keys/rotate", auth=KEYS_WRITE,
          replies=[Reply(201, "The new active key.", SigningKey)])
async def post_signing_keys_rotate(call: Call, body: RotateBody) -> web.Response:
    """Rotate the project's signing key now.

    A new key signs at once; the old one stays published until every token it signed has
    expired. ``alg`` changes the project's algorithm."""
    async with call.connection() as conn:
        key = await service.rotate_now(conn, call.actor, kms=call.app[KMS],
                                       settings=call.settings,
                                       project_id=call.project_id, alg=body.alg)
    call.app[KEYRING].forget(call.project_id)
    return call.reply(key, status=201)
