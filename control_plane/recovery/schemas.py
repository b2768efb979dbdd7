"""Recovery bodies: a request as filed, decided and listed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, WithJsonSchema

from common.ids import id_pattern, is_id
from common.schemas import RequestModel
from control_plane.web.pagination import PageQuery
from control_plane.web.schemas import Channel, Email, PhoneNumber

RecoveryStatus = Literal["pending", "approved", "denied"]
Note = Annotated[str, StringConstraints(max_length=2000), Field(description=(
    "Free text for the people handling it (how the user proved who they are, a ticket), up to "
    "2,000 characters."))]
def _user_id(value: str) -> str:
    if not is_id(value, "user"):
        raise ValueError("must be a user id (user_...)")
    return value


UserId = Annotated[str, AfterValidator(_user_id), WithJsonSchema(
    {"type": "string", "pattern": id_pattern("user"), "description": "A user id."})]


class RecoveryBody(RequestModel):
    """``POST /v1/recovery/requests``: the user, the new destination its recovery link goes to
    (exactly one of ``email`` and ``phone_number``), and why."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": [name], "properties": {name: {"type": "string"}}}
        for name in ("email", "phone_number")]})

    user_id: UserId
    email: Email | None = None
    phone_number: PhoneNumber | None = None
    reason: Note | None = None


class DecisionBody(RequestModel):
    """``POST .../approve`` and ``.../deny``: an optional note kept with the decision."""

    note: Note | None = None


class RecoveryQuery(PageQuery):
    """``GET /v1/recovery/requests``: oldest first; ``status`` and ``user_id`` filter."""

    strict_names = True
    single_values = True

    status: Annotated[RecoveryStatus | None, Field(description="Only requests in this status.")] = None
    user_id: Annotated[UserId | None, Field(description="Only this user's requests.")] = None


@dataclass(frozen=True, slots=True)
class RecoveryRequest:
    """A recovery request (``rcv_``): ``pending`` until an operator ``approved`` or ``denied``
    it (``decided_at``, ``decided_by`` the actor's id, ``decision_note``). Approval made
    ``destination`` the user's ``channel`` contact (unverified until its link is used), revoked
    every session and queued the recovery link (``message_id``)."""

    id: str
    user_id: str
    channel: Channel
    destination: str
    reason: str | None
    status: RecoveryStatus
    decision_note: str | None
    decided_by: str | None
    decided_at: datetime | None
    message_id: str | None
    created_at: datetime
