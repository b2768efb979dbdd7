"""Compliance bodies: a data-subject request (SPEC.md 2 "DSR") as created, listed and fulfilled;
an incident and a maintenance window as created, changed and listed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from common.errors import InvalidEmail
from common.ids import id_pattern, is_id
from common.schemas import DisplayName, PatchModel, RequestModel, integral
from control_plane.audit.schemas import Time
from control_plane.web.pagination import PageQuery
from control_plane.web.schemas import MAX_EMAIL_LENGTH, normalize_email

RequestType = Literal["deletion", "export"]
DsrStatus = Literal["pending", "in_progress", "fulfilled"]
DEFAULT_DUE_DAYS: Final = 30
MAX_URL: Final = 2048


def _email(value: str) -> str:
    try:
        return normalize_email(value)
    except InvalidEmail as err:
        raise ValueError(err.message) from None


SubjectEmail = Annotated[str, AfterValidator(_email), WithJsonSchema(
    {"type": "string", "format": "email", "maxLength": MAX_EMAIL_LENGTH,
     "description": "The end user's e-mail address (a bad one is invalid_request)."})]
Notes = Annotated[str, StringConstraints(max_length=2000), Field(description=(
    "Free text for the request's handling (a ticket, the channel it came by), up to 2,000 "
    "characters; line breaks kept."))]
DueDays = Annotated[int, Field(ge=1, le=90, description=(
    "Days from the call to the due date: 30 by default, 45 for CCPA requests.")),
    BeforeValidator(integral)]
"""(The validator after the Field: before it, pydantic writes ``ge``/``le`` into the JSON
schema instead of ``minimum``/``maximum``.)"""
ArtifactUrl = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL,
                                               pattern=r"^https?://[!-~]+$"), WithJsonSchema(
    {"type": "string", "minLength": 1, "maxLength": MAX_URL, "pattern": r"^https?://[!-~]+$",
     "description": "Where the export document is handed over (recorded, never fetched)."})]


class DsrBody(RequestModel):
    """``POST /v1/compliance/dsr``: what is asked for, about whom; the clock starts now."""

    request_type: RequestType
    user_email: SubjectEmail
    notes: Notes | None = None
    due_days: DueDays = DEFAULT_DUE_DAYS


class FulfilBody(RequestModel):
    """``POST /v1/compliance/dsr/{id}/fulfill``: empty for a deletion; an export names where its
    document goes (``output_artifact_url``, required)."""

    output_artifact_url: ArtifactUrl | None = None


class DsrQuery(PageQuery):
    """``GET /v1/compliance/dsr``: oldest first; ``status``, ``type`` and ``overdue`` filter."""

    strict_names = True
    single_values = True

    status: Annotated[DsrStatus | None, Field(description="Only requests in this status.")] = None
    type: Annotated[RequestType | None, Field(description="Only requests of this type.")] = None
    overdue: Annotated[bool | None, Field(description=(
        "true: only requests past due_at and not fulfilled; false: only the others."))] = None


@dataclass(frozen=True, slots=True)
class Dsr:
    """A data-subject request (``dsr_``). ``status`` ``pending``, ``in_progress`` (a deletion
    between its hard delete and its last anonymization batch) or ``fulfilled``; ``overdue`` when
    past ``due_at`` and not fulfilled. ``result`` is what the fulfilment answered (null before):
    a deletion's counts, an export's ``sha256``."""

    dsr_id: str
    request_type: RequestType
    user_email: str
    notes: str | None
    due_days: int
    status: DsrStatus
    overdue: bool
    created_at: datetime
    due_at: datetime
    fulfilled_at: datetime | None
    output_artifact_url: str | None
    result: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Fulfilment:
    """What fulfilling a request answered: the request as it now stands; for a deletion the
    rows ``deleted`` and the history rows ``anonymized``, by table; for an export the JSON
    ``document`` and its ``sha256`` (hex, of the document's bytes as this service serializes
    it: UTF-8 JSON, keys sorted, no whitespace). ``user_found`` is false when the project held
    no user with that e-mail (fulfilled as "nothing held")."""

    dsr: Dsr
    user_found: bool
    deleted: dict[str, int] | None = None
    anonymized: dict[str, int] | None = None
    document: dict[str, Any] | None = None
    sha256: str | None = None


# --- incidents ---------------------------------------------------------------------------------

Severity = Literal["sev1", "sev2", "sev3", "sev4"]
IncidentStatus = Literal["open", "resolved"]
MAX_AFFECTED: Final = 100
MAX_TEXT: Final = 5000
CLOCK_SKEW: Final = timedelta(minutes=1)
"""How far in the future a time said to be past may be: the caller's clock and ours differ."""
NOT_FUTURE: Final = "must not be in the future"


def _project_id(value: str) -> str:
    if not is_id(value, "proj"):
        raise ValueError("must be a project id (proj_ and 26 characters)")
    return value


def _not_future(value: datetime) -> datetime:
    if value > datetime.now(UTC) + CLOCK_SKEW:
        raise ValueError(NOT_FUTURE)
    return value


ProjectId = Annotated[str, AfterValidator(_project_id), WithJsonSchema(
    {"type": "string", "pattern": id_pattern("proj"), "description": "A project id."})]
AffectedProjects = Annotated[list[ProjectId], Field(
    min_length=1, max_length=MAX_AFFECTED, description=(
        "The projects the incident affects (ids; repeats are dropped). Default: the caller's."))]
LongText = Annotated[str, StringConstraints(max_length=MAX_TEXT), Field(description=(
    "Free text, up to 5,000 characters; line breaks kept."))]
PastTime = Annotated[Time, AfterValidator(_not_future)]
DetectedAt = Annotated[PastTime, Field(description=(
    "When the incident was detected (RFC 3339; no offset: UTC), not in the future; the "
    "notification deadline counts from it. Default: now."))]
NotifiedAt = Annotated[PastTime, Field(description=(
    "When the authorities or customers were notified (RFC 3339; no offset: UTC), not in the "
    "future nor before detected_at; null: not notified."))]
IncidentTitle = Annotated[DisplayName, Field(description=(
    "What happened, in a line: 1 to 200 characters after trimming whitespace, no control "
    "characters."))]


class IncidentBody(RequestModel):
    """``POST /v1/incidents``: an open incident of ``severity`` (``sev1`` the highest), and
    whether personal data was affected (a breach); both set its notification deadline."""

    severity: Severity
    title: IncidentTitle
    description: LongText | None = None
    personal_data: bool = False
    affected_projects: AffectedProjects | None = None
    detected_at: DetectedAt | None = None


class IncidentPatch(PatchModel):
    """``PATCH /v1/incidents/{id}``: any of the fields. ``status`` ``resolved`` resolves it (a
    resolved incident is never reopened); ``notified: true`` records that the authorities or
    customers were told now, ``notified_at`` when they were (null, or ``notified: false``:
    not told); ``description`` null clears it."""

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["notified", "notified_at"]}})
    nullable_fields = frozenset({"description", "notified_at"})

    title: IncidentTitle | None = None
    description: LongText | None = None
    severity: Severity | None = None
    personal_data: bool | None = None
    affected_projects: AffectedProjects | None = None
    notified: Annotated[bool | None, Field(description=(
        "true: notified now (unless notified_at is already set); false: not notified. Not "
        "with notified_at."))] = None
    notified_at: NotifiedAt | None = None
    status: Annotated[Literal["resolved"] | None, Field(description=(
        "resolved: the incident is over (a resolved incident is never reopened)."))] = None


class IncidentQuery(PageQuery):
    """``GET /v1/incidents``: oldest first; ``status``, ``severity`` and ``overdue`` filter."""

    strict_names = True
    single_values = True

    status: Annotated[IncidentStatus | None, Field(description="Only incidents in this status.")] = None
    severity: Annotated[Severity | None, Field(description="Only incidents of this severity.")] = None
    overdue: Annotated[bool | None, Field(description=(
        "true: only incidents past notify_by and not notified; false: only the others."))] = None


@dataclass(frozen=True, slots=True)
class Incident:
    """An incident (``inc_``), ``open`` until ``resolved``. ``notify_by`` is its notification
    deadline (SPEC.md 8): ``detected_at`` + 4 hours for ``sev1``, + 72 hours when personal data
    was affected, the earlier when both apply, null when neither does; ``overdue`` when that
    time has passed and ``notified_at`` is still null (resolved or not: the duty to notify
    outlives the incident)."""

    id: str
    severity: Severity
    title: str
    description: str | None
    personal_data: bool
    affected_projects: list[str]
    status: IncidentStatus
    detected_at: datetime
    notify_by: datetime | None
    notified_at: datetime | None
    overdue: bool
    created_at: datetime
    updated_at: datetime
    resolved_at: datetime | None


# --- maintenance windows -----------------------------------------------------------------------

WindowStatus = Literal["scheduled", "in_progress", "completed"]
LATER_THAN_STARTS: Final = "must be later than starts_at"
NOT_PAST: Final = "must not be in the past"


def _not_past(value: datetime) -> datetime:
    if value < datetime.now(UTC):
        raise ValueError(NOT_PAST)
    return value


StartsAt = Annotated[Time, Field(description=(
    "When the window starts (RFC 3339; no offset: UTC)."))]
EndsAt = Annotated[Time, AfterValidator(_not_past), Field(description=(
    "When the window ends (RFC 3339; no offset: UTC): later than starts_at, not in the past."))]
WindowTitle = Annotated[DisplayName, Field(description=(
    "What is maintained, in a line: 1 to 200 characters after trimming whitespace, no control "
    "characters."))]


class WindowBody(RequestModel):
    """``POST /v1/maintenance-windows``: a window ``scheduled`` from ``starts_at`` (which may
    have passed) to ``ends_at`` (later, and not passed)."""

    title: WindowTitle
    description: LongText | None = None
    starts_at: StartsAt
    ends_at: EndsAt

    @field_validator("ends_at")
    @classmethod
    def _after_start(cls, value: datetime, info: ValidationInfo) -> datetime:
        starts_at = info.data.get("starts_at")
        if starts_at is not None and value <= starts_at:
            raise ValueError(LATER_THAN_STARTS)
        return value


class WindowPatch(PatchModel):
    """``PATCH /v1/maintenance-windows/{id}``: ``status`` ``in_progress`` starts a scheduled
    window, ``completed`` completes a started one (in that order only; the status it already
    has changes nothing). ``starts_at`` changes while it is scheduled, ``ends_at`` until it is
    completed (a running window may be extended), ``title`` and ``description`` too; a
    completed window no longer changes."""

    nullable_fields = frozenset({"description"})

    title: WindowTitle | None = None
    description: LongText | None = None
    starts_at: StartsAt | None = None
    ends_at: EndsAt | None = None
    status: Annotated[Literal["in_progress", "completed"] | None, Field(description=(
        "in_progress: started (from scheduled); completed: over (from in_progress)."))] = None


class WindowQuery(PageQuery):
    """``GET /v1/maintenance-windows``: oldest first; ``status`` filters."""

    strict_names = True
    single_values = True

    status: Annotated[WindowStatus | None, Field(description="Only windows in this status.")] = None


@dataclass(frozen=True, slots=True)
class MaintenanceWindow:
    """A maintenance window (``mw_``): ``scheduled`` for ``starts_at`` to ``ends_at``, then
    ``in_progress`` from ``started_at`` (shown in ``GET /readyz``), then ``completed`` at
    ``completed_at``."""

    id: str
    title: str
    description: str | None
    status: WindowStatus
    starts_at: datetime
    ends_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    created_at: datetime
    updated_at: datetime
