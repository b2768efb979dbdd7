"""SCIM 2.0 rules (RFC 7643/7644; issue 23; DESIGN.md "admin portal, SCIM, recovery,
operators"; events ``scim.user.synced``, ``scim.group.synced``, ``scim.token.created``).

* :func:`mint_token`: the organization's one SCIM token (``scim_`` + 32 random bytes), replacing
  the previous one in the same statement, so the previous one stops at once. Kept as its
  SHA-256 (what :func:`authenticate` looks up, every request) and envelope-encrypted (SPEC.md 1).
* Users. The organization's SCIM view is its members: a user is in it while it has a membership
  there; its SCIM ``id`` is its ``user_`` id. :func:`provision_user` finds the project's user
  with the resource's primary e-mail address (else its first; ``emails`` is required) or creates
  it (an enrollment link, as for ``POST /v1/users``), makes it a member, and keeps what the
  directory said (``userName`` as given, ``externalId``, the other attributes). ``active:
  false`` suspends the membership and revokes every session of the user (at the edge too, as
  any revocation); ``true`` makes it active again. :func:`deprovision_user` removes the
  membership (the user stays, for its other organizations) and revokes the sessions; the user
  is then not found in the view. A changed e-mail address or display name changes the user.
* Groups are the organization's directory groups, with members from its view. When the
  organization's token names a store, a member ``u`` of group ``g`` whose membership is active
  is the tuple ``group:g#member@user:u`` there, written through the store's change log in the
  same transaction as the change, so a directory group grants what the store's model gives
  ``group:g#member`` and the engine checks it (a suspended member's tuples are deleted, and
  written again when it is active again). That holds however the membership changes: a status
  change, a removal, the organization's or the user's deletion through the management API are
  followed too (:func:`follow_memberships`, registered at app setup: ``organizations`` tells its
  listeners in the change's transaction, and cannot import this module).
* PATCH (RFC 7644 3.5.2) is scim2-models' ``PatchOp.patch`` on the resource as the service
  shows it, under ``schemas.POLICY``; the outcome is then stored like a PUT's.
* Versions: a resource's ``meta.version`` is a weak ETag of what the service shows of it;
  ``If-Match`` on a change must name it (``ScimPreconditionFailed`` otherwise).

Every change records ``scim.user.synced`` or ``scim.group.synced`` (metadata ``change``:
``created``, ``updated``, ``deactivated``, ``reactivated`` or ``deleted``, and the attributes
that changed) in its own transaction, with what the change implies (``user.created``,
``membership.*``, ``authz.tuples.written``), all attributed to the token (actor type ``scim``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import asyncpg
import orjson
from pydantic import TypeAdapter, ValidationError
from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    Context,
    Error,
    ETag,
    Filter,
    Group,
    Patch,
    PatchOp,
    ResourceType,
    ResponseParameters,
    SCIMException,
    SearchRequest,
    ServiceProviderConfig,
    Sort,
)
from scim2_models.path import resolution as _resolution

from common.auth import token_digest
from common.db import Params
from common.errors import (
    AlreadyAMember,
    EmailInUse,
    OrganizationNotFound,
    ScimBadRequest,
    ScimConflict,
    ScimNotFound,
    ScimPreconditionFailed,
    ScimUnauthorized,
)
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.authz import service as authz
from control_plane.authz.schemas import WriteBody
from control_plane.kms import LocalKms
from control_plane.organizations import service as organizations
from control_plane.organizations.schemas import MembershipChange, UpdateMembership
from control_plane.scim import filters, repository
from control_plane.scim.schemas import (
    ENTERPRISE_URN,
    GROUP_URN,
    LIST_URN,
    MAX_COUNT,
    MAX_TEXT,
    PATCH_URN,
    POLICY,
    SEARCH_URN,
    USER_URN,
    ListQuery,
    MintBody,
    MintedToken,
    ResourceQuery,
    ScimCaller,
    UserResource,
)
from control_plane.sessions import service as sessions
from control_plane.users import service as users
from control_plane.users.schemas import USER_FIELDS, CreateUser, UpdateUser, User
from control_plane.web.actor import Actor

TOKEN_PREFIX: Final = "scim_"
BASE_PATH: Final = "/scim/v2"
DEFAULT_COUNT: Final = 100
MEMBER_ROLE: Final = "member"
"""The role of a membership the directory makes (the directory's groups carry permissions)."""
TUPLES_PER_WRITE: Final = 1000
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _type_adapter(annotated_type: Any) -> TypeAdapter[Any]:
    """pydantic's ``TypeAdapter`` of ``annotated_type``, built once per type. scim2-models
    builds one (a core schema generated anew) each time a PATCH path's filter compares a
    value of a typed attribute (``emails[type eq "work"]``: the ``type`` enumeration), a
    fifth of the time of applying Entra's PATCH; an adapter is immutable and reusable."""
    try:
        adapter = _ADAPTERS.get(annotated_type)
    except TypeError:  # an unhashable annotation: built each time, as the library does
        return TypeAdapter(annotated_type)
    if adapter is None:
        adapter = _ADAPTERS[annotated_type] = TypeAdapter(annotated_type)
    return adapter


_ADAPTERS: Final[dict[Any, TypeAdapter[Any]]] = {}
_resolution.TypeAdapter = _type_adapter  # type: ignore[attr-defined,assignment]


def base_url(settings: Settings) -> str:
    """Where the organization's directory sends its requests."""
    return settings.public_base_url.rstrip("/") + BASE_PATH


def _aad(token_id: str) -> bytes:
    return b"scim_token:" + token_id.encode()


# --- tokens ------------------------------------------------------------------------------------


async def mint_token(conn: asyncpg.Connection, actor: Actor, *, org_id: str, body: MintBody,
                     kms: LocalKms, settings: Settings) -> MintedToken:
    """A new token for the organization, replacing its previous one (``scim.token.created``).
    Raises OrganizationNotFound, StoreNotFound (``body.store_id`` is no store of the project)."""
    project_id = actor.project_id
    assert project_id is not None
    keep = "store_id" not in body.model_fields_set
    async with conn.transaction():
        await organizations.find_organization(conn, project_id, org_id, for_update=True)
        if not keep and body.store_id is not None:
            await authz.find_store(conn, project_id, body.store_id)
        token, token_id = TOKEN_PREFIX + secrets.token_urlsafe(32), new_id("sct")
        store_id = await repository.put_token(
            conn, token_id=token_id, org_id=org_id, project_id=project_id,
            token_hash=token_digest(token), sealed=kms.seal(token.encode(), _aad(token_id)),
            store_id=body.store_id, keep_store=keep)
        await audit.record(
            conn, actor, action="scim.token.created", target_type="organization",
            target_id=org_id, description=f"Minted the SCIM token of organization {org_id}",
            metadata={"organization_id": org_id, "token_id": token_id, "store_id": store_id})
    return MintedToken(token=token, base_url=base_url(settings), store_id=store_id)


async def authenticate(pool: asyncpg.Pool, authorization: str | None) -> ScimCaller:
    """The caller of ``authorization`` (``Bearer scim_...``). Raises ScimUnauthorized for none,
    or a token that is not an organization's current one."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
        raise ScimUnauthorized(headers={"WWW-Authenticate": 'Bearer realm="scim"'})
    row = await repository.caller(pool, token_digest(token))
    if row is None:
        raise ScimUnauthorized("The SCIM token is unknown or was replaced by a newer one.",
                               headers={"WWW-Authenticate": 'Bearer realm="scim", '
                                                            'error="invalid_token"'})
    return ScimCaller(row["id"], row["organization_id"], row["project_id"], row["project_name"],
                      row["store_id"])


# --- reading requests --------------------------------------------------------------------------


def _problem(exc: SCIMException | ValidationError) -> ScimBadRequest | ScimConflict:
    """The refusal of a payload scim2-models refused."""
    if isinstance(exc, ValidationError):
        errors = Error.from_validation_errors(exc)
        error = errors[0] if errors else Error(status=400, detail=str(exc))
    else:
        error = exc.to_error()
    detail = error.detail or "The request is not valid."
    if error.status == 409:
        return ScimConflict(detail, scim_type=error.scim_type or "uniqueness")
    return ScimBadRequest(detail, scim_type=error.scim_type or "invalidValue")


def _read(model: Any, payload: Mapping[str, Any], context: Context) -> Any:
    try:
        return model.model_validate(payload, scim_ctx=context, scim_policy=POLICY)
    except (ValidationError, SCIMException) as exc:
        raise _problem(exc) from None


def _schemas_of(payload: Mapping[str, Any], urn: str) -> None:
    """Refuse a message whose ``schemas``, when given, do not name ``urn`` (RFC 7643 3)."""
    schemas = payload.get("schemas", [urn])
    if not isinstance(schemas, list) or urn not in schemas:
        raise ScimBadRequest(f"schemas must contain {urn}", scim_type="invalidSyntax")


def _booleans(payload: Any) -> Any:
    """``payload`` with ``active`` and ``primary`` given as the strings ``"True"``/``"False"``
    (Microsoft Entra ID) read as booleans; another value than a boolean, null or those strings
    is refused (not read as pydantic would, ``1`` or ``"yes"`` as true)."""
    if isinstance(payload, dict):
        out = {}
        for key, value in payload.items():
            if key.lower() in ("active", "primary") and value is not None \
                    and not isinstance(value, bool):
                if value not in ("True", "False", "true", "false"):
                    raise ScimBadRequest(f"{key} must be a boolean", scim_type="invalidValue")
                value = value.lower() == "true"
            out[key] = _booleans(value)
        return out
    if isinstance(payload, list):
        return [_booleans(item) for item in payload]
    return payload


def _text(name: str, value: str | None, *, required: bool = False) -> str | None:
    if value is None or value == "":
        if required:
            raise ScimBadRequest(f"{name} is required", scim_type="invalidValue")
        return None
    if len(value) > MAX_TEXT:
        raise ScimBadRequest(f"{name} is longer than {MAX_TEXT} characters",
                             scim_type="invalidValue")
    return value


def _patching(model: Any, payload: Mapping[str, Any]) -> Callable[[Any], Any]:
    """The change a PATCH makes: ``payload`` read as a PatchOp of ``model`` now (ScimBadRequest
    when it is not one), applied to the resource it is given. Raises ScimBadRequest,
    ScimConflict when applied."""
    patch = read_patch(model, payload)

    def apply(current: Any) -> Any:
        try:
            patch.patch(current, scim_policy=POLICY)
        except (ValidationError, SCIMException) as exc:
            raise _problem(exc) from None
        return current
    return apply


def _removals(payload: Any) -> Any:
    """``payload`` with the values of each remove that lists them (Entra's ``{"op": "Remove",
    "path": "members", "value": [{"$ref": null, "value": "..."}]}``) reduced to their ``value``,
    which identifies them: the other sub-attributes Entra sends along (a null ``$ref``) would
    select nothing."""
    if not isinstance(payload, dict) or not isinstance(payload.get("Operations"), list):
        return payload
    operations = []
    for operation in payload["Operations"]:
        if (isinstance(operation, dict) and str(operation.get("op", "")).lower() == "remove"
                and isinstance(operation.get("value"), list)):
            operation = {**operation, "value": [
                {"value": v["value"]} if isinstance(v, dict) and "value" in v else v
                for v in operation["value"]]}
        operations.append(operation)
    return {**payload, "Operations": operations}


def read_patch(model: Any, payload: Mapping[str, Any]) -> Any:
    """The ``PatchOp`` of ``payload`` for ``model``. Raises ScimBadRequest."""
    _schemas_of(payload, PATCH_URN)
    return _read(PatchOp[model], _removals(_booleans(payload)), Context.RESOURCE_PATCH_REQUEST)


def _attributes(query: ListQuery | ResourceQuery, model: Any) -> ResponseParameters[Any] | None:
    def split(text: str | None) -> list[str] | None:
        names = [n.strip() for n in (text or "").split(",") if n.strip()]
        return names or None

    attributes, excluded = split(query.attributes), split(query.excluded_attributes)
    if attributes is None and excluded is None:
        return None
    try:
        return ResponseParameters[model].model_validate(
            {"attributes": attributes, "excludedAttributes": excluded})
    except (ValidationError, SCIMException) as exc:
        raise _problem(exc) from None


def search_query(payload: Mapping[str, Any]) -> ListQuery:
    """The listing's query of an RFC 7644 3.4.3 ``SearchRequest`` body. Raises
    ScimBadRequest."""
    _schemas_of(payload, SEARCH_URN)
    request = _read(SearchRequest, payload, Context.SEARCH_REQUEST)
    start = None if request.start_index is None else min(max(request.start_index, 1), 10**9 - 1)
    count = None if request.count is None else min(max(request.count, 0), MAX_COUNT)
    values = {"filter": request.filter, "sortBy": request.sort_by,
              "startIndex": start, "count": count,
              "attributes": ",".join(map(str, request.attributes or [])) or None,
              "excludedAttributes": ",".join(map(str, request.excluded_attributes or [])) or None}
    # The body was read by the library already: its values need no second reading (and a
    # filter in a body has no query string's length limit).
    return ListQuery.model_construct(
        filter=values["filter"], sort_by=values["sortBy"], attributes=values["attributes"],
        excluded_attributes=values["excludedAttributes"],
        start_index=None if start is None else str(start),
        count=None if count is None else str(count))


def _version(shown: Mapping[str, Any]) -> str:
    return 'W/"' + hashlib.sha256(orjson.dumps(shown, option=orjson.OPT_SORT_KEYS)).hexdigest()[:20] + '"'


def _check_version(current: str, if_match: str | None) -> None:
    if if_match is None or if_match.strip() == "*":
        return
    wanted = [v.strip() for v in if_match.split(",")]
    strong = current.removeprefix("W/")
    if current not in wanted and strong not in wanted:
        raise ScimPreconditionFailed(details={"version": current})


def _page(query: ListQuery) -> tuple[int, int]:
    """``(startIndex, count)`` of the query: below 1 counts as 1 and 0 (RFC 7644 3.4.2.4)."""
    start = max(1, int(query.start_index)) if query.start_index is not None else 1
    count = DEFAULT_COUNT if query.count is None else max(0, min(MAX_COUNT, int(query.count)))
    return start, count


def _filter(view: filters.View, expression: str | None, p: Params) -> str:
    if expression is None or not expression.strip():
        return "true"
    try:
        return filters.condition(view, expression, p)
    except (ValidationError, SCIMException, ValueError) as exc:
        detail = exc.to_error().detail if isinstance(exc, SCIMException) else str(exc)
        raise ScimBadRequest(f"The filter is not valid: {detail}", scim_type="invalidFilter") from None


@dataclass(frozen=True, slots=True)
class Shown:
    """A resource as answered: its JSON, its version (``ETag``) and its location."""

    body: dict[str, Any]
    version: str
    location: str


@dataclass(frozen=True, slots=True)
class Listed:
    """A ``ListResponse``."""

    body: dict[str, Any]


# --- users -------------------------------------------------------------------------------------

USER_VIEW: Final = filters.View(
    model=UserResource, doc=repository.USER_DOC,
    columns={"id": filters.Column("m.user_id", "text_exact"),
             "active": filters.Column("(m.status = 'active')", "boolean"),
             "meta.created": filters.Column("m.created_at", "timestamptz"),
             "meta.lastmodified": filters.Column(
                 "greatest(m.updated_at, u.updated_at, s.updated_at)", "timestamptz"),
             "meta.resourcetype": filters.Column("'User'::text", "text_exact")})


def _user_json(row: Mapping[str, Any], base: str) -> dict[str, Any]:
    """The member as SCIM shows it (every attribute)."""
    doc = dict(row["doc"])
    for key in ("id", "meta"):
        doc.pop(key, None)
    schemas = doc.pop("schemas", None) or [USER_URN]
    if ENTERPRISE_URN in doc and ENTERPRISE_URN not in schemas:
        schemas = [*schemas, ENTERPRISE_URN]
    # ``active`` is the membership's; shown unless the directory removed it (a member it never
    # named shows it).
    shown_active = doc.pop("active", None) is not None or not row["synced"]
    body = {"schemas": schemas, "id": row["id"], **doc}
    if shown_active:
        body["active"] = row["status"] == "active"
    location = f"{base}/Users/{row['id']}"
    body["meta"] = {"resourceType": "User", "created": _time(row["created_at"]),
                    "lastModified": _time(row["updated_at"]), "location": location}
    body["meta"]["version"] = _version({k: v for k, v in body.items() if k != "meta"})
    return body


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _shown(model: Any, body: dict[str, Any], parameters: ResponseParameters[Any] | None,
           context: Context) -> Shown:
    meta = body["meta"]
    if parameters is not None:
        resource = model.model_validate(body, scim_policy=POLICY)
        body = resource.model_dump(scim_ctx=context, response_parameters=parameters,
                                   scim_policy=POLICY)
    return Shown(body, meta["version"], meta["location"])


async def find_user(pool: asyncpg.Pool, caller: ScimCaller, user_id: str, *, query: ResourceQuery,
                    settings: Settings) -> Shown:
    """The member ``user_id``. Raises ScimNotFound."""
    row = await repository.find_user(pool, caller.organization_id, user_id) \
        if is_id(user_id, "user") else None
    if row is None:
        raise ScimNotFound()
    return _shown(UserResource, _user_json(row, base_url(settings)),
                  _attributes(query, UserResource), Context.RESOURCE_QUERY_RESPONSE)


async def list_users(pool: asyncpg.Pool, caller: ScimCaller, *, query: ListQuery,
                     settings: Settings) -> Listed:
    """A page of the organization's view, in membership order. Raises ScimBadRequest
    (``invalidFilter``, ``invalidValue``)."""
    parameters = _attributes(query, UserResource)
    start, count = _page(query)
    p = Params()
    where = f"m.organization_id = {p(caller.organization_id)} AND {_filter(USER_VIEW, query.filter, p)}"
    total, rows = await repository.list_rows(
        pool, columns=repository.USER_COLUMNS, table=repository.USER_FROM, where=where, params=p,
        order="m.id", offset=start - 1, limit=count)
    base = base_url(settings)
    return _listed(total, start, [
        _shown(UserResource, _user_json(row, base), parameters,
               Context.RESOURCE_QUERY_RESPONSE).body for row in rows])


def _listed(total: int, start: int, resources: list[dict[str, Any]]) -> Listed:
    return Listed({"schemas": [LIST_URN], "totalResults": total, "startIndex": start,
                   "itemsPerPage": len(resources), "Resources": resources})


def _primary_email(resource: Any) -> str:
    if any(not e.value for e in resource.emails or []):
        raise ScimBadRequest("each of emails needs a value", scim_type="invalidValue")
    emails = list(resource.emails or [])
    if not emails:
        raise ScimBadRequest("emails is required: the primary address (else the first) is the "
                             "user's e-mail address", scim_type="invalidValue")
    primary = next((e for e in emails if e.primary), emails[0])
    return str(primary.value)


def _display_name(resource: Any) -> str:
    """The user's name from the resource: ``displayName``, else ``name.formatted``, else the
    given and family names; control characters dropped, at most 200 characters."""
    name = resource.display_name or (resource.name.formatted if resource.name else None)
    if not name and resource.name is not None:
        name = " ".join(p for p in (resource.name.given_name, resource.name.family_name) if p)
    return _CONTROL_RE.sub("", name or "").strip()[:200]


def _stored(resource: Any) -> dict[str, Any]:
    """What is kept of a User resource: all but ``id``, ``meta`` and ``password``; of
    ``active``, whether the directory gave it (``true`` when it did: the value is the
    membership's status)."""
    doc: dict[str, Any] = resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE,
                                              scim_policy=POLICY)
    for key in ("id", "meta", "password"):
        doc.pop(key, None)
    if "active" in doc:
        doc["active"] = True
    return doc


async def _put_user(conn: asyncpg.Connection, caller: ScimCaller, user_id: str,
                    resource: Any, stored: dict[str, Any]) -> None:
    """Keep ``stored`` (``_stored(resource)``) as what the directory said of the member, in the
    caller's transaction (a conflict ends it: no savepoint, which would cost two round trips
    on every write)."""
    user_name = _text("userName", resource.user_name, required=True)
    assert user_name is not None
    try:
        await repository.put_user(
            conn, org_id=caller.organization_id, user_id=user_id, user_name=user_name,
            external_id=_text("externalId", resource.external_id), resource=stored)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == repository.USER_NAME_INDEX:
            raise ScimConflict(f"Another user of this organization has the userName "
                               f"{user_name!r}.", scim_type="uniqueness") from None
        raise


async def _set_active(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                      user_id: str, membership_id: str, active: bool) -> int:
    """Activate or suspend the membership (its group tuples follow: :func:`_membership_changed`);
    suspending revokes every session of the user. Returns how many sessions were revoked."""
    await organizations.update_membership(
        conn, actor, org_id=caller.organization_id, membership_id=membership_id,
        body=UpdateMembership(status="active" if active else "suspended"))
    if active:
        return 0
    return await sessions.revoke_user_sessions(conn, user_id=user_id, reason="scim_deactivated")


async def provision_user(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                         payload: Mapping[str, Any], kms: LocalKms, settings: Settings,
                         outbox: asyncio.Event) -> Shown:
    """Make the resource's user (found by its e-mail address, else created) a member of the
    organization, as the directory describes it (module docstring). Raises ScimBadRequest,
    ScimConflict (the user is in the view already, or the ``userName`` is taken)."""
    _schemas_of(payload, USER_URN)
    resource = _read(UserResource, _booleans(payload), Context.RESOURCE_CREATION_REQUEST)
    _text("userName", resource.user_name, required=True)
    email = _primary_email(resource)
    try:
        body = CreateUser.model_validate({"email": email, "name": _display_name(resource)})
    except ValidationError:
        raise ScimBadRequest(f"{email!r} is not a valid e-mail address",
                             scim_type="invalidValue") from None
    org_id, woken = caller.organization_id, asyncio.Event()
    stored = _stored(resource)
    if resource.active is not False:
        row = await _provision_new(conn, actor, caller, resource, body, stored, kms=kms,
                                   settings=settings)
        if row is not None:
            outbox.set()  # the enrollment message committed: this process's worker sends it
            return _shown(UserResource, _user_json(row, base_url(settings)), None,
                          Context.RESOURCE_CREATION_RESPONSE)
    async with conn.transaction():
        user = await users.create_user(conn, actor, body=body, kms=kms, settings=settings,
                                       outbox=woken, project_name=caller.project_name)
        created = user.created
        try:
            membership = await organizations.add_membership(
                conn, actor, org_id=org_id, user_id=user.id, role=MEMBER_ROLE)
            membership_id, status = membership.id, membership.status
        except AlreadyAMember:
            row = await repository.find_user(conn, org_id, user.id, lock=True)
            assert row is not None
            if row["synced"]:
                raise ScimConflict(f"The user with the e-mail address {body.email!r} is in this "
                                   "organization's directory already.",
                                   scim_type="uniqueness") from None
            membership_id, status = row["membership_id"], row["status"]  # adopted
        await _put_user(conn, caller, user.id, resource, stored)
        revoked = 0
        if resource.active is not None and resource.active != (status == "active"):
            revoked = await _set_active(conn, actor, caller, user_id=user.id,
                                        membership_id=membership_id, active=resource.active)
        row = await repository.find_user(conn, org_id, user.id)
        assert row is not None
        await _user_event(conn, actor, caller, user.id, change="created",
                          fields=sorted(stored), user_created=created,
                          sessions_revoked=revoked)
    if woken.is_set():
        outbox.set()  # the enrollment message committed: this process's outbox worker sends it
    return _shown(UserResource, _user_json(row, base_url(settings)), None,
                  Context.RESOURCE_CREATION_RESPONSE)


async def _provision_new(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller,
                         resource: Any, body: CreateUser, stored: dict[str, Any], *,
                         kms: LocalKms, settings: Settings) -> Mapping[str, Any] | None:
    """The common case of :func:`provision_user`, a user new to the project, in one statement
    (``repository.PROVISION``): the member's row of the view, or None (nothing written) when the
    e-mail address is an existing user's. Raises ScimConflict (the ``userName`` is another
    member's), OrganizationNotFound (the organization was deleted meanwhile)."""
    user_name = _text("userName", resource.user_name, required=True)
    user_id, org_id = new_id("user"), caller.organization_id
    values = {
        **users.create_params(actor, user_id=user_id, body=body, kms=kms, settings=settings,
                              project_name=caller.project_name),
        **organizations.membership_params(actor, org_id=org_id, user_id=user_id,
                                          role=MEMBER_ROLE),
        "user_name": user_name, "external_id": _text("externalId", resource.external_id),
        "resource": stored,
        **audit.event_params(
            actor, name="scim_event", **_user_event_values(
                caller, user_id, change="created", fields=sorted(stored), user_created=True,
                sessions_revoked=0)),
    }
    try:
        return await repository.provision(conn, values)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == repository.USER_NAME_INDEX:
            raise ScimConflict(f"Another user of this organization has the userName "
                               f"{user_name!r}.", scim_type="uniqueness") from None
        raise
    except asyncpg.ForeignKeyViolationError:
        raise OrganizationNotFound() from None


def _user_event_values(caller: ScimCaller, user_id: str, *, change: str, fields: list[str],
                       **extra: Any) -> dict[str, Any]:
    """``scim.user.synced``'s values (``audit.record``'s keywords)."""
    return {"action": "scim.user.synced", "target_type": "user", "target_id": user_id,
            "user_id": user_id,
            "description": f"SCIM {change} user {user_id} in organization "
                           f"{caller.organization_id}",
            "metadata": {"organization_id": caller.organization_id, "change": change,
                         "fields": fields, **extra}}


async def _user_event(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, user_id: str,
                      *, change: str, fields: list[str], **extra: Any) -> None:
    await audit.record(conn, actor, **_user_event_values(caller, user_id, change=change,
                                                         fields=fields, **extra))


async def _locked_user(conn: asyncpg.Connection, caller: ScimCaller, user_id: str,
                       base: str, if_match: str | None) -> tuple[asyncpg.Record, dict[str, Any]]:
    row = await repository.find_user(conn, caller.organization_id, user_id, lock=True) \
        if is_id(user_id, "user") else None
    if row is None:
        raise ScimNotFound()
    shown = _user_json(row, base)
    _check_version(shown["meta"]["version"], if_match)
    return row, shown


async def replace_user(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                       user_id: str, payload: Mapping[str, Any], if_match: str | None,
                       settings: Settings) -> Shown:
    """PUT: the member as the resource describes it. Raises ScimNotFound, ScimBadRequest,
    ScimConflict, ScimPreconditionFailed."""
    _schemas_of(payload, USER_URN)
    resource = _read(UserResource, _booleans(payload), Context.RESOURCE_REPLACEMENT_REQUEST)
    return await _change_user(conn, actor, caller, user_id=user_id, if_match=if_match,
                              settings=settings, change=lambda _: resource)


async def amend_user(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                     user_id: str, payload: Mapping[str, Any], if_match: str | None,
                     settings: Settings) -> Shown:
    """PATCH (RFC 7644 3.5.2) of the member. Raises ScimNotFound, ScimBadRequest, ScimConflict,
    ScimPreconditionFailed."""
    return await _change_user(conn, actor, caller, user_id=user_id, if_match=if_match,
                              settings=settings, change=_patching(UserResource, payload))


async def _change_user(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                       user_id: str, if_match: str | None, settings: Settings,
                       change: Any) -> Shown:
    base = base_url(settings)
    async with conn.transaction():
        row = await repository.lock_user(conn, caller.organization_id, user_id) \
            if is_id(user_id, "user") else None
        if row is None:
            raise ScimNotFound()
        shown = _user_json(row, base)
        _check_version(shown["meta"]["version"], if_match)
        current = UserResource.model_validate(shown, scim_policy=POLICY)
        before = _stored(current)
        wanted = change(current)  # a PATCH changes ``current`` itself
        after = _stored(wanted)
        fields = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        email = _primary_email(wanted)
        updates: dict[str, Any] = {}
        if email.lower() != (row["email"] or "").lower():
            updates["email"] = email
        name = _display_name(wanted)
        if fields and name != row["name"] and ("displayName" in fields or "name" in fields):
            updates["name"] = name
        active = row["status"] == "active"
        if wanted.active is not None and wanted.active != active:
            return await _change_membership(conn, actor, caller, row, wanted, after, fields,
                                            updates, base)
        try:
            body = UpdateUser.model_validate(updates) if updates else None
        except ValidationError:
            raise ScimBadRequest(f"{email!r} is not a valid e-mail address",
                                 scim_type="invalidValue") from None
        user_changes = {} if body is None else users.update_changes(
            User(**{f: row["user_" + f] for f in USER_FIELDS}), body)
        put = bool(fields) or not row["synced"]
        if not user_changes and not put:
            return _shown(UserResource, shown, None, Context.RESOURCE_REPLACEMENT_RESPONSE)
        values: dict[str, Any] = {}
        if user_changes:
            values.update(users.update_params(actor, user_id=user_id, changes=user_changes))
        if put:
            user_name = _text("userName", wanted.user_name, required=True)
            values.update(org_id=caller.organization_id, scim_user_id=user_id,
                          user_name=user_name, resource=after,
                          external_id=_text("externalId", wanted.external_id))
        if fields:
            values.update(audit.event_params(actor, name="scim_event", **_user_event_values(
                caller, user_id, change="updated", fields=fields,
                **({"sessions_revoked": 0} if not active else {}))))
        try:
            written = await repository.write_user(
                conn, user_changes=list(user_changes), put=put, event=bool(fields),
                values=values)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == repository.USER_NAME_INDEX:
                raise ScimConflict(f"Another user of this organization has the userName "
                                   f"{values['user_name']!r}.", scim_type="uniqueness") from None
            if isinstance(users.unique_violation(exc), EmailInUse):
                raise ScimConflict(f"Another user of the project has the e-mail address "
                                   f"{email!r}.", scim_type="uniqueness") from None
            raise
    # The member as the statement left it: what it stored (or had), its latest change.
    return _shown(UserResource, _user_json(
        {**dict(row), "synced": True, "doc": written["doc"] if put else row["doc"],
         "updated_at": max(row["updated_at"], written["updated_at"])}, base), None,
        Context.RESOURCE_REPLACEMENT_RESPONSE)


async def _change_membership(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller,
                             row: asyncpg.Record, wanted: Any, after: dict[str, Any],
                             fields: list[str], updates: dict[str, Any], base: str) -> Shown:
    """The rest of :func:`_change_user` for a change that activates or suspends the membership
    (rare: step by step, in its transaction, then read back)."""
    user_id = row["id"]
    email = updates.get("email")
    if updates:
        try:
            await users.update_user(conn, actor, user_id=user_id,
                                    body=UpdateUser.model_validate(updates))
        except ValidationError:
            raise ScimBadRequest(f"{email!r} is not a valid e-mail address",
                                 scim_type="invalidValue") from None
        except EmailInUse:
            raise ScimConflict(f"Another user of the project has the e-mail address "
                               f"{email!r}.", scim_type="uniqueness") from None
    if fields or not row["synced"]:
        await _put_user(conn, caller, user_id, wanted, after)
    active = row["status"] == "active"
    revoked = await _set_active(conn, actor, caller, user_id=user_id,
                                membership_id=row["membership_id"], active=wanted.active)
    await _user_event(conn, actor, caller, user_id,
                      change="reactivated" if wanted.active else "deactivated",
                      fields=sorted({*fields, "active"}),
                      **({"sessions_revoked": revoked} if not active or revoked else {}))
    found = await repository.find_user(conn, caller.organization_id, user_id)
    assert found is not None
    return _shown(UserResource, _user_json(found, base), None,
                  Context.RESOURCE_REPLACEMENT_RESPONSE)


async def deprovision_user(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                           user_id: str, if_match: str | None, settings: Settings) -> None:
    """DELETE: the membership goes (and with it the user's place in the organization's groups,
    and their tuples: :func:`_membership_changed`), every session of the user is revoked; the user stays. Raises
    ScimNotFound, ScimPreconditionFailed."""
    org_id = caller.organization_id
    async with conn.transaction():
        row, _ = await _locked_user(conn, caller, user_id, base_url(settings), if_match)
        groups = await repository.groups_of(conn, org_id, user_id)
        revoked = await sessions.revoke_user_sessions(conn, user_id=user_id,
                                                      reason="scim_deprovisioned")
        await organizations.remove_membership(conn, actor, org_id=org_id,
                                              membership_id=row["membership_id"])
        await _user_event(conn, actor, caller, user_id, change="deleted", fields=[],
                          sessions_revoked=revoked, groups_left=groups)


# --- groups ------------------------------------------------------------------------------------

GROUP_VIEW: Final = filters.View(
    model=Group, doc=repository.GROUP_DOC,
    columns={"id": filters.Column("g.id", "text_exact"),
             "meta.created": filters.Column("g.created_at", "timestamptz"),
             "meta.lastmodified": filters.Column("g.updated_at", "timestamptz"),
             "meta.resourcetype": filters.Column("'Group'::text", "text_exact")},
    arrays={"members": repository.GROUP_MEMBERS})


def _group_json(row: Mapping[str, Any], base: str) -> dict[str, Any]:
    body: dict[str, Any] = {"schemas": [GROUP_URN], "id": row["id"],
                            "displayName": row["display_name"]}
    if row["external_id"] is not None:
        body["externalId"] = row["external_id"]
    if row["members"] is not None:
        body["members"] = [{**m, "$ref": f"{base}/Users/{m['value']}"} for m in row["members"]]
    location = f"{base}/Groups/{row['id']}"
    body["meta"] = {"resourceType": "Group", "created": _time(row["created_at"]),
                    "lastModified": _time(row["updated_at"]), "location": location}
    versioned = {k: v for k, v in body.items() if k != "meta"}
    versioned["members"] = sorted(m["value"] for m in body.get("members", []))
    body["meta"]["version"] = _version(versioned)
    return body


def _wants_members(parameters: ResponseParameters[Any] | None) -> bool:
    if parameters is None:
        return True
    excluded = [str(p).lower() for p in parameters.excluded_attributes or []]
    attributes = [str(p).lower() for p in parameters.attributes or []]
    if any(a == "members" or a.endswith(":members") for a in excluded):
        return False
    return not attributes or any("members" in a for a in attributes)


async def find_group(pool: asyncpg.Pool, caller: ScimCaller, group_id: str, *,
                     query: ResourceQuery, settings: Settings) -> Shown:
    """The group. Raises ScimNotFound."""
    parameters = _attributes(query, Group)
    row = await repository.find_group(pool, caller.organization_id, group_id,
                                      members=_wants_members(parameters)) \
        if is_id(group_id, "grp") else None
    if row is None:
        raise ScimNotFound()
    return _shown(Group, _group_json(row, base_url(settings)), parameters,
                  Context.RESOURCE_QUERY_RESPONSE)


async def list_groups(pool: asyncpg.Pool, caller: ScimCaller, *, query: ListQuery,
                      settings: Settings) -> Listed:
    """A page of the organization's groups, in creation order. Raises ScimBadRequest."""
    parameters = _attributes(query, Group)
    start, count = _page(query)
    p = Params()
    where = f"g.organization_id = {p(caller.organization_id)} AND {_filter(GROUP_VIEW, query.filter, p)}"
    total, rows = await repository.list_rows(
        pool, columns=repository.group_columns(members=_wants_members(parameters)),
        table="scim_groups g", where=where, params=p, order="g.id", offset=start - 1,
        limit=count)
    base = base_url(settings)
    return _listed(total, start, [
        _shown(Group, _group_json(row, base), parameters, Context.RESOURCE_QUERY_RESPONSE).body
        for row in rows])


def _members(resource: Any) -> dict[str, str | None]:
    """The group's members (user id to the ``display`` the directory gave, or None)."""
    members: dict[str, str | None] = {}
    for member in resource.members or []:
        if not member.value:
            raise ScimBadRequest("each of members needs a value", scim_type="invalidValue")
        if member.value:
            display = _CONTROL_RE.sub("", member.display)[:MAX_TEXT] if member.display else None
            members[str(member.value)] = display or None
    if len(members) > 10_000:
        raise ScimBadRequest("A group holds at most 10,000 members.", scim_type="tooMany")
    return members


async def _check_members(conn: asyncpg.Connection, caller: ScimCaller,
                         user_ids: Iterable[str]) -> dict[str, str]:
    """The membership status of each of ``user_ids``. Raises ScimBadRequest naming one that is
    not a User of the organization."""
    wanted = list(user_ids)
    known = [u for u in wanted if is_id(u, "user")]
    statuses = await repository.member_statuses(conn, caller.organization_id, known) \
        if known else {}
    missing = [u for u in wanted if u not in statuses]
    if missing:
        raise ScimBadRequest(f"The member {missing[0]!r} is not a User of this organization.",
                             scim_type="invalidValue")
    return statuses


async def _tuples(conn: asyncpg.Connection, actor: Actor, store_id: str | None, *,
                  writes: list[tuple[str, str]], deletes: list[tuple[str, str]]) -> None:
    """Write and delete the tuples ``group:<g>#member@user:<u>`` of the (group, user) pairs in
    the organization's store ``store_id`` (none: nothing to do), 1,000 a revision."""
    if store_id is None or not (writes or deletes):
        return
    items = [("writes", pair) for pair in writes] + [("deletes", pair) for pair in deletes]
    for start in range(0, len(items), TUPLES_PER_WRITE):
        body: dict[str, list[dict[str, str]]] = {"writes": [], "deletes": []}
        for kind, (group_id, user_id) in items[start:start + TUPLES_PER_WRITE]:
            body[kind].append({"object": f"group:{group_id}", "relation": "member",
                               "user": f"user:{user_id}"})
        await authz.write_tuples_in(conn, actor, store_id=store_id,
                                    body=WriteBody.model_validate(body))


async def _membership_changed(conn: asyncpg.Connection, actor: Actor,
                              change: MembershipChange) -> None:
    """The group tuples that follow a membership change however it was made (SCIM, or the
    management API's ``/v1/organizations/.../memberships`` and deletions): a member's tuples
    exist while its membership is active. In the change's transaction; the organization's
    token names the store (none: nothing to do)."""
    org_id = change.organization_id
    store_id = await repository.token_store(conn, org_id)
    if store_id is None:
        return
    if change.user_id is None:  # the organization is being deleted
        # Its groups, then its memberships, locked before the store: the order a SCIM change
        # of a group takes them in (a deadlock otherwise, the deletion cascading to both).
        pairs = await repository.lock_active_members(conn, org_id)
        await _tuples(conn, actor, store_id, writes=[], deletes=pairs)
        return
    was, now = change.before == "active", change.after == "active"
    if was == now:
        return
    pairs = [(g, change.user_id) for g in await repository.groups_of(conn, org_id,
                                                                      change.user_id)]
    await _tuples(conn, actor, store_id, writes=pairs if now else [],
                  deletes=[] if now else pairs)


def follow_memberships() -> None:
    """Keep the directory groups' tuples following membership changes made outside SCIM (app
    setup; once is enough, again changes nothing)."""
    organizations.on_membership_change(_membership_changed)


async def _set_members(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller,
                       group_id: str, before: Mapping[str, str | None],
                       after: Mapping[str, str | None]) -> tuple[list[str], list[str], bool]:
    """Make the group's members ``after`` (from ``before``; user id to ``display``), with their
    tuples. Returns the added, the removed, and whether a kept member's ``display`` changed."""
    added = [u for u in after if u not in before]
    removed = [u for u in before if u not in after]
    renamed = {u: d for u, d in after.items() if u in before and before[u] != d}
    statuses = await _check_members(conn, caller, added)
    await repository.remove_members(conn, group_id, removed)
    await repository.put_members(conn, group_id, caller.organization_id,
                                 {**{u: after[u] for u in added}, **renamed})
    if removed:
        statuses.update(await repository.member_statuses(conn, caller.organization_id, removed))
    await _tuples(conn, actor, caller.store_id,
                  writes=[(group_id, u) for u in added if statuses.get(u) == "active"],
                  deletes=[(group_id, u) for u in removed if statuses.get(u) == "active"])
    return added, removed, bool(renamed)


async def _group_event(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller,
                       group_id: str, *, change: str, fields: list[str], **extra: Any) -> None:
    await audit.record(
        conn, actor, action="scim.group.synced", target_type="scim_group", target_id=group_id,
        description=f"SCIM {change} group {group_id} in organization {caller.organization_id}",
        metadata={"organization_id": caller.organization_id, "change": change,
                  "fields": fields, "store_id": caller.store_id, **extra})


def _group_names(resource: Any) -> tuple[str, str | None]:
    name = _text("displayName", resource.display_name, required=True)
    assert name is not None
    return name, _text("externalId", resource.external_id)


def _display_taken(name: str) -> ScimConflict:
    return ScimConflict(f"Another group of this organization is named {name!r}.",
                        scim_type="uniqueness")


async def create_group(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                       payload: Mapping[str, Any], settings: Settings) -> Shown:
    """A new group with its members (and their tuples). Raises ScimBadRequest, ScimConflict."""
    _schemas_of(payload, GROUP_URN)
    resource = _read(Group, payload, Context.RESOURCE_CREATION_REQUEST)
    name, external_id = _group_names(resource)
    members = _members(resource)
    group_id = new_id("grp")
    async with conn.transaction():
        try:
            await repository.insert_group(
                conn, group_id=group_id, project_id=caller.project_id,
                org_id=caller.organization_id, display_name=name, external_id=external_id)
        except asyncpg.UniqueViolationError:
            raise _display_taken(name) from None
        added, _, _ = await _set_members(conn, actor, caller, group_id, {}, members)
        await _group_event(conn, actor, caller, group_id, change="created",
                           fields=sorted(["displayName"] + (["externalId"] if external_id else [])
                                         + (["members"] if added else [])),
                           display_name=name, members_added=added, members_removed=[])
        row = await repository.find_group(conn, caller.organization_id, group_id)
        assert row is not None
    return _shown(Group, _group_json(row, base_url(settings)), None,
                  Context.RESOURCE_CREATION_RESPONSE)


async def _change_group(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                        group_id: str, if_match: str | None, settings: Settings,
                        change: Any) -> Shown:
    base = base_url(settings)
    async with conn.transaction():
        row = await repository.find_group(conn, caller.organization_id, group_id, lock=True) \
            if is_id(group_id, "grp") else None
        if row is None:
            raise ScimNotFound()
        shown = _group_json(row, base)
        _check_version(shown["meta"]["version"], if_match)
        wanted = change(Group.model_validate(shown, scim_policy=POLICY))
        name, external_id = _group_names(wanted)
        fields = [f for f, old, new in (("displayName", row["display_name"], name),
                                        ("externalId", row["external_id"], external_id))
                  if old != new]
        if fields:
            try:
                await repository.update_group(conn, group_id, display_name=name,
                                              external_id=external_id)
            except asyncpg.UniqueViolationError:
                raise _display_taken(name) from None
        before = await repository.members_of(conn, group_id)
        added, removed, renamed = await _set_members(conn, actor, caller, group_id, before,
                                                     _members(wanted))
        if added or removed or renamed:
            fields.append("members")
            if len(fields) == 1:
                await repository.touch_group(conn, group_id)
        if fields:
            await _group_event(conn, actor, caller, group_id, change="updated",
                               fields=sorted(fields), display_name=name, members_added=added,
                               members_removed=removed)
        row = await repository.find_group(conn, caller.organization_id, group_id)
        assert row is not None
    return _shown(Group, _group_json(row, base), None, Context.RESOURCE_REPLACEMENT_RESPONSE)


async def replace_group(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                        group_id: str, payload: Mapping[str, Any], if_match: str | None,
                        settings: Settings) -> Shown:
    """PUT: the group as the resource describes it. Raises ScimNotFound, ScimBadRequest,
    ScimConflict, ScimPreconditionFailed."""
    _schemas_of(payload, GROUP_URN)
    resource = _read(Group, payload, Context.RESOURCE_REPLACEMENT_REQUEST)
    return await _change_group(conn, actor, caller, group_id=group_id, if_match=if_match,
                               settings=settings, change=lambda _: resource)


async def amend_group(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                      group_id: str, payload: Mapping[str, Any], if_match: str | None,
                      settings: Settings) -> Shown:
    """PATCH (RFC 7644 3.5.2) of the group: members added, removed (by a ``value`` filter path
    or a remove's ``value``) or replaced. Raises ScimNotFound, ScimBadRequest, ScimConflict,
    ScimPreconditionFailed."""
    return await _change_group(conn, actor, caller, group_id=group_id, if_match=if_match,
                               settings=settings, change=_patching(Group, payload))


async def remove_group(conn: asyncpg.Connection, actor: Actor, caller: ScimCaller, *,
                       group_id: str, if_match: str | None, settings: Settings) -> None:
    """DELETE: the group and its members' tuples. Raises ScimNotFound, ScimPreconditionFailed."""
    async with conn.transaction():
        row = await repository.find_group(conn, caller.organization_id, group_id, lock=True) \
            if is_id(group_id, "grp") else None
        if row is None:
            raise ScimNotFound()
        _check_version(_group_json(row, base_url(settings))["meta"]["version"], if_match)
        members = [m["value"] for m in row["members"]]
        statuses = await repository.member_statuses(conn, caller.organization_id, members) \
            if members else {}
        await _tuples(conn, actor, caller.store_id, writes=[], deletes=[
            (group_id, u) for u in members if statuses.get(u) == "active"])
        await repository.delete_group(conn, group_id)
        await _group_event(conn, actor, caller, group_id, change="deleted", fields=[],
                           display_name=row["display_name"], members_removed=members)


# --- discovery (RFC 7643 5, 6, 7; RFC 7644 4) ------------------------------------------------


def service_provider_config(settings: Settings) -> dict[str, Any]:
    """What this service provider supports: PATCH, filters (at most ``MAX_COUNT`` results a
    page), ETags; not bulk, sorting or password changes. Bearer tokens authenticate."""
    config = ServiceProviderConfig(
        documentation_uri=None,
        patch=Patch(supported=True),
        bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
        filter=Filter(supported=True, max_results=MAX_COUNT),
        change_password=ChangePassword(supported=False),
        sort=Sort(supported=False),
        etag=ETag(supported=True),
        authentication_schemes=[AuthenticationScheme(
            type=AuthenticationScheme.Type.oauthbearertoken, name="OAuth Bearer Token",
            primary=True,
            description="The organization's SCIM token (POST /v1/organizations/{org_id}/"
                        "scim-token) as Authorization: Bearer scim_...")],
    )
    body: dict[str, Any] = config.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
    body["meta"] = {"resourceType": "ServiceProviderConfig",
                    "location": f"{base_url(settings)}/ServiceProviderConfig"}
    return body


def _schemas(settings: Settings) -> list[dict[str, Any]]:
    out = []
    for model in (UserResource, UserResource.get_extension_model(ENTERPRISE_URN), Group):
        schema: dict[str, Any] = model.to_schema().model_dump(  # type: ignore[union-attr]
            scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        if schema["id"] == USER_URN:  # users are unique on their e-mail address: it is required
            for attribute in schema["attributes"]:
                if attribute["name"] == "emails":
                    attribute["required"] = True
                    for sub in attribute.get("subAttributes", []):
                        if sub["name"] == "value":
                            sub["required"] = True
        schema["meta"] = {"resourceType": "Schema",
                          "location": f"{base_url(settings)}/Schemas/{schema['id']}"}
        out.append(schema)
    return out


def _resource_types(settings: Settings) -> list[dict[str, Any]]:
    out = []
    for model in (UserResource, Group):
        body: dict[str, Any] = ResourceType.from_resource(model).model_dump(
            scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        body["meta"] = {"resourceType": "ResourceType",
                        "location": f"{base_url(settings)}/ResourceTypes/{body['id']}"}
        out.append(body)
    return out


def schemas(settings: Settings) -> Listed:
    found = _schemas(settings)
    return _listed(len(found), 1, found)


def find_schema(settings: Settings, schema_id: str) -> dict[str, Any]:
    """Raises ScimNotFound."""
    for schema in _schemas(settings):
        if schema["id"] == schema_id:
            return schema
    raise ScimNotFound()


def resource_types(settings: Settings) -> Listed:
    found = _resource_types(settings)
    return _listed(len(found), 1, found)


def find_resource_type(settings: Settings, name: str) -> dict[str, Any]:
    """Raises ScimNotFound."""
    for resource_type in _resource_types(settings):
        if resource_type["id"] == name:
            return resource_type
    raise ScimNotFound()
