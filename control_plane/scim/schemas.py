"""SCIM bodies: the token minted for an organization, the listing's query, and what the OpenAPI
document says of the SCIM resources and messages.

The SCIM resources themselves are scim2-models' (``User`` with the enterprise extension,
``Group``, ``PatchOp``, ``ListResponse``, ``Error``, the discovery resources): a request is read
through them under :data:`POLICY`, which takes what Microsoft Entra ID and Okta send
(capitalised ``op`` values, ``"True"``/``"False"`` for booleans, a member removed by a ``value``
filter or by a remove's ``value``, Okta's path-less ``{"op": "replace", "value": {"active":
false}}``) and drops attributes no schema declares. The JSON Schemas below document them for
the OpenAPI document; the library, not these, reads a request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema
from scim2_models import EnterpriseUser, Group, ScimPolicy, User

from common.ids import id_pattern, is_id
from common.openapi import JSON_VALUE_REF, NO_NUL_PATTERN
from common.routing import ErrorBody
from common.schemas import QueryModel, RequestModel

SCIM_JSON: Final = "application/scim+json"
ERROR_URN: Final = "urn:ietf:params:scim:api:messages:2.0:Error"
LIST_URN: Final = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
PATCH_URN: Final = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
USER_URN: Final = str(User.__schema__)
ENTERPRISE_URN: Final = str(EnterpriseUser.__schema__)
GROUP_URN: Final = str(Group.__schema__)
MAX_COUNT: Final = 1000
"""The most resources one page of a listing holds (``filter.maxResults``)."""
MAX_TEXT: Final = 1024
"""The longest ``userName``, ``externalId`` or group ``displayName`` (they are indexed)."""

UserResource = User[EnterpriseUser]
"""A SCIM User as this service reads and writes it: the core schema and the enterprise
extension (Entra and Okta send its attributes)."""

POLICY: Final = ScimPolicy(
    unknown=ScimPolicy.Unknown.ignore,
    remove_value_as_filter=ScimPolicy.RemoveValue.apply,
    unmatched_path_filter=ScimPolicy.UnmatchedPathFilter.create,
)
"""What the service tolerates: unknown attributes are dropped (RFC 7643 3.3 lets a service
provider ignore what it does not support); a remove's ``value`` selects the values to remove, as
Entra sends it; an ``add`` or ``replace`` whose path filter matches nothing (``emails[type eq
"work"].value`` on a user without a work address) creates the value, as Entra expects."""


# --- the token ---------------------------------------------------------------------------------


def _store_id(value: str | None) -> str | None:
    if value is not None and not is_id(value, "store"):
        raise ValueError("must be a store id (store_...)")
    return value


class MintBody(RequestModel):
    """``POST /v1/organizations/{org_id}/scim-token``: optionally, the store whose tuples the
    organization's directory groups write (``group:<grp_ id>#member@user:<user_ id>``); null
    for none. Left out, the organization keeps the store it had."""

    store_id: Annotated[str | None, AfterValidator(_store_id), WithJsonSchema({
        "anyOf": [{"type": "string", "pattern": id_pattern("store")}, {"type": "null"}],
        "description": "A store of the project, or null for none."})] = None


@dataclass(frozen=True, slots=True)
class MintedToken:
    """A new SCIM token, shown this once; it replaced the organization's previous token. A
    directory (Microsoft Entra ID's "Tenant URL" and "Secret Token", Okta's "SCIM connector base
    URL" and "Bearer token") is configured with ``base_url`` and ``token``."""

    token: str
    base_url: str
    store_id: str | None


@dataclass(frozen=True, slots=True)
class ScimCaller:
    """Whom a SCIM token speaks for: its id (``sct_``, the audit log's actor), the organization
    and its project (and the project's name, which enrollment messages carry), and the store
    the organization's groups write to (or None)."""

    token_id: str
    organization_id: str
    project_id: str
    project_name: str
    store_id: str | None


# --- the listing -------------------------------------------------------------------------------

_PARAM_TEXT: Final = {"type": "string", "pattern": NO_NUL_PATTERN, "maxLength": 4096}
_INTEGER: Final = re.compile(r"-?[0-9]{1,9}")
_Param = Annotated[str, StringConstraints(max_length=4096)]


def _integer(value: str | None) -> str | None:
    if value is not None and _INTEGER.fullmatch(value) is None:
        raise ValueError("must be an integer")
    return value


class ListQuery(QueryModel):
    """RFC 7644 3.4.2: ``filter``, 1-based ``startIndex`` and ``count`` (values below 1 count as
    1 and 0, RFC 7644 3.4.2.4; ``count`` at most 1,000), ``attributes`` and
    ``excludedAttributes``. ``sortBy`` and ``sortOrder`` are accepted and ignored: sorting is not
    offered (``ServiceProviderConfig``), and a listing is in creation order."""

    filter: Annotated[_Param | None, WithJsonSchema({
        **_PARAM_TEXT, "description": "A SCIM filter (RFC 7644 3.4.2.2), such as "
                                      "`userName eq \"bjensen\"`."})] = None
    start_index: Annotated[str | None, Field(alias="startIndex"), AfterValidator(_integer),
                           WithJsonSchema({
        "type": "string", "pattern": "^-?[0-9]{1,9}$",
        "description": "The 1-based index of the first result (default 1)."})] = None
    count: Annotated[str | None, AfterValidator(_integer), WithJsonSchema({
        "type": "string", "pattern": "^-?[0-9]{1,9}$",
        "description": f"How many results at most (default and maximum {MAX_COUNT:,})."})] = None
    attributes: Annotated[_Param | None, WithJsonSchema({
        **_PARAM_TEXT, "description": "Comma-separated attributes to return (and `id`)."})] = None
    excluded_attributes: Annotated[_Param | None, Field(alias="excludedAttributes"), WithJsonSchema({
        **_PARAM_TEXT, "description": "Comma-separated attributes not to return."})] = None
    sort_by: Annotated[_Param | None, Field(alias="sortBy"), WithJsonSchema({
        **_PARAM_TEXT, "description": "Accepted and ignored: sorting is not offered."})] = None
    sort_order: Annotated[_Param | None, Field(alias="sortOrder"), WithJsonSchema({
        **_PARAM_TEXT, "description": "Accepted and ignored: sorting is not offered."})] = None


class ResourceQuery(QueryModel):
    """RFC 7644 3.4.1: ``attributes`` and ``excludedAttributes`` of one resource's answer."""

    attributes: Annotated[_Param | None, WithJsonSchema({
        **_PARAM_TEXT, "description": "Comma-separated attributes to return (and `id`)."})] = None
    excluded_attributes: Annotated[_Param | None, Field(alias="excludedAttributes"), WithJsonSchema({
        **_PARAM_TEXT, "description": "Comma-separated attributes not to return."})] = None


# --- the document ------------------------------------------------------------------------------


def _text(max_length: int = MAX_TEXT, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "pattern": NO_NUL_PATTERN, "maxLength": max_length, **extra}


_SCIM_BOOL: Final = {"anyOf": [{"type": "boolean"},
                               # x-enum-varnames: names for client generators, which would make
                               # both "True" and "true" the member TRUE (openapi-python-client).
                               {"enum": ["True", "False", "true", "false"],
                                "x-enum-varnames": ["TITLE_TRUE", "TITLE_FALSE", "TRUE", "FALSE"]},
                               {"type": "null"}],
                     "description": "A boolean; the strings `\"True\"` and `\"False\"` too "
                                    "(as Microsoft Entra ID sends them)."}
_STRING: Final = {"type": "string", "pattern": NO_NUL_PATTERN}
_OPTIONAL_TEXT: Final = {"anyOf": [_STRING, {"type": "null"}]}
_EMAIL: Final = {"type": "object", "properties": {
    "value": {"type": "string", "format": "email", "maxLength": 320},
    "type": _OPTIONAL_TEXT, "primary": _SCIM_BOOL, "display": _OPTIONAL_TEXT},
    "required": ["value"]}
_META: Final = {"type": "object", "description": "RFC 7643 3.1 `meta`.", "properties": {
    "resourceType": {"type": "string"}, "created": {"type": "string", "format": "date-time"},
    "lastModified": {"type": "string", "format": "date-time"}, "location": {"type": "string"},
    "version": {"type": "string"}}}


def _schemas(urn: str) -> dict[str, Any]:
    return {"type": "array", "items": _STRING, "contains": {"const": urn},
            "description": f"The message's schema URNs: `{urn}` among them (others are ignored)."}


USER_BODY: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ScimUserRequest",
    "description": "A SCIM User (RFC 7643 4.1, with the enterprise extension of 4.3) as a "
                   "directory sends it: `userName` and at least one of `emails`, each with a "
                   "`value` (the primary address, else the first, is the user's e-mail address: "
                   "users are unique on it). Other attributes of the schemas are kept and shown "
                   "back; attributes no schema declares are ignored. `id` and `meta` are the "
                   "service's.",
    "properties": {
        "schemas": _schemas(USER_URN),
        "userName": _text(minLength=1),
        "externalId": {"anyOf": [_text(), {"type": "null"}]},
        "displayName": _OPTIONAL_TEXT,
        "active": _SCIM_BOOL,
        "emails": {"type": "array", "items": _EMAIL, "minItems": 1},
        "name": {"anyOf": [{"type": "object", "properties": {
            name: _OPTIONAL_TEXT for name in ("formatted", "familyName", "givenName",
                                              "middleName", "honorificPrefix",
                                              "honorificSuffix")}}, {"type": "null"}]},
    },
    "required": ["userName", "emails"],
}

GROUP_BODY: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ScimGroupRequest",
    "description": "A SCIM Group (RFC 7643 4.2): `displayName` (unique in the organization) and "
                   "its `members` (at most 10,000), each a User of the organization by its "
                   "`value` (the `user_` id).",
    "properties": {
        "schemas": _schemas(GROUP_URN),
        "displayName": _text(minLength=1),
        "externalId": {"anyOf": [_text(), {"type": "null"}]},
        "members": {"anyOf": [{"type": "array", "items": {
            "type": "object", "properties": {"value": {"type": "string",
                                                       "pattern": id_pattern("user")},
                                             "display": _OPTIONAL_TEXT},
            "required": ["value"]}}, {"type": "null"}]},
    },
    "required": ["displayName"],
}

PATCH_BODY: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ScimPatchOp",
    "description": "RFC 7644 3.5.2: `Operations`, each `add`, `replace` or `remove` (any case), "
                   "with a `path` (RFC 7644's path grammar: an attribute, a sub-attribute or a "
                   "value filter such as `members[value eq \"user_...\"]`) or, for `add` and "
                   "`replace`, a `value` object of attributes.",
    "properties": {
        "schemas": _schemas(PATCH_URN),
        "Operations": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {
                "op": {"type": "string", "pattern": "^(?i:add|replace|remove)$"},
                "path": _OPTIONAL_TEXT,
                "value": {"$ref": JSON_VALUE_REF},
            },
            "required": ["op"]}},
    },
    "required": ["Operations"],
}

SEARCH_URN: Final = "urn:ietf:params:scim:api:messages:2.0:SearchRequest"
SEARCH_BODY: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ScimSearchRequest",
    "description": "RFC 7644 3.4.3: a query sent as a body (`POST .../.search`): the listing's "
                   "parameters as JSON (`startIndex` below 1 counts as 1, `count` below 0 as 0).",
    "properties": {
        "schemas": _schemas(SEARCH_URN),
        "filter": _OPTIONAL_TEXT,
        "startIndex": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "count": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "attributes": {"anyOf": [{"type": "array", "items": _STRING}, {"type": "null"}]},
        "excludedAttributes": {"anyOf": [{"type": "array", "items": _STRING}, {"type": "null"}]},
        "sortBy": _OPTIONAL_TEXT,
        "sortOrder": {"anyOf": [{"enum": ["ascending", "descending"]}, {"type": "null"}]},
    },
}

_RESOURCE: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"schemas": {"type": "array", "items": {"type": "string"}},
                   "id": {"type": "string"}, "meta": _META},
    "required": ["schemas", "id"],
}
USER_REPLY: Final[dict[str, Any]] = {
    **_RESOURCE, "title": "ScimUser",
    "description": "A SCIM User: `id` is the user's `user_` id, `active` whether its membership "
                   "of the organization is active."}
GROUP_REPLY: Final[dict[str, Any]] = {
    **_RESOURCE, "title": "ScimGroup",
    "description": "A SCIM Group (`grp_` id) and its members."}
LIST_REPLY: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ScimListResponse",
    "description": "RFC 7644 3.4.2: a page of resources.",
    "properties": {"schemas": {"type": "array", "items": {"const": LIST_URN}},
                   "totalResults": {"type": "integer", "minimum": 0},
                   "startIndex": {"type": "integer", "minimum": 1},
                   "itemsPerPage": {"type": "integer", "minimum": 0},
                   "Resources": {"type": "array", "items": {"type": "object"}}},
    "required": ["schemas", "totalResults"],
}
DISCOVERY_REPLY: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ScimDiscovery",
    "description": "An RFC 7643 discovery resource (5, 6, 7) or a list of them.",
    "properties": {"schemas": {"type": "array", "items": {"type": "string"}}},
    "required": ["schemas"],
}

ERROR_BODY: Final = ErrorBody(
    name="ScimError",
    content_type=SCIM_JSON,
    description="RFC 7644 3.12's error (`status`, `scimType` when one applies, `detail`)",
    schema={
        "type": "object",
        "title": "ScimError",
        "description": "An RFC 7644 3.12 error: every refusal under /scim/v2, in place of the "
                       "service's envelope (the `X-Request-Id` header stays).",
        "properties": {
            "schemas": {"type": "array", "items": {"const": ERROR_URN}},
            "status": {"type": "string", "pattern": "^[1-5][0-9]{2}$"},
            "scimType": {"type": "string", "enum": [
                "invalidFilter", "tooMany", "uniqueness", "mutability", "invalidSyntax",
                "invalidPath", "noTarget", "invalidValue", "invalidVers", "sensitive"]},
            "detail": {"type": "string"},
        },
        "required": ["schemas", "status"],
    },
)


def documented(schema: dict[str, Any]) -> Any:
    """A type whose JSON Schema is ``schema``: what ``endpoint(body=...)`` and ``Reply`` take."""
    return Annotated[dict[str, Any], WithJsonSchema(schema)]


def _open(schema: Any) -> Any:
    """``schema`` (a request's) with every object open to other attributes, as SCIM's are
    (unknown ones are ignored), whose names and values hold no NUL (``read_json``)."""
    if isinstance(schema, list):
        return [_open(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _open(value) if key in ("properties", "items", "anyOf", "contains") else value
           for key, value in schema.items()}
    if "properties" in out:
        out["properties"] = {name: _open(prop) for name, prop in schema["properties"].items()}
    if out.get("type") == "object":
        out.setdefault("propertyNames", {"pattern": NO_NUL_PATTERN})
        out.setdefault("additionalProperties", {"$ref": JSON_VALUE_REF})
    return out


UserBody = documented(_open(USER_BODY))
GroupBody = documented(_open(GROUP_BODY))
PatchBody = documented(_open(PATCH_BODY))
SearchBody = documented(_open(SEARCH_BODY))
UserReply = documented(USER_REPLY)
GroupReply = documented(GROUP_REPLY)
ListReply = documented(LIST_REPLY)
DiscoveryReply = documented(DISCOVERY_REPLY)
