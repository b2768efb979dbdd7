"""SCIM 2.0 routes (RFC 7644; DESIGN.md "admin portal, SCIM, recovery, operators").

``POST /v1/organizations/{org_id}/scim-token`` (API key, ``organizations:write``) mints the
organization's token. Under ``/scim/v2``: ``Users`` and ``Groups`` (the organization's bearer
token, :class:`ScimToken`), and the discovery resources ``ServiceProviderConfig``, ``Schemas``
and ``ResourceTypes`` (no token, RFC 7643 5). Answers are ``application/scim+json``, and every
refusal under ``/scim/v2`` (an unknown route's 404 and a 405 too) is RFC 7644's error body
(:func:`error_response`, registered with the envelope middleware), with ``X-Request-Id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web

from common.appkeys import PG_POOL
from common.errors import (
    InvalidRequest,
    OrganizationNotFound,
    ScimBadRequest,
    ScimConflict,
    ScimError,
    ScimNotFound,
    ScimNotImplemented,
    ScimPreconditionFailed,
    ServiceError,
    StoreNotFound,
)
from common.http import REQUEST_ID, OneWriteResponse, read_json, render_errors_under
from common.routing import Reply, RequestHeader, RouteTable, Security
from control_plane.appkeys import KMS, OUTBOX_WAKE
from control_plane.scim import service
from control_plane.scim.schemas import (
    ERROR_BODY,
    ERROR_URN,
    SCIM_JSON,
    DiscoveryReply,
    GroupBody,
    GroupReply,
    ListQuery,
    ListReply,
    MintBody,
    MintedToken,
    PatchBody,
    ResourceQuery,
    ScimCaller,
    SearchBody,
    UserBody,
    UserReply,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint

routes = RouteTable("scim", "SCIM 2.0 (RFC 7643/7644): an organization's directory (Microsoft "
                            "Entra ID, Okta) provisions its users and groups.")
BASE: Final = service.BASE_PATH
# Any segment but ``.search`` (whose path takes POST only): an id that is none is not found.
_USER: Final = BASE + "/Users/{user_id:[^/.][^/]*}"
_GROUP: Final = BASE + "/Groups/{group_id:[^/.][^/]*}"
_IF_MATCH: Final = {"If-Match": RequestHeader(
    "Change only if the resource still has this version (its ETag, `meta.version`); else 412.",
    "^[\\x20-\\x7e]{1,512}$")}
_RESOURCE_HEADERS: Final = {"ETag": "The resource's version (`meta.version`).",
                            "Location": "The resource's URL (`meta.location`)."}


def error_response(err: ServiceError, rid: str) -> web.Response:
    """``err`` as RFC 7644 3.12's error body (``application/scim+json``): its status,
    ``scimType`` when one applies (a malformed body is ``invalidSyntax``, another invalid
    request ``invalidValue``) and its message as ``detail``; ``X-Request-Id`` and the error's
    own headers (``Retry-After``, ``Allow``, ``WWW-Authenticate``)."""
    scim_type: str | None = None
    if isinstance(err, ScimError):
        scim_type = err.scim_type
    elif isinstance(err, InvalidRequest):
        malformed = "JSON" in err.message or err.details.get("reason") is not None
        scim_type = "invalidSyntax" if malformed else "invalidValue"
    body: dict[str, Any] = {"schemas": [ERROR_URN], "status": str(err.status)}
    if scim_type is not None:
        body["scimType"] = scim_type
    body["detail"] = err.message
    return OneWriteResponse(body=orjson.dumps(body), status=err.status, content_type=SCIM_JSON,
                            headers={"X-Request-Id": rid, **err.headers})


render_errors_under(BASE, error_response)


def scim_reply(request: web.Request, body: dict[str, Any], *, status: int = 200,
               version: str | None = None, location: str | None = None) -> web.Response:
    """A SCIM answer: ``body`` as ``application/scim+json`` (no envelope), with ``ETag`` and
    ``Location`` when given and ``X-Request-Id``."""
    headers = {"X-Request-Id": request[REQUEST_ID]}
    if version is not None:
        headers["ETag"] = version
    if location is not None:
        headers["Location"] = location
    return OneWriteResponse(body=orjson.dumps(body), status=status, content_type=SCIM_JSON,
                            headers=headers)


def _shown(request: web.Request, shown: service.Shown, *, status: int = 200) -> web.Response:
    return scim_reply(request, shown.body, status=status, version=shown.version,
                      location=shown.location if status == 201 else None)


@dataclass(frozen=True, slots=True)
class ScimCall(Call):
    """A SCIM request and the organization its token speaks for."""

    caller: ScimCaller | None = None

    @property
    def scim(self) -> ScimCaller:
        assert self.caller is not None
        return self.caller


class ScimToken:
    """The organization's SCIM token (``Authorization: Bearer scim_...``). The actor is the
    token (type ``scim``, id ``sct_...``), in the organization's project. Raises
    ScimUnauthorized."""

    security: Final[tuple[Security, ...]] = ("scim_token",)
    scopes: Final[tuple[str, ...]] = ()
    names_project: Final = False

    async def __call__(self, request: web.Request) -> Call:
        caller = await service.authenticate(request.app[PG_POOL],
                                            request.headers.get("Authorization"))
        actor = auth.request_actor(request, "scim", caller.token_id, project_id=caller.project_id)
        return ScimCall(request, actor, caller=caller)


TOKEN: Final = ScimToken()
DISCOVERY: Final = auth.Anonymous()


def _scim(call: Call) -> ScimCaller:
    assert isinstance(call, ScimCall)
    return call.scim


async def _payload(call: Call) -> dict[str, Any]:
    return await read_json(call.request)


# --- the token ---------------------------------------------------------------------------------


@endpoint(routes, "POST", "/v1/organizations/{org_id}/scim-token",
          auth=auth.ApiKey("organizations:write"), errors=[OrganizationNotFound, StoreNotFound],
          replies=[Reply(201, "The new token, shown this once.", MintedToken)])
async def post_organization_scim_token(call: Call, body: MintBody) -> web.Response:
    """Mint the organization's SCIM token, replacing its previous one at once. Give the
    directory ``base_url`` and ``token``. ``store_id`` names the store whose tuples the
    organization's directory groups write (``group:<grp_ id>#member@user:<user_ id>`` for each
    active member), or null for none; left out, the store stays as it was."""
    async with call.connection() as conn:
        minted = await service.mint_token(conn, call.actor, org_id=call.path("org_id"), body=body,
                                          kms=call.app[KMS], settings=call.settings)
    return call.reply(minted, status=201)


# --- discovery ---------------------------------------------------------------------------------


@endpoint(routes, "GET", BASE + "/ServiceProviderConfig", auth=DISCOVERY, error_body=ERROR_BODY,
          replies=[Reply(200, "RFC 7643 5.", DiscoveryReply, content_type=SCIM_JSON,
                         envelope=False)])
async def get_scim_service_provider_config(call: Call) -> web.Response:
    """What this SCIM service provider supports (no token needed): PATCH, filters and ETags;
    no bulk, sorting or password changes."""
    return scim_reply(call.request, service.service_provider_config(call.settings))


@endpoint(routes, "GET", BASE + "/Schemas", auth=DISCOVERY, error_body=ERROR_BODY,
          replies=[Reply(200, "RFC 7643 7.", DiscoveryReply, content_type=SCIM_JSON,
                         envelope=False)])
async def get_scim_schemas(call: Call) -> web.Response:
    """The schemas of the resources (User, its enterprise extension, Group); no token needed.
    The User schema marks ``emails`` required: users are unique on their e-mail address."""
    return scim_reply(call.request, service.schemas(call.settings).body)


@endpoint(routes, "GET", BASE + "/Schemas/{schema_id:urn:[A-Za-z0-9:._-]+}", auth=DISCOVERY,
          error_body=ERROR_BODY, errors=[ScimNotFound],
          replies=[Reply(200, "RFC 7643 7.", DiscoveryReply, content_type=SCIM_JSON,
                         envelope=False)])
async def get_scim_schema(call: Call) -> web.Response:
    """One schema, by its URN."""
    return scim_reply(call.request, service.find_schema(call.settings, call.path("schema_id")))


@endpoint(routes, "GET", BASE + "/ResourceTypes", auth=DISCOVERY, error_body=ERROR_BODY,
          replies=[Reply(200, "RFC 7643 6.", DiscoveryReply, content_type=SCIM_JSON,
                         envelope=False)])
async def get_scim_resource_types(call: Call) -> web.Response:
    """The resource types served (User, Group); no token needed."""
    return scim_reply(call.request, service.resource_types(call.settings).body)


@endpoint(routes, "GET", BASE + "/ResourceTypes/{resource_type:[A-Za-z]+}",
          auth=DISCOVERY, error_body=ERROR_BODY, errors=[ScimNotFound],
          replies=[Reply(200, "RFC 7643 6.", DiscoveryReply, content_type=SCIM_JSON,
                         envelope=False)])
async def get_scim_resource_type(call: Call) -> web.Response:
    """One resource type, by its name."""
    return scim_reply(call.request,
                      service.find_resource_type(call.settings, call.path("resource_type")))


@endpoint(routes, "POST", BASE + "/.search", auth=TOKEN, error_body=ERROR_BODY,
          body=SearchBody, errors=[ScimNotImplemented], replies=[Reply(
              200, "Never: a search across resource types is not offered (501).", ListReply,
              content_type=SCIM_JSON, envelope=False)])
async def post_scim_search(call: Call) -> web.Response:
    """A search across every resource type (RFC 7644 3.4.3) is not offered: 501, as RFC 7644
    3.12 says for an operation a service provider does not support. Search ``/Users/.search``
    or ``/Groups/.search``."""
    raise ScimNotImplemented("Search /Users/.search or /Groups/.search: a search across "
                             "resource types is not offered.")


# --- users -------------------------------------------------------------------------------------

_USER_ERRORS: Final = [ScimBadRequest, ScimConflict]


@endpoint(routes, "GET", BASE + "/Users", auth=TOKEN, error_body=ERROR_BODY, errors=[ScimBadRequest],
          replies=[Reply(200, "A page of the organization's users.", ListReply,
                         content_type=SCIM_JSON, envelope=False)])
async def get_scim_users(call: Call, query: ListQuery) -> web.Response:
    """The organization's users (its members), filtered (``filter``, such as
    ``userName eq "bjensen"``) and paged (``startIndex``, ``count``)."""
    listed = await service.list_users(call.pool, _scim(call), query=query, settings=call.settings)
    return scim_reply(call.request, listed.body)


@endpoint(routes, "POST", BASE + "/Users", auth=TOKEN, error_body=ERROR_BODY, body=UserBody,
          errors=_USER_ERRORS,
          replies=[Reply(201, "The user, now a member of the organization.", UserReply,
                         content_type=SCIM_JSON, envelope=False, headers=_RESOURCE_HEADERS)])
async def post_scim_users(call: Call) -> web.Response:
    """Provision a user: the project's user with the resource's primary e-mail address (else
    its first), created if there is none, becomes a member of the organization. ``active:
    false`` suspends the membership. 409 ``uniqueness`` when the user is in the directory
    already, or the ``userName`` is another member's."""
    payload = await _payload(call)
    async with call.connection() as conn:
        shown = await service.provision_user(
            conn, call.actor, _scim(call), payload=payload, kms=call.app[KMS],
            settings=call.settings, outbox=call.app[OUTBOX_WAKE])
    return _shown(call.request, shown, status=201)


@endpoint(routes, "POST", BASE + "/Users/.search", auth=TOKEN, error_body=ERROR_BODY,
          body=SearchBody, errors=[ScimBadRequest],
          replies=[Reply(200, "A page of the organization's users.", ListReply,
                         content_type=SCIM_JSON, envelope=False)])
async def post_scim_users_search(call: Call) -> web.Response:
    """The users listing with its query as a body (RFC 7644 3.4.3)."""
    query = service.search_query(await _payload(call))
    listed = await service.list_users(call.pool, _scim(call), query=query, settings=call.settings)
    return scim_reply(call.request, listed.body)


@endpoint(routes, "GET", _USER, auth=TOKEN, error_body=ERROR_BODY, errors=[ScimBadRequest, ScimNotFound],
          replies=[Reply(200, "The user.", UserReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def get_scim_user(call: Call, query: ResourceQuery) -> web.Response:
    """A user of the organization, by its ``user_`` id; 404 when it is not a member."""
    shown = await service.find_user(call.pool, _scim(call), call.path("user_id"), query=query,
                                    settings=call.settings)
    return _shown(call.request, shown)


@endpoint(routes, "PUT", _USER, auth=TOKEN, error_body=ERROR_BODY, body=UserBody, headers=_IF_MATCH,
          errors=[*_USER_ERRORS, ScimNotFound, ScimPreconditionFailed],
          replies=[Reply(200, "The user.", UserReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def put_scim_user(call: Call) -> web.Response:
    """Replace what the directory says of the user. A changed primary e-mail address or display
    name changes the user; ``active`` suspends or reactivates the membership."""
    payload = await _payload(call)
    async with call.connection() as conn:
        shown = await service.replace_user(
            conn, call.actor, _scim(call), user_id=call.path("user_id"), payload=payload,
            if_match=call.request.headers.get("If-Match"), settings=call.settings)
    return _shown(call.request, shown)


@endpoint(routes, "PATCH", _USER, auth=TOKEN, error_body=ERROR_BODY, body=PatchBody, headers=_IF_MATCH,
          errors=[*_USER_ERRORS, ScimNotFound, ScimPreconditionFailed],
          replies=[Reply(200, "The user.", UserReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def patch_scim_user(call: Call) -> web.Response:
    """Change the user by RFC 7644 PATCH operations (Entra's capitalised ``op`` values and
    ``"False"`` strings, Okta's path-less replace of ``active``, are taken). ``active: false``
    suspends the membership and revokes every session of the user."""
    payload = await _payload(call)
    async with call.connection() as conn:
        shown = await service.amend_user(
            conn, call.actor, _scim(call), user_id=call.path("user_id"), payload=payload,
            if_match=call.request.headers.get("If-Match"), settings=call.settings)
    return _shown(call.request, shown)


@endpoint(routes, "DELETE", _USER, auth=TOKEN, error_body=ERROR_BODY, headers=_IF_MATCH,
          errors=[ScimNotFound, ScimPreconditionFailed],
          replies=[Reply(204, "Deprovisioned.", content_type=None)])
async def delete_scim_user(call: Call) -> web.Response:
    """Deprovision the user: its membership (and its place in the organization's groups) goes
    and every session of the user is revoked; the user stays for its other organizations."""
    async with call.connection() as conn:
        await service.deprovision_user(conn, call.actor, _scim(call),
                                       user_id=call.path("user_id"),
                                       if_match=call.request.headers.get("If-Match"),
                                       settings=call.settings)
    return web.Response(status=204, headers={"X-Request-Id": call.request[REQUEST_ID]})


# --- groups ------------------------------------------------------------------------------------


@endpoint(routes, "GET", BASE + "/Groups", auth=TOKEN, error_body=ERROR_BODY, errors=[ScimBadRequest],
          replies=[Reply(200, "A page of the organization's groups.", ListReply,
                         content_type=SCIM_JSON, envelope=False)])
async def get_scim_groups(call: Call, query: ListQuery) -> web.Response:
    """The organization's directory groups, filtered and paged; ``excludedAttributes=members``
    leaves the members out."""
    listed = await service.list_groups(call.pool, _scim(call), query=query, settings=call.settings)
    return scim_reply(call.request, listed.body)


@endpoint(routes, "POST", BASE + "/Groups", auth=TOKEN, error_body=ERROR_BODY, body=GroupBody,
          errors=[ScimBadRequest, ScimConflict],
          replies=[Reply(201, "The group.", GroupReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def post_scim_groups(call: Call) -> web.Response:
    """Create a group of members of the organization (each member's ``value`` is its ``user_``
    id); with a store, each active member gets ``group:<id>#member@user:<user_id>``."""
    payload = await _payload(call)
    async with call.connection() as conn:
        shown = await service.create_group(conn, call.actor, _scim(call), payload=payload,
                                           settings=call.settings)
    return _shown(call.request, shown, status=201)


@endpoint(routes, "POST", BASE + "/Groups/.search", auth=TOKEN, error_body=ERROR_BODY,
          body=SearchBody, errors=[ScimBadRequest],
          replies=[Reply(200, "A page of the organization's groups.", ListReply,
                         content_type=SCIM_JSON, envelope=False)])
async def post_scim_groups_search(call: Call) -> web.Response:
    """The groups listing with its query as a body (RFC 7644 3.4.3)."""
    query = service.search_query(await _payload(call))
    listed = await service.list_groups(call.pool, _scim(call), query=query, settings=call.settings)
    return scim_reply(call.request, listed.body)


@endpoint(routes, "GET", _GROUP, auth=TOKEN, error_body=ERROR_BODY, errors=[ScimBadRequest, ScimNotFound],
          replies=[Reply(200, "The group.", GroupReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def get_scim_group(call: Call, query: ResourceQuery) -> web.Response:
    """A group of the organization."""
    shown = await service.find_group(call.pool, _scim(call), call.path("group_id"), query=query,
                                     settings=call.settings)
    return _shown(call.request, shown)


@endpoint(routes, "PUT", _GROUP, auth=TOKEN, error_body=ERROR_BODY, body=GroupBody, headers=_IF_MATCH,
          errors=[ScimBadRequest, ScimConflict, ScimNotFound, ScimPreconditionFailed],
          replies=[Reply(200, "The group.", GroupReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def put_scim_group(call: Call) -> web.Response:
    """Replace the group: its name and its whole member list."""
    payload = await _payload(call)
    async with call.connection() as conn:
        shown = await service.replace_group(
            conn, call.actor, _scim(call), group_id=call.path("group_id"), payload=payload,
            if_match=call.request.headers.get("If-Match"), settings=call.settings)
    return _shown(call.request, shown)


@endpoint(routes, "PATCH", _GROUP, auth=TOKEN, error_body=ERROR_BODY, body=PatchBody, headers=_IF_MATCH,
          errors=[ScimBadRequest, ScimConflict, ScimNotFound, ScimPreconditionFailed],
          replies=[Reply(200, "The group.", GroupReply, content_type=SCIM_JSON, envelope=False,
                         headers=_RESOURCE_HEADERS)])
async def patch_scim_group(call: Call) -> web.Response:
    """Change the group by RFC 7644 PATCH operations: members added, removed (``path``
    ``members[value eq "user_..."]``, or Entra's remove with a ``value`` list) or replaced, the
    name replaced."""
    payload = await _payload(call)
    async with call.connection() as conn:
        shown = await service.amend_group(
            conn, call.actor, _scim(call), group_id=call.path("group_id"), payload=payload,
            if_match=call.request.headers.get("If-Match"), settings=call.settings)
    return _shown(call.request, shown)


@endpoint(routes, "DELETE", _GROUP, auth=TOKEN, error_body=ERROR_BODY, headers=_IF_MATCH,
          errors=[ScimNotFound, ScimPreconditionFailed],
          replies=[Reply(204, "Deleted.", content_type=None)])
async def delete_scim_group(call: Call) -> web.Response:
    """Delete the group; its members' tuples are deleted with it."""
    async with call.connection() as conn:
        await service.remove_group(conn, call.actor, _scim(call), group_id=call.path("group_id"),
                                   if_match=call.request.headers.get("If-Match"),
                                   settings=call.settings)
    return web.Response(status=204, headers={"X-Request-Id": call.request[REQUEST_ID]})

