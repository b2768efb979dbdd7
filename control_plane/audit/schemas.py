"""Audit-log bodies: the event as the API shows it, and the query strings of the read routes.

Every read route takes a fixed set of query parameters: an unknown or repeated one is
``invalid_request`` (``strict_names``), as is an empty value, one longer than 256 characters
(``q``: 200) or one holding a control character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from common.schemas import PatchModel, QueryModel, RequestModel, name_pattern, printable
from control_plane.audit.streams.datadog import DatadogConfig
from control_plane.audit.streams.nats import NatsConfig
from control_plane.audit.streams.s3 import S3Config
from control_plane.audit.streams.splunk_hec import SplunkConfig
from control_plane.audit.streams.webhook import WebhookConfig
from control_plane.web.pagination import Cursor, Limit, limit_type

EXPORT_CAP: Final = 100_000  # SPEC.md 8
MAX_VALUE: Final = 256
MAX_Q: Final = 200
MAX_TYPES_TEXT: Final = 1024
"""The longest ``type`` list, in characters. It bounds the names too: the former caps of 50
names of 256 characters each allowed 12,850, which no request line (8,190 bytes) carries, and a
cap on each name protected nothing (a name longer than any action matches none)."""
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")
# "2026-01-31T12:00:00 01:00": a '+' sent unencoded in a query string arrives as a space.
_SPACE_OFFSET_RE: Final = re.compile(r"(T[0-9:.,]+) ([0-9]{2}(?::?[0-9]{2})?)$")

Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
"""RFC 3339 UTC with microseconds and ``Z``, as the database renders it."""


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audit event (SPEC.md 2). ``description`` is the column, else
    ``metadata.description``; ``metadata`` is the event's free-form JSON object."""

    id: str
    created_at: Timestamp
    action: str
    actor_type: str
    actor_id: str | None
    user_id: str | None
    project_id: str | None
    target_type: str | None
    target_id: str | None
    ip: str | None
    user_agent: str | None
    description: str | None
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EventTypes:
    """The distinct actions of the project's events of the last 30 days, sorted."""

    data: list[str]


@dataclass(frozen=True, slots=True)
class LegacyPage:
    """A page of the legacy listing: pass ``next_before`` back as ``before``."""

    data: list[AuditEvent]
    next_before: Timestamp | None
    has_more: bool


def parse_time(raw: str) -> datetime:
    """An ISO 8601 timestamp (no offset: UTC) as an aware UTC datetime. Raises ValueError."""
    text = _SPACE_OFFSET_RE.sub(r"\1+\2", raw) if len(raw) <= 64 else ""
    try:
        value = datetime.fromisoformat(text)
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError("must be an ISO 8601 timestamp such as 2026-01-31T12:00:00Z") from None


def _text(max_len: int) -> Any:
    def check(value: object) -> object:
        if isinstance(value, str):
            if not value:
                raise ValueError("must not be empty")
            if len(value) > max_len:
                raise ValueError(f"must be at most {max_len} characters")
            if _CONTROL_RE.search(value):
                raise ValueError("must not contain control characters")
        return value

    return BeforeValidator(check)


_NO_CONTROL: Final = r"\u0000-\u001f\u007f"
# What str.strip() trims, beyond the control characters refused anyway.
_PY_SPACE: Final = r"\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _text_schema(max_len: int, description: str) -> WithJsonSchema:
    """What ``_text`` takes, for the document."""
    return WithJsonSchema({"type": "string", "minLength": 1, "maxLength": max_len,
                           "pattern": f"^[^{_NO_CONTROL}]*$", "description": description})


def _types(value: object) -> object:
    if not isinstance(value, str):
        return value
    names = list(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    if not names:
        raise ValueError("must name at least one action")
    return tuple(names)


def _time(value: object) -> object:
    return parse_time(value) if isinstance(value, str) else value


Time = Annotated[datetime, BeforeValidator(_time), _text(MAX_VALUE)]


def not_before_from(cls: type, v: datetime | None, info: ValidationInfo) -> datetime | None:
    """The validator of a ``to`` parameter: not earlier than the model's ``from`` (field
    ``since``): ``field_validator("to")(not_before_from)``."""
    since = info.data.get("since")
    if v is not None and since is not None and v < since:
        raise ValueError("must not be earlier than from")
    return v


class EventFilters(QueryModel):
    """The combinable filters of SPEC.md 4."""

    strict_names = True
    single_values = True

    type: Annotated[tuple[str, ...] | None, BeforeValidator(_types),
                    _text(MAX_TYPES_TEXT), WithJsonSchema({
        "type": "string", "minLength": 1, "maxLength": MAX_TYPES_TEXT,
        # at least one name: a character that is neither a comma nor whitespace
        "pattern": f"^[^{_NO_CONTROL}]*[^{_NO_CONTROL},{_PY_SPACE}][^{_NO_CONTROL}]*$",
        "description": f"Comma-separated action names, matched exactly (at most "
                       f"{MAX_TYPES_TEXT} characters in all)."})] = None
    user: Annotated[str | None, _text(MAX_VALUE),
                    _text_schema(MAX_VALUE, "Events about this user id.")] = None
    actor: Annotated[str | None, _text(MAX_VALUE),
                     _text_schema(MAX_VALUE, "Events by this actor id.")] = None
    since: Annotated[Time | None, Field(alias="from", description=(
        "Events at or after this ISO 8601 time (no offset: UTC)."))] = None
    to: Annotated[Time | None, Field(description=(
        "Events before this ISO 8601 time (no offset: UTC)."))] = None
    q: Annotated[str | None, _text(MAX_Q), _text_schema(
        MAX_Q, "Case-insensitive substring of the action, actor id, target id or description."
    )] = None

    _to_after_from = field_validator("to")(not_before_from)


class EventsQuery(EventFilters):
    """``GET /v1/audit/events``: the filters, ``limit`` and ``cursor``."""

    cursor: Cursor = None
    limit: Limit = 50


class ExportQuery(EventFilters):
    """The exports: the filters, ``cursor`` (a listing's ``next_cursor`` works) and ``limit``
    (1 to 100,000, SPEC.md 8's cap)."""

    cursor: Cursor = None
    limit: limit_type(EXPORT_CAP) = EXPORT_CAP  # type: ignore[valid-type]


class TypesQuery(QueryModel):
    """``GET /v1/audit/events/types`` takes no parameters."""

    strict_names = True
    single_values = True


def _empty_is_none(value: object) -> object:
    return None if value == "" else value


class LegacyQuery(QueryModel):
    """``GET /v1/audit-events`` (SPEC.md 9.2): empty ``before`` or ``action_prefix`` are ignored,
    for old clients."""

    strict_names = True
    single_values = True

    before: Annotated[datetime | None, BeforeValidator(_time), BeforeValidator(_empty_is_none),
                      WithJsonSchema({"anyOf": [{"type": "string", "format": "date-time"},
                                                {"const": ""}],
                                      "description": "Only events strictly older (ISO 8601); "
                                                     "empty: all."})] = None
    action_prefix: Annotated[str | None, _text(MAX_VALUE), BeforeValidator(_empty_is_none),
                             WithJsonSchema({"anyOf": [
                                 {"type": "string", "maxLength": MAX_VALUE,
                                  "pattern": f"^[^{_NO_CONTROL}]*$"},
                                 {"const": ""}],
                                 "description": "A literal prefix of the action (% and _ are "
                                                "not wildcards); empty: any."})] = None
    limit: Limit = 50


# --- what other domains name in their bodies ---------------------------------------------------

ACTION_RE: Final = re.compile(r"^(\*|[a-z][a-z0-9_]*(\.[a-z0-9_]+)+)$")
"""An audit action name (``user.created``, ``auth.signin_attempt``), or ``*`` for every event."""

Action = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=ACTION_RE.pattern)]
Description = Annotated[
    str, StringConstraints(strip_whitespace=True, max_length=500), AfterValidator(printable),
    WithJsonSchema({"type": "string", "pattern": name_pattern(500, required=False),
                    "description": "0 to 500 characters after trimming whitespace, none of them "
                                   "a control character."})]


# --- audit streams -------------------------------------------------------------------------------

StreamStatus = Literal["active", "paused", "failing"]
DestinationConfig = Annotated[
    WebhookConfig | DatadogConfig | SplunkConfig | S3Config | NatsConfig, Field(discriminator="type")]
StreamActions = Annotated[list[Action], Field(min_length=1, max_length=100, description=(
    "Only events of these actions (leave it out, or [\"*\"], for every event)."))]


class StreamBody(RequestModel):
    """``POST /v1/audit/streams``: where the events go (``destination``, by ``type``), which
    (``actions``; every event when left out) and a note."""

    destination: DestinationConfig
    actions: StreamActions | None = None
    description: Description | None = None


class StreamPatch(PatchModel):
    """``PATCH /v1/audit/streams/{id}``: ``status`` ``paused`` stops sending (the position stays:
    ``active`` resumes there, nothing lost), ``actions`` (null: every event), ``description``."""

    nullable_fields = frozenset({"actions", "description"})

    status: Literal["active", "paused"] | None = None
    actions: StreamActions | None = None
    description: Description | None = None


@dataclass(frozen=True, slots=True)
class Stream:
    """An audit stream (``strm_``): its ``destination`` (credentials shown as ``"***"``),
    ``actions`` (null: every event), ``status`` (``failing`` while a batch keeps failing, with
    ``last_error``), ``lag`` (events committed after its position and not yet acknowledged),
    and, for the ``webhook`` type, ``secret`` in the create answer only."""

    id: str
    destination: dict[str, Any]
    actions: list[str] | None
    description: str | None
    status: StreamStatus
    lag: int
    last_error: str | None
    last_delivered_at: datetime | None
    created_at: datetime
    secret: str | None = None


@dataclass(frozen=True, slots=True)
class DeletedStream:
    """A deleted stream: nothing more is sent."""

    id: str
    deleted: bool
