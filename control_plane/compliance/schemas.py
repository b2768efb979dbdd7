"""Compliance bodies: a data-subject request (SPEC.md 2 "DSR") as created, listed and fulfilled."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

from common.errors import InvalidEmail
from common.schemas import RequestModel
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
    "Days from the call to the due date: 30 by default, 45 for CCPA requests."))]
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
