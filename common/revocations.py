"""The session revocation set: how the control plane tells verifiers a session has ended.

Contract (SPEC.md 3, "revoked sessions are denied quickly at the edge"):

* set: the Redis sorted set :func:`set_key` (``<prefix>revoked_sessions``); member the session id,
  score the Unix time (seconds) until which an access token of that session could still verify:
  the latest access token's ``exp`` plus :data:`LEEWAY_SECONDS` (:func:`until`). A member past
  its score can be dropped: no token of its session verifies any more.
* channel: the Redis pub/sub channel :func:`channel` (``<prefix>session_revocations``); payload
  :func:`message`: the session id, a space, and the revocation's commit time in Unix seconds
  (decimal, millisecond precision), so a verifier can measure how late it heard (a bare session
  id is accepted too: :func:`parse_message`). Each revocation is published there once it is in
  the set, so a verifier that mirrors the set in memory denies at once; one that (re)subscribes
  re-reads the whole set.
* writer: the control plane (``control_plane.sessions.revocation``), after the revocation has
  committed in PostgreSQL, which stays the source of truth. It keeps the sorted set
  :func:`announced_key` beside the set (member ``announced``, score the highest revocation id it
  announced there, written with the set in one ``MULTI``); when Redis comes back without it or
  behind (restarted without persistence, flushed, an older snapshot, a lagging replica
  promoted) it rebuilds the whole set from PostgreSQL and publishes every member again, so a
  verifier that re-read the set too early still hears of each.

Pure functions and :class:`RevocationMirror` (the verifier's in-memory copy of the set), no
I/O: the engine fills the mirror from Redis (``engine.edge``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from common.access_tokens import LEEWAY_SECONDS as TOKEN_LEEWAY_SECONDS

__all__ = [
    "LEEWAY_SECONDS",
    "RevocationMirror",
    "announced_key",
    "channel",
    "message",
    "parse_message",
    "set_key",
    "until",
]

LEEWAY_SECONDS: Final = 60
"""Kept on every score beyond ``exp``: more than verifiers' clock leeway."""
assert LEEWAY_SECONDS >= TOKEN_LEEWAY_SECONDS


def set_key(prefix: str) -> str:
    """The sorted set of revoked sessions under the deployment's Redis key ``prefix``."""
    return f"{prefix}revoked_sessions"


def channel(prefix: str) -> str:
    """The pub/sub channel revocations are announced on."""
    return f"{prefix}session_revocations"


def message(session_id: str, revoked_at: datetime) -> str:
    """The channel payload announcing ``session_id``, revoked at ``revoked_at``."""
    return f"{session_id} {revoked_at.timestamp():.3f}"


def parse_message(text: str) -> tuple[str, float | None]:
    """``(session_id, revoked_at)`` of a channel payload, ``revoked_at`` in Unix seconds or None
    when the payload carries no (valid) time."""
    session_id, _, revoked_at = text.partition(" ")
    try:
        at = float(revoked_at) if revoked_at else None
    except ValueError:
        at = None
    return session_id, at


def announced_key(prefix: str) -> str:
    """The writer's high-water mark beside the set; missing or behind PostgreSQL, Redis has
    lost revocations."""
    return f"{set_key(prefix)}:announced"


def until(access_expires_at: datetime) -> datetime:
    """Until when a session whose latest access token expires ``access_expires_at`` must stay
    in the set (its score is this time in Unix seconds)."""
    return access_expires_at + timedelta(seconds=LEEWAY_SECONDS)


class RevocationMirror:
    """A verifier's copy of the revocation set: session id -> score (Unix seconds until which
    a token of that session could verify). :meth:`is_revoked` is one dict lookup.

    The owner loads it with :meth:`merge` (the whole set, at start and after every
    (re)subscription), adds announced sessions with :meth:`add`, and calls :meth:`prune` now and
    then to drop entries past their score."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def is_revoked(self, session_id: str) -> bool:
        """Whether ``session_id`` is in the set (an entry past its score may linger until the
        next :meth:`prune`; no token of its session verifies then anyway)."""
        return session_id in self._until

    def add(self, session_id: str, score: float) -> bool:
        """Mark ``session_id`` revoked until ``score`` (Unix seconds; a later score wins).
        Returns whether it was not revoked here before."""
        before = self._until.get(session_id)
        if before is None or before < score:
            self._until[session_id] = score
        return before is None

    def merge(self, entries: Iterable[tuple[str, float]]) -> None:
        """Add the whole set read from Redis, ``entries`` (member, score). Nothing is
        forgotten but by :meth:`prune`: a revocation is never undone, and a set that Redis lost
        (restarted without persistence) is rebuilt by its writer and announced again."""
        for session_id, score in entries:
            self.add(session_id, score)

    def prune(self, now: float | None = None) -> int:
        """Drop entries past their score (``now`` in Unix seconds, default the clock); returns
        how many were dropped."""
        now = time.time() if now is None else now
        stale = [sid for sid, score in self._until.items() if score < now]
        for sid in stale:
            del self._until[sid]
        return len(stale)
