"""Resource ids: a type prefix plus a 26-character ULID in lowercase Crockford base32.

DESIGN.md "Conventions": ``ten_``, ``proj_``, ``key_``, ``user_``, ``org_``, ``mem_``, ``inv_``,
``sess_``, ``store_``, ``dsr_``, ``evt_``, ``whep_``, ``strm_``, ``rd_``, ``chal_``, ``req_``; and
ours for records the spec does not name: ``msg_`` (outbox messages), ``kid_`` (signing key ids),
``pk_`` (passkeys).
ULIDs sort by creation time (millisecond precision), which keyset pagination relies on.
"""

from __future__ import annotations

import re
from typing import Final

from ulid import ULID

PREFIXES: Final = frozenset(
    {"ten", "proj", "key", "user", "org", "mem", "inv", "sess", "store", "dsr", "evt", "whep",
     "strm", "rd", "chal", "req", "msg", "kid", "pk"}
)
_ID_RE: Final = re.compile(r"([a-z]+)_([0-9a-hjkmnp-tv-z]{26})")

PATH_IDS: Final = {"store_id": "store", "key_id": "key", "user_id": "user", "org_id": "org",
                   "membership_id": "mem", "invitation_id": "inv", "passkey_id": "pk"}
"""The path parameters of the API, each naming a resource by its id, and the prefix of that id
(the routes declare no others; the OpenAPI document gives each the pattern of :func:`id_pattern`)."""


_CROCKFORD: Final = "0123456789abcdefghjkmnpqrstvwxyz"
# Every 10-bit value spelled as two characters: a ULID's 130 bits of text are 13 table lookups
# (python-ulid's encoder loops per character: 2.2 us per id, and every response carries an id).
_PAIRS: Final = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)
_SHIFTS: Final = tuple(range(120, -1, -10))


def encode_ulid(raw: bytes) -> str:
    """The 26-character lowercase Crockford base32 spelling of a 16-byte ULID."""
    n = int.from_bytes(raw, "big")
    pairs = _PAIRS
    return "".join([pairs[(n >> shift) & 1023] for shift in _SHIFTS])


def new_id(prefix: str) -> str:
    """Return ``<prefix>_<ulid>``, e.g. ``store_01j9zq...`` (31+ characters).

    Raises ValueError for a prefix outside DESIGN.md's table.
    """
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    return f"{prefix}_{encode_ulid(ULID().bytes)}"


def id_pattern(prefix: str) -> str:
    """The JSON Schema ``pattern`` of an id carrying ``prefix``."""
    return f"^{prefix}_[0-9a-hjkmnp-tv-z]{{26}}$"


def is_id(value: str, prefix: str) -> bool:
    """True when ``value`` is a well-formed id carrying ``prefix``."""
    m = _ID_RE.fullmatch(value)
    return m is not None and m.group(1) == prefix
