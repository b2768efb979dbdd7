"""Magic-link bodies."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

from common.schemas import RequestModel
from control_plane.tenancy.schemas import CORS_ORIGIN_PATTERN, normalize_origin
from control_plane.web.schemas import Channel, Destination

MAX_REDIRECT_URL: Final = 2048
REDIRECT_URL_PATTERN: Final = (CORS_ORIGIN_PATTERN.removesuffix("/?$")
                               + '(?:[/?][!-"$-~]*)?$')
"""A ``redirect_url``: an origin as :data:`~control_plane.tenancy.schemas.CORS_ORIGIN_PATTERN`
has it (https, or http for a loopback host; no user information), then an optional path and
query of printable ASCII without spaces or ``#`` (the link's fragment is the token's)."""


def redirect_origin(url: str) -> str:
    """The origin (``scheme://host[:port]``, as browsers serialize it) of a checked
    ``redirect_url``."""
    parts = urlsplit(url)
    return normalize_origin(f"{parts.scheme}://{parts.netloc}")


_REDIRECT_URL: Final = re.compile(REDIRECT_URL_PATTERN)


def _redirect_url(value: str) -> str:
    """``value`` when it matches :data:`REDIRECT_URL_PATTERN`; else ValueError in words (the
    pattern itself would be the message)."""
    if not _REDIRECT_URL.match(value):
        raise ValueError("must be an absolute https URL (http for a loopback host) without user "
                         "information or a fragment, in printable ASCII")
    return value


REDIRECT_URL_DESCRIPTION: Final = (
    "Where the link lands instead of this service's own page: a page of the application, an "
    "absolute URL (https, or http for a loopback host) on one of the project's allowed origins "
    "(`cors_origins` and `webauthn.origins`; else 400 `invalid_request` naming `redirect_url`), "
    "without a fragment. The link is this URL with `#token=...` appended: the page redeems it "
    "with `POST /v1/auth/magic-link/verify` (the browser module's `magicLink.verify()`). As "
    "Stytch's `login_magic_link_url`.")
RedirectUrl = Annotated[
    str, StringConstraints(max_length=MAX_REDIRECT_URL), AfterValidator(_redirect_url),
    WithJsonSchema({"type": "string", "maxLength": MAX_REDIRECT_URL,
                    "pattern": REDIRECT_URL_PATTERN})]


class SendBody(RequestModel):
    """Where to send the sign-in link: an email address or an E.164 phone number; and, for a
    page on the application's own origin, where the link lands."""

    destination: Destination
    redirect_url: RedirectUrl | None = Field(None, description=REDIRECT_URL_DESCRIPTION)


@dataclass(frozen=True, slots=True)
class Sent:
    """The link is on its way (the same answer whether or not a user has that destination)."""

    sent: bool
    channel: Channel
    expires_in: int


class VerifyBody(RequestModel):
    """The token from the link's fragment (``#token=``)."""

    token: Annotated[str, StringConstraints(min_length=1, max_length=256)]
