"""Schema types several domains share: free-form metadata, contact addresses, and the answer of
a deletion.

Contacts (SPEC.md 4 and 7): email syntax is checked by ``email-validator`` (RFC 5322 / 6531
addresses as deliverable mail systems accept them; no DNS lookup on the request path), a bad one
refused as ``invalid_email`` (422). Phone numbers must be E.164 as written: ``+``, a country code
not starting with 0, at most 15 digits in all (ITU-T E.164).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import orjson
from email_validator import EmailNotValidError, validate_email
from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from common.errors import InvalidDestination, InvalidEmail
from common.openapi import JSON_VALUE_REF, NO_NUL_PATTERN
from common.schemas import refusal

MAX_METADATA_BYTES: Final = 16 * 1024
MAX_METADATA_DEPTH: Final = 32
"""Deepest nesting of a metadata object (itself level 1). Far below what it could be written
back at: orjson stops serializing past 254 levels, and a user or organization nests it further."""
MAX_EMAIL_LENGTH: Final = 320
E164_RE: Final = re.compile(r"\+[1-9][0-9]{1,14}")

Channel = Literal["email", "sms"]
"""Where a message goes: an email address or a phone number."""


def _depth(value: object) -> int:
    """How deep ``value`` nests objects and arrays (a scalar: 0). Iterative: JSON from a body
    nests up to 1024 levels, beyond Python's recursion limit."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def _metadata_size(value: dict[str, Any]) -> dict[str, Any]:
    if _depth(value) > MAX_METADATA_DEPTH:
        raise ValueError(f"must nest at most {MAX_METADATA_DEPTH} levels")
    size = len(orjson.dumps(value))
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON, got {size}")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(_metadata_size), WithJsonSchema({
    "type": "object", "propertyNames": {"pattern": NO_NUL_PATTERN},
    "additionalProperties": {"$ref": JSON_VALUE_REF},
    "description": "A free-form JSON object of at most 16 KiB serialized, nesting at most 32 "
                   "levels (the object itself is the first); no string or key holds NUL."})]


def normalize_email(value: str) -> str:
    """``value`` with its domain lower-cased and IDNA-normalised (the local part is kept as
    typed; matching is case-insensitive on the whole address). Raises InvalidEmail."""
    if len(value) > MAX_EMAIL_LENGTH:
        raise InvalidEmail(details={"email": "must be an email address of at most 320 characters"})
    try:
        info = validate_email(value.strip(), check_deliverability=False)
    except EmailNotValidError as exc:
        raise InvalidEmail(f"The email address is not valid: {exc}") from None
    return info.normalized


def _email(value: str) -> str:
    try:
        return normalize_email(value)
    except InvalidEmail as err:
        raise refusal(InvalidEmail, err.message, err.details or None) from None


Email = Annotated[str, AfterValidator(_email), WithJsonSchema(
    {"type": "string", "format": "email", "maxLength": MAX_EMAIL_LENGTH})]
"""An email address, normalized; a bad one is ``invalid_email`` (422)."""


def is_e164(value: str) -> bool:
    """True for an E.164 number written ``+<country code><subscriber number>``."""
    return E164_RE.fullmatch(value) is not None


def _e164(value: str) -> str:
    if not is_e164(value):
        raise ValueError("must be an E.164 phone number such as +14155550100")
    return value


PhoneNumber = Annotated[str, AfterValidator(_e164), WithJsonSchema(
    {"type": "string", "pattern": r"^\+[1-9][0-9]{1,14}$"})]
"""An E.164 phone number such as ``+14155550100``."""


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


def _destination(value: object) -> tuple[Channel, str]:
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    if len(value) > MAX_EMAIL_LENGTH:
        raise ValueError(f"String should have at most {MAX_EMAIL_LENGTH} characters")
    try:
        return classify_destination(value)
    except (InvalidEmail, InvalidDestination) as err:
        raise refusal(type(err), err.message, err.details or None) from None


Destination = Annotated[tuple[Channel, str], BeforeValidator(_destination), WithJsonSchema({
    "anyOf": [{"type": "string", "format": "email", "maxLength": MAX_EMAIL_LENGTH},
              {"type": "string", "pattern": r"^\s*\+[1-9][0-9]{1,14}\s*$"}],
    "description": "An email address or an E.164 phone number such as +14155550100."})]
"""A message destination: (``email`` or ``sms``, the normalized address)."""


@dataclass(frozen=True, slots=True)
class Deleted:
    """The answer of a deletion: the id, and ``deleted: true``."""

    id: str
    deleted: bool = True
