"""Request models: the one place input is parsed and refused (DESIGN.md "Conventions").

Every request body and query string is a :class:`RequestModel` (pydantic): unknown fields are
rejected, nothing is coerced, and a failure becomes ``invalid_request`` (400) with
``details.fields`` naming each bad field by its dotted path (:func:`validation_error`). The same
models give the OpenAPI document its schemas (``common.openapi``).

Why pydantic and not msgspec: the service already reads its settings with pydantic; its JSON
Schema is draft 2020-12, the dialect of OpenAPI 3.1, with no translation; and a failed
validation lists every bad field with its path, which is what ``details.fields`` reports.
msgspec decodes faster and stops at the first error; the one path where decoding speed is the
product, the engine's checks, is parsed by hand (``engine.checks``) and its models here only
document it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, TypeVar

from aiohttp import web
from multidict import MultiMapping
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from common.errors import InvalidRequest, ServiceError
from common.http import NUL_MESSAGE, read_json

M = TypeVar("M", bound=BaseModel)
_REFUSAL: Final = "refusal"

CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters (and DEL): never allowed in a human-readable text field."""

CONTROL_MESSAGE: Final = "must not contain control characters"
_NOT_IN_AN_ID_RE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(value: str) -> str:
    """``value`` unchanged; a pydantic ``AfterValidator`` raising ValueError when it holds a
    control character (``CONTROL_RE``)."""
    if CONTROL_RE.search(value):
        raise ValueError("must not contain control characters")
    return value


# What pydantic's strip_whitespace trims (Unicode White_Space, as Rust's str::trim: not quite
# Python's str.isspace, which adds U+001C..U+001F) and what CONTROL_RE refuses, for patterns that
# say exactly what a name field takes.
_WS: Final = r"\u0009-\u000d\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CONTROL: Final = r"\u0000-\u001f\u007f-\u009f"


def name_pattern(max_length: int, *, required: bool) -> str:
    """The JSON Schema ``pattern`` of a name field: after trimming whitespace, 1 (0 unless
    ``required``) to ``max_length`` characters with no control character."""
    ends, inner = f"[^{_WS}{_CONTROL}]", f"[^{_CONTROL}]"
    core = f"{ends}(?:{inner}{{0,{max_length - 2}}}{ends})?"
    return f"^[{_WS}]*{core}[{_WS}]*$" if required else f"^[{_WS}]*(?:{core}[{_WS}]*)?$"


DisplayName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
    AfterValidator(printable),
    WithJsonSchema({"type": "string", "pattern": name_pattern(200, required=True),
                    "description": "1 to 200 characters after trimming whitespace, none of them "
                                   "a control character."}),
]
"""A human-readable name field: 1 to 200 characters after trimming, no control characters."""


def parse_path_param(name: str, value: str) -> str:
    """``value`` of the path parameter ``name`` (an id, ``common.ids.PATH_IDS``). Raises
    InvalidRequest naming it when it holds a control character (NUL among them, which
    PostgreSQL cannot take) or a lone surrogate: no id ever holds one. Other text that is not an
    id of the kind passes, for the domain to answer not found, like an id that does not exist."""
    if _NOT_IN_AN_ID_RE.search(value):
        raise InvalidRequest.field(name, CONTROL_MESSAGE)
    return value


def refuse_nul(name: str, value: str) -> None:
    """Raises InvalidRequest naming ``name`` when ``value`` holds NUL (``NUL_MESSAGE``)."""
    if "\x00" in value:
        raise InvalidRequest.field(name, NUL_MESSAGE)


def integral(value: object) -> object:
    """A JSON number with no fraction (``17.0``) as the integer it is (JSON Schema 2020-12: an
    integer is a number whose fractional part is zero): a ``BeforeValidator`` for the integer
    fields of request bodies, which are otherwise strict."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields rejected, no type coercion (DESIGN.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PatchModel(RequestModel):
    """Base of ``PATCH`` bodies, where only the fields present change: at least one field must be
    given, and ``null`` is refused except for the fields named in ``nullable_fields`` (where
    ``null`` clears the value). Both rules are ``invalid_request`` through ``parse_body``."""

    nullable_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _not_empty_and_no_null(cls, data: Any) -> Any:
        # Before the fields: a misplaced null is the body's first fault, whatever else is wrong.
        if isinstance(data, dict):
            fields = cls.model_fields
            if not data:
                raise ValueError(f"give at least one of {', '.join(fields)}")
            for name in fields:
                if data.get(name, ...) is None and name not in cls.nullable_fields:
                    raise ValueError(f"{name} cannot be null")
        return data

    @classmethod
    def __get_pydantic_json_schema__(cls, core: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The document says the same: at least one field, ``null`` only where allowed."""
        schema = handler(core)
        target = handler.resolve_ref_schema(schema)
        target["minProperties"] = 1
        for name, prop in target.get("properties", {}).items():
            prop.pop("default", None)
            options = prop.get("anyOf")
            if name not in cls.nullable_fields and options:
                kept = [o for o in options if o.get("type") != "null"]
                del prop["anyOf"]
                prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
        return schema



def refusal(error: type[ServiceError], message: str | None = None,
            details: dict[str, Any] | None = None) -> PydanticCustomError:
    """What a validator raises to refuse a value with a code of its own (``invalid_email``
    422, ``invalid_slug`` 422, ...) instead of ``invalid_request``: when every failure of the
    body is such a refusal, the first one is the answer; alongside other failures it is listed
    in ``invalid_request``'s ``details.fields`` like them."""
    return PydanticCustomError(_REFUSAL, message or error.default_message,
                               {"error": error, "details": details})


def validation_error(exc: ValidationError) -> ServiceError:
    """Turn a pydantic error into ``invalid_request`` with ``details.fields`` (dotted paths), or
    into the code of a ``refusal`` when only refusals failed."""
    errors = exc.errors(include_url=False)
    if errors and all(err["type"] == _REFUSAL for err in errors):
        ctx = errors[0]["ctx"]
        return ctx["error"](errors[0]["msg"], details=ctx["details"])  # type: ignore[no-any-return]
    fields = []
    for err in errors:
        path = ".".join(str(p) for p in err["loc"]) or "body"
        cause = err.get("ctx", {}).get("error")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif isinstance(cause, ValueError):
            msg = getattr(cause, "message", None) or str(cause)  # our own rule's words
        else:
            msg = err["msg"]
        fields.append({"field": path, "message": msg})
    first = fields[0] if fields else {"field": "body", "message": "invalid"}
    return InvalidRequest(f"{first['field']}: {first['message']}", details={"fields": fields})


def parse_model(model: type[M], data: Mapping[str, Any]) -> M:
    """Validate ``data`` into ``model``; raises InvalidRequest naming each bad field (or a
    ``refusal``'s error)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """``read_json`` then ``parse_model``; models forbid unknown fields (DESIGN.md)."""
    return parse_model(model, await read_json(request))




class QueryModel(BaseModel):
    """Base of query-string models: each field is a parameter, its value arrives as text (so
    values are converted, unlike a body's). Parameters the model does not name are ignored
    unless ``strict_names`` (then they are ``invalid_request``), and of a repeated one the first
    counts unless ``single_values`` (then a repeat is ``invalid_request``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=False)
    strict_names: ClassVar[bool] = False
    single_values: ClassVar[bool] = False


Q = TypeVar("Q", bound=QueryModel)


def parse_query(query: MultiMapping[str], model: type[Q]) -> Q:
    """``query`` (a request's query string) validated into ``model``. Raises InvalidRequest
    naming each bad parameter; first, whatever the model, a name or value holding NUL."""
    for name, value in query.items():
        refuse_nul(name, name)
        refuse_nul(name, value)
    if model.strict_names:
        allowed = [f.alias or name for name, f in model.model_fields.items()]
        unknown = sorted(set(query) - set(allowed))
        if unknown:
            fields = [{"field": name, "message": "unknown query parameter"} for name in unknown]
            raise InvalidRequest(
                f"Unknown query parameter {unknown[0]!r}; allowed: {', '.join(allowed)}.",
                details={"fields": fields})
    if model.single_values:
        for name in query:
            if len(query.getall(name)) > 1:
                raise InvalidRequest.field(name, "must be given at most once")
    values = {name: query[name] for name in query}  # the first of repeated values
    return parse_model(model, values)
