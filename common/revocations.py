"""The session revocation set: how the control plane tells verifiers a session has ended.

Contract (SPEC.md 3, "revoked sessions are denied quickly at the edge"):

* set: the Redis sorted set :func:`set_key` (``<prefix>revoked_sessions``); member the session id,
  score the Unix time (seconds) until which an access token of that session could still verify:
  the latest access token's ``exp`` plus :data:`LEEWAY_SECONDS` (:func:`until`). A member past
  its score can be dropped: no token of its session verifies any more.
* channel: the Redis pub/sub channel :func:`channel` (``<prefix>session_revocations``); payload
  the session id. Each revocation is published there once it is in the set, so a verifier that
  mirrors the set in memory denies at once; one that (re)subscribes re-reads the whole set.
* writer: the control plane (``control_plane.sessions.revocation``), after the revocation has
  committed in PostgreSQL, which stays the source of truth. It keeps the sorted set
  :func:`announced_key` beside the set (member ``announced``, score the highest revocation id it
  announced there, written with the set in one ``MULTI``); when Redis comes back without it or
  behind (restarted without persistence, flushed, an older snapshot, a lagging replica
  promoted) it rebuilds the whole set from PostgreSQL and publishes every member again, so a
  verifier that re-read the set too early still hears of each.

Pure functions, no I/O.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from common.access_tokens import LEEWAY_SECONDS as TOKEN_LEEWAY_SECONDS

__all__ = ["LEEWAY_SECONDS", "announced_key", "channel", "set_key", "until"]

LEEWAY_SECONDS: Final = 60
"""Kept on every score beyond ``exp``: more than verifiers' clock leeway."""
assert LEEWAY_SECONDS >= TOKEN_LEEWAY_SECONDS


def set_key(prefix: str) -> str:
    """The sorted set of revoked sessions under the deployment's Redis key ``prefix``."""
    return f"{prefix}revoked_sessions"


def channel(prefix: str) -> str:
    """The pub/sub channel revocations are announced on."""
    return f"{prefix}session_revocations"


def announced_key(prefix: str) -> str:
    """The writer's high-water mark beside the set; missing or behind PostgreSQL, Redis has
    lost revocations."""
    return f"{set_key(prefix)}:announced"


def until(access_expires_at: datetime) -> datetime:
    """Until when a session whose latest access token expires ``access_expires_at`` must stay
    in the set (its score is this time in Unix seconds)."""
    return access_expires_at + timedelta(seconds=LEEWAY_SECONDS)
