"""Magic-link bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import StringConstraints

from common.schemas import RequestModel
from control_plane.web.schemas import Channel, Destination


class SendBody(RequestModel):
    """Where to send the sign-in link: an email address or an E.164 phone number."""

    destination: Destination


@dataclass(frozen=True, slots=True)
class Sent:
    """The link is on its way (the same answer whether or not a user has that destination)."""

    sent: bool
    channel: Channel
    expires_in: int


class VerifyBody(RequestModel):
    """The token from the link's fragment (``#token=``)."""

    token: Annotated[str, StringConstraints(min_length=1, max_length=256)]
