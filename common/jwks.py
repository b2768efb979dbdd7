"""The JWKS source: every project's published verification keys, read from PostgreSQL.

Contract: the control plane writes ``signing_keys`` (``control_plane.signing_keys``); a key is
published while it is ``pending`` or ``active``, and once ``retired`` until its
``publish_until``; its ``public_jwk`` is the RFC 7517 public JWK with ``kid`` and ``alg``. Both
services verify access tokens against these keys (:mod:`common.access_tokens`) through a
:class:`PgKeySource`.
"""

from __future__ import annotations

from typing import Final

import asyncpg
from cachetools import TTLCache

from common.access_tokens import VerificationKey, public_key_from_jwk

__all__ = ["CACHE_SECONDS", "PgKeySource"]

CACHE_SECONDS: Final = 60.0
"""How long a looked-up key (or the absence of one) is remembered: a key's ``publish_until``
is set when it retires, so a verifier sees the retirement within this time."""

_SQL: Final = "SELECT project_id, alg, public_jwk, publish_until FROM signing_keys WHERE kid = $1"
_CACHE_SIZE: Final = 10_000


class PgKeySource:
    """Verification keys by ``kid`` from ``signing_keys``, each cached for ``ttl_seconds``. An
    unknown ``kid`` is remembered too, so forged tokens cost no query each."""

    def __init__(self, pool: asyncpg.Pool, *, ttl_seconds: float = CACHE_SECONDS) -> None:
        self._pool = pool
        self._cache: TTLCache[str, VerificationKey | None] = TTLCache(_CACHE_SIZE, ttl_seconds)

    async def get(self, kid: str) -> VerificationKey | None:
        """The published key ``kid``, or None. Raises what asyncpg raises when PostgreSQL is
        unreachable."""
        try:
            return self._cache[kid]
        except KeyError:
            pass
        row = await self._pool.fetchrow(_SQL, kid)
        key = None
        if row is not None:
            key = VerificationKey(kid, row["project_id"], row["alg"],
                                  public_key_from_jwk(row["public_jwk"]), row["publish_until"])
        self._cache[kid] = key
        return key
