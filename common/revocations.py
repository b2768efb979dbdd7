"""The session revocation set: how the control plane tells verifiers a session has ended.

Contract (SPEC.md 3, "revoked sessions are denied quickly at the edge"):

* set: the Redis sorted set :func:`set_key` (``<prefix>revoked_sessions``); member the session id,
  score the Unix time (seconds) until which an access token of that session could still verify:
  the latest access token's ``exp`` plus :data:`LEEWAY_SECONDS` (:func:`revoked`). A member past
  its score can be dropped: no token of its session verifies any more.
* channel: the Redis pub/sub channel :func:`channel` (``<prefix>session_revocations``); payload
  the session id. Each revocation is published there once it is in the set, so a verifier that
  mirrors the set in memory denies at once; one that (re)subscribes re-reads the whole set.
* writer: the control plane (``control_plane.sessions.revocation``), after the revocation has
  committed in PostgreSQL, which stays the source of truth.

Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from common.access_tokens import LEEWAY_SECONDS as TOKEN_LEEWAY_SECONDS

__all__ = ["LEEWAY_SECONDS", "Revoked", "channel", "revoked", "set_key"]

LEEWAY_SECONDS: Final = 60
"""Kept on every score beyond ``exp``: more than verifiers' clock leeway."""
assert LEEWAY_SECONDS >= TOKEN_LEEWAY_SECONDS


@dataclass(frozen=True, slots=True)
class Revoked:
    """A revoked session and the Unix time until which its access tokens could still verify."""

    session_id: str
    until: int


def set_key(prefix: str) -> str:
    """The sorted set of revoked sessions under the deployment's Redis key ``prefix``."""
    return f"{prefix}revoked_sessions"


def channel(prefix: str) -> str:
    """The pub/sub channel revocations are announced on."""
    return f"{prefix}session_revocations"


def revoked(session_id: str, access_expires_at: datetime) -> Revoked:
    """The set member of ``session_id`` whose latest access token expires ``access_expires_at``."""
    return Revoked(session_id, int(access_expires_at.timestamp()) + LEEWAY_SECONDS)
