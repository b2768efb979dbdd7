"""Where a message can go: email addresses and E.164 phone numbers (SPEC.md 4 and 7).

Email syntax is checked by ``email-validator`` (RFC 5322 / 6531 addresses as deliverable mail
systems accept them; no DNS lookup on the request path). Phone numbers must be E.164 as written:
``+``, a country code not starting with 0, at most 15 digits in all (ITU-T E.164).
"""

from __future__ import annotations

import re
from typing import Final, Literal

from email_validator import EmailNotValidError, validate_email

from common.errors import InvalidDestination, InvalidEmail

E164_RE: Final = re.compile(r"\+[1-9][0-9]{1,14}")
_EMAILISH: Final = re.compile(r"[^@\s]*@[^@\s]*")

Channel = Literal["email", "sms"]


def normalize_email(value: str) -> str:
    """``value`` with its domain lower-cased and IDNA-normalised (the local part is kept as
    typed; matching is case-insensitive on the whole address). Raises InvalidEmail."""
    if not isinstance(value, str) or len(value) > 320:
        raise InvalidEmail(details={"email": "must be an email address of at most 320 characters"})
    try:
        info = validate_email(value.strip(), check_deliverability=False)
    except EmailNotValidError as exc:
        raise InvalidEmail(f"The email address is not valid: {exc}") from None
    return info.normalized


def is_e164(value: str) -> bool:
    """True for an E.164 number written ``+<country code><subscriber number>``."""
    return E164_RE.fullmatch(value) is not None


def classify_destination(value: str) -> tuple[Channel, str]:
    """(channel, normalized destination) for a magic-link ``destination``.

    Raises InvalidEmail (422) for something that looks like an email (it holds an ``@``) but
    fails validation, InvalidDestination (400) for anything that is neither kind.
    """
    text = value.strip()
    if is_e164(text):
        return "sms", text
    if "@" in text:
        return "email", normalize_email(text)
    raise InvalidDestination()
