"""The OpenAPI 3.1 document, generated from the route tables and the schemas (DESIGN.md).

:func:`build_document` turns :class:`common.routing.Operation` values into the document served at
``GET /openapi.json`` and written to ``docs/openapi.json``; :func:`document_json` is its one
serialization (byte-identical for the same input). Nothing here is kept by hand: paths and
parameters come from the routes, JSON Schemas from pydantic (validation mode for request
models, serialization mode for replies, all through one generator so that every model and
dataclass gets one component with a unique name), and the error responses from the error classes
of :mod:`common.errors`.

What the envelope (``common.http``) adds to every response is documented once in the components:
``request_id`` at the top level of every JSON body (``RequestId``, joined to each reply's schema),
the ``Error`` body, and the ``X-Request-Id`` header.

Plain data, no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Final

import orjson
from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import core_schema

from common.errors import (
    BootstrapDisabled,
    DbUnavailable,
    Forbidden,
    InsufficientScope,
    InternalError,
    InvalidApiKey,
    InvalidRequest,
    MissingApiKey,
    MissingBootstrapToken,
    NoSession,
    PayloadTooLarge,
    ProjectNotFound,
    ScimUnauthorized,
    ServiceError,
)
from common.ids import PATH_IDS, id_pattern
from common.routing import ErrorBody, Operation, Reply, RequestHeader

__all__ = ["OPENAPI_VERSION", "build_document", "document_json", "method_name"]

OPENAPI_VERSION: Final = "3.1.0"
JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_REF: Final = "#/components/schemas/{model}"

OMIT_IF_NONE: Final = "omit_if_none"
"""``common.http.OMIT_IF_NONE``: a dataclass field so marked is left out of a body while None, so
the document must not call it required (not imported: this module stays free of the HTTP layer;
a test checks the two agree)."""

REQUEST_ID_HEADER: Final = "X-Request-Id"

# aiohttp's split of a path into its dynamic parts (``{name}`` or ``{name:regex}``, where the regex
# may hold one level of braces such as ``\d{3}``), as in aiohttp.web_urldispatcher.
_PATH_PART: Final = re.compile(r"(\{[_a-zA-Z][^{}]*(?:\{[^{}]*\}[^{}]*)*\})")
_DYNAMIC: Final = re.compile(r"^\{(?P<name>[_a-zA-Z][_a-zA-Z0-9]*)(?::(?P<regex>.+))?\}$")

# Headers that OpenAPI ignores as parameters (they are part of the operation's own description).
_RESERVED_HEADERS: Final = frozenset({"accept", "content-type", "authorization"})

_REQUEST_ID_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "title": "RequestId",
    "description": "What the envelope adds to every JSON body: the request's id, equal to the "
                   "`X-Request-Id` response header.",
    "properties": {
        "request_id": {
            "type": "string",
            "description": "The id of this request (`req_...`, or the caller's valid "
                           "`X-Request-Id`).",
        },
    },
    "required": ["request_id"],
}

_ERROR_INFO_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "title": "ErrorInfo",
    "properties": {
        "code": {"type": "string", "description": "The stable, machine-readable error code."},
        "message": {"type": "string", "description": "What went wrong, for a person."},
        "details": {
            "type": "object",
            "description": "More about the error (for `invalid_request`, `fields`: each bad "
                           "field's dotted path and what is wrong with it).",
            "additionalProperties": True,
        },
    },
    "required": ["code", "message", "details"],
    "additionalProperties": False,
}

_ERROR_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "title": "Error",
    "description": "The body of every error response.",
    "properties": {
        "error": {"$ref": SCHEMA_REF.format(model="ErrorInfo")},
        "request_id": {"type": "string", "description": "The id of this request."},
    },
    "required": ["error", "request_id"],
    "additionalProperties": False,
}

NO_NUL_PATTERN: Final = "^[^\\u0000]*$"
"""The ``pattern`` of every request string that has none of its own: no body, query or path
text may hold NUL (``common.http.read_json``, ``common.schemas.parse_query``)."""
JSON_VALUE_REF: Final = SCHEMA_REF.format(model="JsonValue")
"""A free-form JSON value as requests may carry it (``JsonValue``: no NUL in a string or key)."""
JSON_OBJECT_REF: Final = SCHEMA_REF.format(model="JsonObject")

JSON_ARRAY_DEPTH: Final = 4
"""How deep ``JsonValue`` describes arrays held directly in arrays (``[[[[1]]]]`` is 4); the
innermost level's items are any JSON value. Through objects the description is recursive
(``JsonObject`` holds ``JsonValue``s): a cycle of schemas passes through an object, so that client
generators that build a class per object (openapi-python-client, which cannot follow a cycle
through arrays or unions alone) can read it, while JSON Schema validators read the same rules."""


def _json_value_branches(array_depth: int) -> list[dict[str, Any]]:
    """The ``anyOf`` branches of ``JsonValue`` (or of an array's items, ``array_depth`` levels of
    arrays more allowed inside): the scalars, ``JsonObject``, and an array."""
    items: dict[str, Any] = ({"anyOf": _json_value_branches(array_depth - 1)} if array_depth > 1
                             else {"description": "Any JSON value."})
    return [
        {"type": "string", "pattern": NO_NUL_PATTERN},
        {"type": "integer"},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"$ref": JSON_OBJECT_REF},
        {"type": "array", "items": items},
    ]


_JSON_VALUE_SCHEMA: Final[dict[str, Any]] = {
    "title": "JsonValue",
    "description": "Any JSON value, except that no string or key holds the NUL character (the "
                   "service refuses NUL anywhere in a body). Arrays held directly in arrays are "
                   f"described {JSON_ARRAY_DEPTH} levels deep, as any JSON value below that.",
    "anyOf": _json_value_branches(JSON_ARRAY_DEPTH),
}

_JSON_OBJECT_SCHEMA: Final[dict[str, Any]] = {
    "title": "JsonObject",
    "description": "A JSON object whose keys and values hold no NUL character.",
    "type": "object",
    "propertyNames": {"pattern": NO_NUL_PATTERN},
    "additionalProperties": {"$ref": JSON_VALUE_REF},
}

_BUILTIN_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "JsonValue": _JSON_VALUE_SCHEMA,
    "JsonObject": _JSON_OBJECT_SCHEMA,
    "RequestId": _REQUEST_ID_SCHEMA,
    "ErrorInfo": _ERROR_INFO_SCHEMA,
    "Error": _ERROR_SCHEMA,
}

_SECURITY_SCHEMES: Final[dict[str, dict[str, Any]]] = {
    "apiKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "A project's API key (`sk_live_...` or `sk_test_...`) as `Authorization: "
                       "Bearer <key>`. A key with scopes may call the operations that name one "
                       "of them; a key without scopes has full access.",
    },
    "session": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "A session's access token as `Authorization: Bearer <token>` (wins over "
                       "the cookie).",
    },
    "sessionCookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": "service_session",
        "description": "A session's access token in the `service_session` cookie.",
    },
    "bootstrapToken": {
        "type": "apiKey",
        "in": "header",
        "name": "x-service-bootstrap-token",
        "description": "The deployment's bootstrap token (`SERVICE_BOOTSTRAP_TOKEN`).",
    },
    "consoleSession": {
        "type": "apiKey",
        "in": "cookie",
        "name": "authio_console",
        "description": "The operator console's session: its access token in the HttpOnly "
                       "`authio_console` cookie (SameSite=Strict, Path=/console), set by "
                       "`POST /console/session` when an operator signs in; once it has expired, "
                       "the refresh token in `authio_console_refresh` renews both. A page "
                       "without it answers 303 to `/console/sign-in`, an action 401 "
                       "`no_session`.",
    },
    "consoleCsrf": {
        "type": "apiKey",
        "in": "header",
        "name": "X-CSRF-Token",
        "description": "The console session's CSRF token (the `<meta name=\"csrf-token\">` of "
                       "every console page, and `csrf_token` of `POST /console/session`): every "
                       "console action sends it with the session's cookie, from a page of this "
                       "origin (403 `forbidden`, `details.reason` `csrf` or `cross_origin`).",
    },
    "portalSession": {
        "type": "apiKey",
        "in": "cookie",
        "name": "service_portal_session",
        "description": "The admin portal's session: the HttpOnly `service_portal_session` cookie "
                       "(SameSite=Strict, Path=/v1/portal) that opening a setup link "
                       "(`GET /portal?token=`) sets. Without a live one, the portal's calls "
                       "answer 410 `token_invalid_or_expired`.",
    },
    "scimToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "An organization's SCIM token (`scim_...`, from `POST /v1/organizations/"
                       "{org_id}/scim-token`) as `Authorization: Bearer <token>`: what a "
                       "directory (Microsoft Entra ID, Okta) is configured with.",
    },
}

_PROJECT_TEXT: Final = ("The project is named by the `project_id` query parameter, else the "
                        "`Service-Project` header, else the request's host matched to a "
                        "project's domain.")


def build_document(
    operations: Sequence[Operation],
    *,
    title: str,
    version: str,
    description: str = "",
    tags: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (``tags``: name and description of each tag,
    in the order to show them; tags of operations not named there follow, sorted).

    Raises ValueError for what cannot be documented: a method and path declared twice, two path
    templates that differ only in their parameter names, two replies of one status and content
    type, a reply at a status one of the operation's errors also has, a JSON reply that is not
    an object, or two different schemas under one component name.
    """
    schemas, components = _schemas(operations)
    for op in operations:
        if op.error_body is not None:
            _add_component(components, op.error_body.name, copy.deepcopy(dict(op.error_body.schema)))
    paths: dict[str, dict[str, Any]] = {}
    shapes: dict[str, str] = {}
    named: dict[str, tuple[str, str]] = {}
    for op in operations:
        path, path_params = _path_template(op.path)
        shape = re.sub(r"\{[^}]*\}", "{}", path)
        if shapes.setdefault(shape, path) != path:
            raise ValueError(f"{op.path}: the same path as {shapes[shape]} with other parameter names")
        item = paths.setdefault(path, {})
        method = op.method.lower()
        if method in item:
            raise ValueError(f"{op.method} {path} is declared twice")
        item[method] = _operation(op, path_params, schemas, components)
        name = item[method]["operationId"]
        if named.setdefault(name, (op.method, path)) != (op.method, path):
            raise ValueError(f"{op.method} {path} and {' '.join(named[name])} are both the "
                             f"operation {name!r} (rename a handler)")

    tag_list = [{"name": name, "description": text} if text else {"name": name} for name, text in tags]
    listed = {name for name, _ in tags}
    tag_list += [{"name": tag} for tag in sorted({op.tag for op in operations} - listed)]

    info: dict[str, Any] = {"title": title, "version": version}
    if description:
        info["description"] = description
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": JSON_SCHEMA_DIALECT,
        "info": info,
        "tags": tag_list,
        "paths": paths,
    }
    used = _reachable(paths, components)
    doc["components"] = {
        # Each component titled by its name: generators name their classes by title, and two
        # equal titles (pydantic titles ``Page[User]`` and ``Page[Store]`` both "Page") would
        # be one class.
        "schemas": {name: {**components[name], "title": name} for name in sorted(used)},
        "headers": {REQUEST_ID_HEADER: {
            "description": "The request's id, equal to the body's `request_id`; a valid "
                           "`X-Request-Id` sent by the caller is reused.",
            "schema": {"type": "string"},
        }},
        "securitySchemes": _SECURITY_SCHEMES,
    }
    # A tree of its own (one schema used twice is two equal dicts), as generators read it.
    out: dict[str, Any] = _alternatives_in_all_of(copy.deepcopy(doc))
    return out


def _alternatives_in_all_of(value: Any) -> Any:
    """``value`` with each object schema's ``anyOf``/``oneOf`` beside its ``properties`` (a rule
    such as "``writes`` or ``deletes``, at least one", ``WriteBody``) moved into its ``allOf``:
    the same rule to JSON Schema, while client generators that read a schema with ``anyOf`` as
    a union of its branches would otherwise make a class per branch holding only the
    properties the branch names (openapi-python-client), and lose the others."""
    if isinstance(value, dict):
        out = {key: _alternatives_in_all_of(item) for key, item in value.items()}
        if "properties" in out and isinstance(out["properties"], dict):
            moved = [{key: out.pop(key)} for key in ("anyOf", "oneOf") if key in out]
            if moved:
                out["allOf"] = [*out.get("allOf", []), *moved]
        return out
    if isinstance(value, list):
        return [_alternatives_in_all_of(item) for item in value]
    return value


def document_json(doc: Mapping[str, Any]) -> bytes:
    """``doc`` as the bytes to serve and to commit: sorted keys, 2-space indent, final newline."""
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


# --- schemas ----------------------------------------------------------------------------------


class _Generator(GenerateJsonSchema):
    """pydantic's generator, knowing that a dataclass field marked ``OMIT_IF_NONE`` may be
    absent from a reply body (``common.http.body_of``), and that no request string holds NUL
    (``NO_NUL_PATTERN`` for those without a pattern of their own)."""

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        json_schema = super().str_schema(schema)
        if self.mode == "validation":
            json_schema.setdefault("pattern", NO_NUL_PATTERN)
        return json_schema

    def dataclass_schema(self, schema: core_schema.DataclassSchema) -> JsonSchemaValue:
        json_schema = super().dataclass_schema(schema)
        if self.mode == "serialization" and "required" in json_schema:
            omitted = {f.name for f in dataclasses.fields(schema["cls"]) if f.metadata.get(OMIT_IF_NONE)}
            required = [name for name in json_schema["required"] if name not in omitted]
            if required:
                json_schema["required"] = required
            else:
                del json_schema["required"]
        return json_schema


_Key = tuple[Any, JsonSchemaMode]


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _schema_inputs(operations: Iterable[Operation]) -> Iterator[_Key]:
    for op in operations:
        if op.body is not None:
            yield op.body, "validation"
        if op.query is not None:
            yield op.query, "validation"
        for reply in op.replies:
            if reply.schema is not None:
                yield reply.schema, "serialization"


def _schemas(operations: Sequence[Operation]) -> tuple[dict[_Key, dict[str, Any]], dict[str, Any]]:
    """The JSON Schema of every type the operations name (keyed by type and mode; usually a
    ``$ref``), and the components: pydantic's ``$defs`` with the envelope's schemas beside them.
    One generator for all, so two types of the same name (``Page[User]`` and
    ``Page[Organization]``, or two ``User`` classes of two modules) get distinct names."""
    keys = list(dict.fromkeys(_schema_inputs(operations)))
    inputs = [(key, key[1], TypeAdapter[Any](key[0])) for key in keys]
    by_key, top = TypeAdapter.json_schemas(inputs, ref_template=SCHEMA_REF, schema_generator=_Generator)
    components: dict[str, Any] = dict(top.get("$defs", {}))
    schemas = {key: schema for (key, _), schema in by_key.items()}
    renames = _generic_names(components)
    if renames:
        components = {renames.get(name, name): _renamed_refs(schema, renames)
                      for name, schema in components.items()}
        schemas = {key: _renamed_refs(schema, renames) for key, schema in schemas.items()}
    for name, schema in _BUILTIN_SCHEMAS.items():
        _add_component(components, name, copy.deepcopy(schema))
    return schemas, components


_GENERIC: Final = re.compile(r"(?P<base>[A-Za-z][A-Za-z0-9]*)_(?P<arg>[A-Za-z][A-Za-z0-9]*)_")


def _generic_names(components: Mapping[str, Any]) -> dict[str, str]:
    """New names for pydantic's names of generic types of one argument: ``Page_User_`` (the
    schema of ``Page[User]``) is ``UserPage``, a name a client generator can make a class of.
    Raises ValueError when a new name is taken."""
    renames: dict[str, str] = {}
    for name in components:
        match = _GENERIC.fullmatch(name)
        if match is not None:
            renames[name] = match["arg"] + match["base"]
    taken = set(components) - set(renames)
    clashes = sorted(new for new in renames.values() if new in taken)
    if clashes or len(set(renames.values())) != len(renames):
        raise ValueError(f"generic schemas renamed onto names in use: {clashes or renames}")
    return renames


def _renamed_refs(value: Any, renames: Mapping[str, str]) -> Any:
    """``value`` with each ``$ref`` to a renamed component pointing at its new name."""
    prefix = SCHEMA_REF.format(model="")
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str) and item.startswith(prefix):
                name = item.removeprefix(prefix)
                out[key] = SCHEMA_REF.format(model=renames.get(name, name))
            else:
                out[key] = _renamed_refs(item, renames)
        return out
    if isinstance(value, list):
        return [_renamed_refs(item, renames) for item in value]
    return value


def _add_component(components: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    """Add ``schema`` as ``name``; raises ValueError when another schema has that name."""
    if name in components and components[name] != schema:
        raise ValueError(f"two different schemas are both named {name!r} in the OpenAPI components "
                         "(rename the model or dataclass)")
    components[name] = schema


def _resolve(schema: Mapping[str, Any], components: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema``, or the component it refers to."""
    while "$ref" in schema and len(schema) == 1:
        ref = schema["$ref"]
        prefix = SCHEMA_REF.format(model="")
        if not ref.startswith(prefix):
            break
        schema = components[ref.removeprefix(prefix)]
    return schema


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield item
            else:
                yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def _reachable(paths: Mapping[str, Any], components: Mapping[str, Any]) -> set[str]:
    """The names of the components the paths use, directly or through other components (the
    query models, whose fields became parameters, are left out)."""
    prefix = SCHEMA_REF.format(model="")
    seen: set[str] = set()
    todo = list(_refs(paths))
    while todo:
        ref = todo.pop()
        if not ref.startswith(prefix):
            continue
        name = ref.removeprefix(prefix)
        if name not in seen:
            seen.add(name)
            todo.extend(_refs(components[name]))
    return seen


# --- operations -------------------------------------------------------------------------------


def _path_template(path: str) -> tuple[str, list[dict[str, Any]]]:
    """The OpenAPI path of aiohttp's ``path`` (``{name:regex}`` becomes ``{name}``) and its path
    parameters: a regex is the parameter's pattern, a name of ``common.ids.PATH_IDS`` has the
    pattern of its ids, any other plain ``{name}`` matches one or more characters other than
    ``/``."""
    out: list[str] = []
    params: list[dict[str, Any]] = []
    for part in _PATH_PART.split(path):
        match = _DYNAMIC.match(part)
        if match is None:
            out.append(part)
            continue
        name, regex = match["name"], match["regex"]
        schema: dict[str, Any] = {"type": "string"}
        if regex is not None:
            schema["pattern"] = f"^(?:{regex})$"
        elif name in PATH_IDS:
            schema["pattern"] = id_pattern(PATH_IDS[name])
            schema["description"] = (
                f"A `{PATH_IDS[name]}_` id. Other text is not found (404), like an id that does "
                "not exist; text holding a control character is `invalid_request`.")
        else:
            schema["pattern"] = "^[^/{}]+$"
        out.append("{" + name + "}")
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    return "".join(out), params


def _operation(
    op: Operation,
    path_params: list[dict[str, Any]],
    schemas: Mapping[_Key, dict[str, Any]],
    components: dict[str, Any],
) -> dict[str, Any]:
    params = [*path_params]
    query_names: set[str] = set()
    if op.query is not None:
        for param in _query_parameters(schemas[op.query, "validation"], components):
            query_names.add(param["name"])
            params.append(param)
    reserved: list[str] = []
    for name, header in op.headers.items():
        meaning = header.meaning if isinstance(header, RequestHeader) else header
        if name.lower() in _RESERVED_HEADERS:
            reserved.append(f"`{name}`: {meaning}")
        else:
            schema = {"type": "string"}
            if isinstance(header, RequestHeader):
                schema["pattern"] = header.pattern
            params.append({"name": name, "in": "header", "required": False,
                           "description": meaning, "schema": schema})
    if op.project:
        if "project_id" not in query_names:
            params.append({"name": "project_id", "in": "query", "required": False,
                           "description": "The project this call is for (else the "
                                          "`Service-Project` header, else the request's host).",
                           "schema": {"type": "string"}})
        if not any(name.lower() == "service-project" for name in op.headers):
            params.append({"name": "Service-Project", "in": "header", "required": False,
                           "description": "The project this call is for, when the query does not "
                                          "name it.",
                           "schema": {"type": "string"}})

    out: dict[str, Any] = {"operationId": method_name(op), "tags": [op.tag]}
    if op.summary:
        out["summary"] = op.summary
    text = "\n\n".join(filter(None, [
        op.description,
        _security_text(op),
        _PROJECT_TEXT if op.project else "",
        "Headers: " + "; ".join(reserved) + "." if reserved else "",
    ]))
    if text:
        out["description"] = text
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": schemas[op.body, "validation"]}}}
    out["responses"] = _responses(op, schemas, components)
    if op.security:
        out["security"] = _security(op)
    return out


_METHOD_VERBS: Final = {"GET": "get", "POST": "post", "PUT": "put", "PATCH": "patch",
                        "DELETE": "delete"}
_WRITE_VERBS: Final = {"PUT": "replace", "PATCH": "update", "DELETE": "delete"}
ACTION_VERBS: Final = frozenset({
    "approve", "deny", "fulfill", "recover", "refresh", "remove", "replay", "revoke", "rotate",
    "search", "select", "send", "switch", "verify", "write"})
"""A word of a POST handler's name, last or last but one (``post_session_refresh``,
``post_session_select_org``), that is the action the call takes: its operation id begins with
it (``refresh_session``, ``select_session_org``). A last word ``options`` (the options of a
WebAuthn ceremony) begins it with ``start`` (``post_passkey_login_options``:
``start_passkey_login``)."""


def _singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def method_name(op: Operation) -> str:
    """The ``operationId`` of ``op``: the name of the method a generated client calls.

    An operation id declared on the route (one that is not its handler's name, as
    ``engine.edge`` declares them) is kept. Otherwise it is the handler's name, named after
    the HTTP method (``get_users``), read as what the call does: a GET of a list (a JSON reply
    with a ``next_cursor``) is ``list_users``, a POST answering 201 on a collection is
    ``create_user`` (the last word singular), a POST whose last word is one of
    :data:`ACTION_VERBS` puts it first (``post_session_refresh``: ``refresh_session``), PATCH is
    ``update_``, PUT ``replace_`` and DELETE ``delete_``. A handler named otherwise
    (``batch_check``) keeps its name. Stable: it changes only when the handler's name or the
    route does. :func:`build_document` raises ValueError when two are equal.
    """
    name = op.operation_id
    if name != getattr(op.handler, "__name__", name):
        return name
    prefix = _METHOD_VERBS[op.method] + "_"
    if not name.startswith(prefix):
        return name
    rest = name.removeprefix(prefix)
    words = rest.split("_")
    if op.method == "GET":
        return ("list_" if _is_listing(op) else "get_") + rest
    if op.method != "POST":
        return f"{_WRITE_VERBS[op.method]}_{rest}"
    if len(words) > 1 and words[-1] in ACTION_VERBS:
        return "_".join([words[-1], *words[:-1]])
    if len(words) > 2 and words[-2] in ACTION_VERBS:
        return "_".join([words[-2], *words[:-2], words[-1]])
    if len(words) > 1 and words[-1] == "options":
        return "_".join(["start", *words[:-1]])
    if any(reply.status == 201 for reply in op.replies) and not op.path.endswith("}"):
        return "create_" + "_".join([*words[:-1], _singular(words[-1])])
    return name


def _is_listing(op: Operation) -> bool:
    """Whether ``op`` answers a page of a listing (a JSON reply with ``next_cursor``)."""
    for reply in op.replies:
        cls = typing.get_origin(reply.schema) or reply.schema  # Page[User]: Page
        fields = getattr(cls, "__dataclass_fields__", None) or getattr(cls, "model_fields", None) or {}
        if "next_cursor" in fields:
            return True
    return False


def _query_parameters(schema: Mapping[str, Any], components: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One query parameter per property of the query model's JSON Schema (named by alias,
    required as the model says, the description moved from the schema to the parameter)."""
    model = _resolve(schema, components)
    required = set(model.get("required", ()))
    for name, prop in model.get("properties", {}).items():
        prop = dict(prop)
        param: dict[str, Any] = {"name": name, "in": "query", "required": name in required}
        if "description" in prop:
            param["description"] = prop.pop("description")
        param["schema"] = _not_null(prop)
        yield param


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema without JSON's ``null``: an optional field (``str | None =
    None``) is a parameter that may be left out, never one whose value is null."""
    if schema.get("default", ...) is None:
        del schema["default"]
    branches = schema.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        rest = [branch for branch in branches if branch != {"type": "null"}]
        del schema["anyOf"]
        if len(rest) == 1:
            schema = {**rest[0], **schema}
        elif rest:
            schema["anyOf"] = rest
    return schema


def _security(op: Operation) -> list[dict[str, list[str]]]:
    """The alternatives, any one of which is enough (an API key with one of the scopes, when
    there are scopes: OpenAPI's scope list means all of them)."""
    out: list[dict[str, list[str]]] = []
    for way in op.security:
        if way == "api_key":
            out += [{"apiKey": [scope]} for scope in op.scopes] or [{"apiKey": []}]
        elif way == "session":
            out += [{"session": []}, {"sessionCookie": []}]
        elif way == "scim_token":
            out.append({"scimToken": []})
        elif way == "console_session":
            safe = op.method in ("GET", "HEAD", "OPTIONS")
            out.append({"consoleSession": []} if safe else {"consoleSession": [], "consoleCsrf": []})
        elif way == "portal_session":
            out.append({"portalSession": []})
        else:
            out.append({"bootstrapToken": []})
    return out


def _security_text(op: Operation) -> str:
    ways: list[str] = []
    for way in op.security:
        if way == "api_key" and op.scopes:
            scopes = ", ".join(f"`{scope}`" for scope in op.scopes)
            ways.append(f"an API key with one of the scopes {scopes} (or a key without scopes)")
        elif way == "api_key":
            ways.append("an API key")
        elif way == "session":
            ways.append("a session's access token (`Authorization: Bearer` or the "
                        "`service_session` cookie)")
        elif way == "scim_token":
            ways.append("the organization's SCIM token (`Authorization: Bearer scim_...`)")
        elif way == "console_session":
            ways.append("the operator console's session (the `authio_console` cookie"
                        + (")" if op.method in ("GET", "HEAD", "OPTIONS") else
                           ", with the page's CSRF token as `X-CSRF-Token`, from this origin)"))
        elif way == "portal_session":
            ways.append("the admin portal's session (the `service_portal_session` cookie)")
        else:
            ways.append("the bootstrap token (`x-service-bootstrap-token`)")
    return f"Authentication: {' or '.join(ways)}." if ways else ""


# --- responses --------------------------------------------------------------------------------


def _errors_of(op: Operation) -> list[type[ServiceError]]:
    """The error classes ``op`` may answer: its own and those implied by its other fields."""
    # Any request may be invalid_request: a header that is not UTF-8 text, HTTP that aiohttp's
    # parser refuses (common.http); and a body, query, path parameter or project named wrongly.
    errors: list[type[ServiceError]] = [*op.errors, InvalidRequest]
    if op.body is not None:
        errors.append(PayloadTooLarge)
    if "api_key" in op.security:
        errors += [MissingApiKey, InvalidApiKey]
        if op.scopes:
            errors.append(InsufficientScope)
    if "session" in op.security:
        errors.append(NoSession)
        if op.method not in ("GET", "HEAD", "OPTIONS"):
            errors.append(Forbidden)  # a cross-origin request carrying the cookie
    if "bootstrap_token" in op.security:
        errors += [MissingBootstrapToken, BootstrapDisabled]
    if "scim_token" in op.security:
        errors.append(ScimUnauthorized)
    if op.project:
        errors.append(ProjectNotFound)
    errors += [InternalError, DbUnavailable]
    return errors


def _headers(reply_headers: Mapping[str, str]) -> dict[str, Any]:
    headers: dict[str, Any] = {REQUEST_ID_HEADER: {"$ref": f"#/components/headers/{REQUEST_ID_HEADER}"}}
    for name, meaning in reply_headers.items():
        if name.lower() != REQUEST_ID_HEADER.lower() and name.lower() != "content-type":
            headers[name] = {"description": meaning, "schema": {"type": "string"}}
    return headers


def _responses(
    op: Operation,
    schemas: Mapping[_Key, dict[str, Any]],
    components: dict[str, Any],
) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for reply in op.replies:
        status = str(reply.status)
        response = responses.setdefault(status, {"description": reply.description,
                                                 "headers": _headers(reply.headers)})
        if response["description"] != reply.description:
            response["description"] += f"\n\n{reply.description}"
        response["headers"].update(_headers(reply.headers))
        if reply.content_type is None:
            continue
        content = response.setdefault("content", {})
        if reply.content_type in content:
            raise ValueError(f"{op.operation_id}: two {status} replies of type {reply.content_type}")
        content[reply.content_type] = {"schema": _body_schema(op, reply, schemas, components)}

    by_status: dict[int, dict[str, type[ServiceError]]] = {}
    for err in _errors_of(op):
        by_status.setdefault(err.status, {}).setdefault(err.code, err)
    for code_status, codes in sorted(by_status.items()):
        error = _error_response(code_status, [codes[c] for c in sorted(codes)], op.error_body)
        answered = responses.get(str(code_status))
        if answered is not None:  # a body of the route's own (an OAuth error), or the envelope
            ours = answered.get("content", {}).get("application/json")
            if ours is None or set(answered["content"]) != {"application/json"}:
                raise ValueError(f"{op.operation_id}: status {code_status} is both a reply "
                                 "and an error, not both JSON")
            ours["schema"] = {"anyOf": [ours["schema"],
                                        error["content"]["application/json"]["schema"]]}
            answered["description"] += f"\n\nOr the error envelope: {error['description']}"
            answered["headers"].update(error["headers"])
            continue
        responses[str(code_status)] = error
    return dict(sorted(responses.items()))


def _body_schema(
    op: Operation, reply: Reply, schemas: Mapping[_Key, dict[str, Any]], components: dict[str, Any],
) -> dict[str, Any]:
    """The schema of ``reply``'s body: for JSON, its type's schema with ``request_id`` beside its
    fields (``allOf`` with ``RequestId``; for an object that forbids other properties, a copy of
    its schema with ``request_id`` added); for another type, its schema or a string."""
    if reply.schema is None:
        if not _is_json(reply.content_type):
            return {"type": "string"}
        return {"$ref": SCHEMA_REF.format(model="RequestId")} if reply.envelope else {"type": "object"}
    schema = schemas[reply.schema, "serialization"]
    if not _is_json(reply.content_type) or not reply.envelope:
        return schema
    target = _resolve(schema, components)
    if target.get("type", "object") != "object":
        raise ValueError(f"{op.operation_id}: a JSON reply's body must be an object, not "
                         f"{target.get('type')!r}")
    if target.get("additionalProperties", True) is True and "unevaluatedProperties" not in target:
        return {"allOf": [schema, {"$ref": SCHEMA_REF.format(model="RequestId")}]}
    inline = copy.deepcopy(dict(target))
    inline["properties"] = {**inline.get("properties", {}),
                            "request_id": copy.deepcopy(_REQUEST_ID_SCHEMA["properties"]["request_id"])}
    inline["required"] = [*(r for r in inline.get("required", ()) if r != "request_id"), "request_id"]
    return inline


def _error_response(status: int, errors: Sequence[type[ServiceError]],
                    body: ErrorBody | None = None) -> dict[str, Any]:
    """One error status: the ``Error`` body with ``error.code`` narrowed to ``errors``' codes;
    or, for a route whose errors have a ``body`` of their own, that body (the codes then name
    the cases in the description only: they are not on the wire)."""
    lines = "\n".join(f"- `{err.code}`: {err.default_message}" for err in errors)
    retrying = [f"`{err.code}`" for err in errors if err.retry_after is not None]
    headers = {"Retry-After": f"Seconds to wait before retrying (with {', '.join(retrying)})."
               } if retrying else {}
    if body is not None:
        content: dict[str, Any] = {
            body.content_type: {"schema": {"$ref": SCHEMA_REF.format(model=body.name)}}}
        description = f"{HTTPStatus(status).phrase}, as {body.description or body.name}. " \
                      f"Cases:\n\n{lines}"
        if status == InvalidRequest.status:
            # HTTP the server's parser refuses is answered before any route is known.
            content["application/json"] = {"schema": _envelope([InvalidRequest])}
            description += ("\n\nHTTP the server refuses before any route is known (a request "
                            "line or header over 8 KiB) is answered in the `Error` envelope.")
        return {"description": description, "headers": _headers(headers), "content": content}
    return {
        "description": f"{HTTPStatus(status).phrase}. Error codes:\n\n{lines}",
        "headers": _headers(headers),
        "content": {"application/json": {"schema": _envelope(errors)}},
    }


def _envelope(errors: Sequence[type[ServiceError]]) -> dict[str, Any]:
    """The ``Error`` body with ``error.code`` narrowed to ``errors``' codes."""
    return {"allOf": [
        {"$ref": SCHEMA_REF.format(model="Error")},
        {"type": "object", "properties": {"error": {"type": "object", "properties": {
            "code": {"type": "string", "enum": [err.code for err in errors]}}}}},
    ]}
