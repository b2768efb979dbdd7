"""Resource ids: a type prefix plus a 26-character ULID in lowercase Crockford base32.

DESIGN.md "Conventions": ``ten_``, ``proj_``, ``key_``, ``user_``, ``org_``, ``mem_``, ``inv_``,
``sess_``, ``store_``, ``dsr_``, ``evt_``, ``whep_``, ``strm_``, ``rd_``, ``chal_``, ``req_``; and
ours for records the spec does not name: ``msg_`` (outbox messages), ``kid_`` (signing key ids),
``pk_`` (passkeys), ``dlv_`` (webhook deliveries), ``inc_`` (incidents), ``mw_`` (maintenance
windows), ``sct_`` (SCIM tokens), ``grp_`` (SCIM groups), ``opr_`` (dashboard operators).
The admin portal's setup links are ``plk_``.
ULIDs sort by creation time (millisecond precision), which keyset pagination relies on.
"""

from __future__ import annotations

import random
import re
import time
from typing import Final

from ulid import ULID

PREFIXES: Final = frozenset(
    {"ten", "proj", "key", "user", "org", "mem", "inv", "sess", "store", "dsr", "evt", "whep",
     "plk",
     "strm", "rd", "chal", "req", "msg", "kid", "pk", "dlv", "inc", "mw", "devauth", "impc",
     "rcv", "sct", "grp", "opr"}
)
_ID_RE: Final = re.compile(r"([a-z]+)_([0-9a-hjkmnp-tv-z]{26})")

PATH_IDS: Final = {"store_id": "store", "key_id": "key", "user_id": "user", "org_id": "org",
                   "membership_id": "mem", "invitation_id": "inv", "passkey_id": "pk",
                   "decision_id": "rd", "endpoint_id": "whep", "delivery_id": "dlv",
                   "stream_id": "strm", "dsr_id": "dsr", "incident_id": "inc",
                   "window_id": "mw", "credential_id": "impc", "recovery_id": "rcv",
                   "group_id": "grp", "operator_id": "opr"}
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


class _MonotonicUlids:
    """Request ids made cheaply: ULIDs generated monotonically, as the ULID spec allows.

    The first id of each millisecond takes a fresh random 79-bit value (the top bit left clear,
    so increments never overflow within a millisecond); the next ones in the same millisecond
    add one to it. Their text is the millisecond's 10 characters plus the random part's, and
    only the last 4 characters (20 bits) are spelled per id: the rest is kept until a carry
    changes it. Every id is unique within the process and sorts after the previous one; across
    processes a collision would need the same millisecond and overlapping 79-bit random runs.
    The random part is not secret (request ids are echoed to every caller), so the standard
    generator seeds it (reseeded in a forked child by Python itself)."""

    __slots__ = ("head", "high", "ms", "prefix", "rand", "stamp")

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}_"
        self.ms = -1
        self.rand = 0
        self.high = -1
        self.stamp = ""  # prefix + the millisecond's 10 characters
        self.head = ""  # stamp + the random part's first 12 characters

    def __call__(self) -> str:
        ms = time.time_ns() // 1_000_000
        p = _PAIRS  # spelled out below: a list comprehension is a call of its own in 3.11
        if ms > self.ms:
            self.ms = ms
            self.rand = rand = random.getrandbits(79)
            self.stamp = (self.prefix + p[ms >> 40 & 1023] + p[ms >> 30 & 1023]
                          + p[ms >> 20 & 1023] + p[ms >> 10 & 1023] + p[ms & 1023])
            self.high = -1
        else:  # same millisecond, or the clock went back: the next value of the run
            self.rand = rand = self.rand + 1
        high = rand >> 20
        if high != self.high:
            self.high = high
            self.head = (self.stamp + p[high >> 50 & 1023] + p[high >> 40 & 1023]
                         + p[high >> 30 & 1023] + p[high >> 20 & 1023] + p[high >> 10 & 1023]
                         + p[high & 1023])
        return self.head + p[rand >> 10 & 1023] + p[rand & 1023]


new_request_id: Final = _MonotonicUlids("req")
"""``req_<ulid>`` for a request that came without a usable ``X-Request-Id``: the same shape as
``new_id("req")`` at a tenth of its cost (:class:`_MonotonicUlids`; every response carries one)."""


def id_pattern(prefix: str) -> str:
    """The JSON Schema ``pattern`` of an id carrying ``prefix``."""
    return f"^{prefix}_[0-9a-hjkmnp-tv-z]{{26}}$"


def is_id(value: str, prefix: str) -> bool:
    """True when ``value`` is a well-formed id carrying ``prefix``."""
    m = _ID_RE.fullmatch(value)
    return m is not None and m.group(1) == prefix
