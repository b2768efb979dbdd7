"""The judgement of a session at the edge, request-free: is this access token a live session of
these projects? Used by ``engine.edge`` (one :class:`SessionJudge` per app, built when edge
validation starts) and by ``bench/bench_edge.py`` to measure it in process.

Order of judgement (DESIGN.md "edge validation"): no token is ``no_session``; then the token
(``signature``: malformed, unknown key, bad signature or claims, a key retired past its
``publish_until``; ``expired``), the pinned projects (``project``), the revocation set
(``revoked``). Verified tokens are remembered until they expire, so a repeated token costs a
dict lookup, the key's publication test and the revocation test, not a signature verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import islice
from typing import Final

from common.access_tokens import LEEWAY_SECONDS, AccessClaims, InvalidToken, verify_access_token
from common.errors import InvalidSession, NoSession
from common.jwks import PublishedKeys
from common.revocations import RevocationMirror

__all__ = ["EVICT_FRACTION", "MAX_VERIFIED", "SessionJudge"]

MAX_VERIFIED: Final = 100_000
"""Most verified tokens remembered. At the cap the oldest :data:`EVICT_FRACTION` are dropped in
insertion order (which roughly follows expiry: every token lives as long), so the cost is paid
once per that many new tokens, and the tokens in use stay verified."""
EVICT_FRACTION: Final = 0.1


def _invalid_session(reason: str, message: str) -> InvalidSession:
    return InvalidSession(message, details={"reason": reason})


@dataclass(frozen=True, slots=True)
class SessionJudge:
    """What judging a session needs, none of it per request: the verified-token cache, every
    project's keys, the issuer tokens must name, the revocation mirror. Built per app from its
    state, and by ``bench/bench_edge.py`` to measure validation in process."""

    cache: dict[str, AccessClaims]
    keys: PublishedKeys
    issuer: str
    revocations: RevocationMirror
    max_verified: int = MAX_VERIFIED

    def remembered(self, token: str, now: float) -> AccessClaims | None:
        """The claims of ``token`` when it was verified before (its key re-checked in memory),
        else None; ``now`` in Unix seconds. Raises InvalidSession (``signature``: its key is
        retired past its overlap or deleted; ``expired``), forgetting the token."""
        claims = self.cache.get(token)
        if claims is None:
            return None
        if not self.keys.still_published(claims.kid, now):
            del self.cache[token]
            raise _invalid_session("signature", "The access token's signing key is no longer "
                                                "published.")
        if claims.exp + LEEWAY_SECONDS >= now:
            return claims
        del self.cache[token]
        raise _invalid_session("expired", "The access token has expired.")

    async def claims(self, token: str) -> AccessClaims:
        """The verified claims of ``token``: remembered (:meth:`remembered`), else verified
        and remembered. Raises InvalidSession (``signature`` or ``expired``)."""
        claims = self.remembered(token, time.time())
        return claims if claims is not None else await self._verify(token)

    async def _verify(self, token: str) -> AccessClaims:
        try:
            claims = await verify_access_token(token, keys=self.keys, issuer=self.issuer)
        except InvalidToken as exc:
            reason = "expired" if exc.reason == "expired" else "signature"
            raise _invalid_session(reason, exc.message) from None
        cache = self.cache
        if len(cache) >= self.max_verified:
            for oldest in list(islice(cache, max(1, int(self.max_verified * EVICT_FRACTION)))):
                del cache[oldest]
        cache[token] = claims
        return claims

    async def session(self, token: str | None, pins: tuple[str, ...] = ()) -> AccessClaims:
        """Judge the session of ``token`` (of every project in ``pins``): its claims, or
        NoSession (no token) or InvalidSession (``details.reason``: ``signature``,
        ``expired``, ``project``, ``revoked``, in that order of judgement)."""
        if token is None:
            raise NoSession("No session: send the access token as a Bearer token or the "
                            "service_session cookie.")
        # A remembered token (the usual case) is judged without another coroutine.
        claims = self.remembered(token, time.time())
        if claims is None:
            claims = await self._verify(token)
        if pins and any(pin != claims.pid for pin in pins):
            raise _invalid_session("project", "The session belongs to another project.")
        if self.revocations.is_revoked(claims.sid):
            raise _invalid_session("revoked", "The session has been revoked.")
        return claims
