"""Message bodies: the development mailbox's items and its query."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final

from pydantic import Field

from common.schemas import QueryModel
from control_plane.web.pagination import limit_type
from control_plane.web.schemas import Channel

MAILBOX_CAPACITY: Final = 1000


@dataclass(frozen=True, slots=True)
class MailboxItem:
    """A message the console sink of this process delivered."""

    id: str
    channel: Channel
    kind: str
    destination: str
    subject: str
    text: str
    html: str | None
    delivered_at: datetime


@dataclass(frozen=True, slots=True)
class Mailbox:
    """The project's delivered messages, newest first."""

    data: list[MailboxItem]


class MailboxQuery(QueryModel):
    """``destination`` (exact match) and ``limit`` (1 to 1000, default 50)."""

    strict_names = True

    destination: Annotated[str | None, Field(description="Only messages to this address.")] = None
    limit: limit_type(MAILBOX_CAPACITY) = 50  # type: ignore[valid-type]
