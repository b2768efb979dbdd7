"""Magic-link bodies."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, StringConstraints

from common.schemas import RequestModel
from control_plane.tenancy.schemas import CORS_ORIGIN_PATTERN, normalize_origin
from control_plane.web.schemas import Channel, Destination

MAX_REDIRECT_URL: Final = 2048
_ORIGIN: Final = re.compile(CORS_ORIGIN_PATTERN)


def redirect_origin(url: str) -> str:
    """The origin (``scheme://host[:port]``, as browsers serialize it) of a checked
    ``redirect_url``."""
    parts = urlsplit(url)
    return normalize_origin(f"{parts.scheme}://{parts.netloc}")


def _redirect_url(value: str) -> str:
    parts = urlsplit(value)
    if "#" in value:
        raise ValueError("must have no fragment: the link's token goes there")
    if "@" in parts.netloc or not _ORIGIN.match(f"{parts.scheme}://{parts.netloc}"):
        raise ValueError("must be an absolute https URL (http for a loopback host) with no "
                         "user information")
    return value


RedirectUrl = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_REDIRECT_URL),
    AfterValidator(_redirect_url),
    Field(description=(
        "Where the link lands instead of this service's own page: a page of the application, "
        "an absolute URL on one of the project's allowed origins (`cors_origins` and "
        "`webauthn.origins`; else 400 `invalid_request` naming `redirect_url`), without a "
        "fragment. The link is this URL with `#token=...` appended: the page redeems it with "
        "`POST /v1/auth/magic-link/verify` (the browser module's `magicLink.verify()`). As "
        "Stytch's `login_magic_link_url`."))]


class SendBody(RequestModel):
    """Where to send the sign-in link: an email address or an E.164 phone number; and, for a
    page on the application's own origin, where the link lands."""

    destination: Destination
    redirect_url: RedirectUrl | None = None


@dataclass(frozen=True, slots=True)
class Sent:
    """The link is on its way (the same answer whether or not a user has that destination)."""

    sent: bool
    channel: Channel
    expires_in: int


class VerifyBody(RequestModel):
    """The token from the link's fragment (``#token=``)."""

    token: Annotated[str, StringConstraints(min_length=1, max_length=256)]
