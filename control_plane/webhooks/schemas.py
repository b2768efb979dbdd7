"""Webhook bodies (DESIGN.md "webhooks", after Svix and Standard Webhooks): an endpoint as created,
changed and answered, a delivery with its attempts, and the recover call's body."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from common.schemas import PatchModel, RequestModel
from control_plane.audit.schemas import Action, Description, Time
from control_plane.web.outbound import Url
from control_plane.web.pagination import PageQuery

MAX_EVENTS: Final = 100
EndpointStatus = Literal["active", "disabled"]
DisabledReason = Literal["gone", "failing"]
DeliveryStatus = Literal["pending", "succeeded", "failed"]

Events = Annotated[list[Action], Field(min_length=1, max_length=MAX_EVENTS, description=(
    'The action names to receive (as GET /v1/audit/event-types lists them), or ["*"] for '
    "every event."))]


class EndpointBody(RequestModel):
    """``POST /v1/webhook-endpoints``: where to send, which events, and a note."""

    url: Url
    events: Events
    description: Description | None = None


class EndpointPatch(PatchModel):
    """``PATCH /v1/webhook-endpoints/{id}``: any of the fields; ``status`` ``active`` enables a
    disabled endpoint again (its ``disabled_reason`` is cleared), ``disabled`` stops deliveries."""

    nullable_fields = frozenset({"description"})

    url: Url | None = None
    events: Events | None = None
    description: Description | None = None
    status: EndpointStatus | None = None


class DeliveriesQuery(PageQuery):
    """``GET .../deliveries``: newest first; ``status`` filters."""

    strict_names = True
    single_values = True

    status: Annotated[DeliveryStatus | None, Field(description="Only deliveries in this status.")] = None


class RecoverBody(RequestModel):
    """``POST /v1/webhook-endpoints/{id}/recover``: queue again every failed delivery made at or
    after ``since``."""

    since: Annotated[Time, Field(description="An RFC 3339 time (no offset: UTC).")]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A webhook endpoint (``whep_``). ``secret`` (``whsec_`` + base64 of 24 bytes) is only in
    the answers of create and rotate-secret; receivers verify with it (Standard Webhooks).
    ``status`` ``disabled`` with ``disabled_reason`` ``gone`` (it answered 410) or ``failing``
    (five days of nothing but failures), or null (disabled by a PATCH)."""

    id: str
    url: str
    events: list[str]
    description: str | None
    status: EndpointStatus
    disabled_reason: DisabledReason | None
    created_at: datetime
    secret: str | None = None


@dataclass(frozen=True, slots=True)
class DeletedEndpoint:
    """A deleted endpoint: nothing more is sent to it."""

    id: str
    deleted: bool


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt: when (``at``), the receiver's HTTP status (null when none came), how long it
    took (ms), and what went wrong (null on success)."""

    at: str
    status_code: int | None
    duration_ms: int
    error: str | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event sent to one endpoint (``dlv_``): ``pending`` until it succeeds or its retries
    run out (``failed``); ``next_attempt_at`` is null once it succeeded or failed."""

    id: str
    event_id: str
    event_type: str
    status: DeliveryStatus
    attempts: list[Attempt]
    next_attempt_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Requeued:
    """How many failed deliveries were queued again."""

    requeued: int


def attempts_of(value: Any) -> list[Attempt]:
    """The ``attempts`` column (a JSON array) as :class:`Attempt` values."""
    return [Attempt(a["at"], a.get("status_code"), a.get("duration_ms", 0), a.get("error"))
            for a in value or []]
