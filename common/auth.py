"""API keys: format, hashing, and the cached authenticator both services use.

Keys are ``sk_live_``/``sk_test_`` plus 32 random bytes in base62 (DESIGN.md); only their SHA-256
hex digest is stored. Lookups are cached for ``SERVICE_API_KEY_CACHE_SECONDS`` (default 1 s), and a
revocation published on Redis drops the entry at once, so a revoked key stops working everywhere
within a second even if a pub/sub message is lost. A successful authentication tags the current
(server) span with ``authio.project_id`` and ``authio.api_key_id``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Final

import asyncpg
from opentelemetry import trace
from redis.asyncio import Redis

from common.errors import InsufficientScope, InvalidApiKey, MissingApiKey

log = logging.getLogger("authio.auth")

KEY_PREFIXES: Final = ("sk_live_", "sk_test_")
SCOPES: Final = frozenset(
    {"users:read", "users:write", "organizations:write", "authz:check", "authz:write",
     "audit:read", "webhooks:write", "compliance:write", "risk:write", "keys:write"}
)
_B62: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SECRET_CHARS: Final = 43  # ceil(256 / log2(62))


def generate_secret(prefix: str) -> str:
    """A new plaintext key: ``prefix`` + 43 base62 characters (32 random bytes)."""
    n = int.from_bytes(secrets.token_bytes(32), "big")
    out = []
    for _ in range(_SECRET_CHARS):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return prefix + "".join(out)


def token_digest(token: str) -> bytes:
    """SHA-256 of a bearer token as stored (``magic_link_tokens``, ``refresh_tokens``): the
    plaintext exists only with its holder. Characters that are not UTF-8 (aiohttp keeps them as
    surrogate escapes) hash like any other instead of failing."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def hash_secret(secret: str) -> str:
    """SHA-256 hex digest of the plaintext key, as stored in ``api_keys.secret_hash``."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the API key, its project and tenant, its scopes (empty = full access)
    and its prefix (``sk_live_`` or ``sk_test_``)."""

    key_id: str
    project_id: str
    tenant_id: str
    scopes: frozenset[str]
    prefix: str = "sk_live_"

    def allows(self, scope: str) -> bool:
        """True when the key may use ``scope``."""
        return not self.scopes or scope in self.scopes

    def require(self, scope: str) -> None:
        """Raises InsufficientScope unless the key may use ``scope``."""
        if self.scopes and scope not in self.scopes:
            raise InsufficientScope(
                f"This API key lacks the scope {scope!r}.", details={"required_scopes": [scope]}
            )


def _tag_span(principal: Principal) -> None:
    """Tag the request's server span with the caller (SPEC.md 1.5); a no-op when not traced."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("authio.project_id", principal.project_id)
        span.set_attribute("authio.api_key_id", principal.key_id)


_LOOKUP_SQL: Final = """
SELECT k.id, k.project_id, p.tenant_id, k.scopes, k.prefix
FROM api_keys k JOIN projects p ON p.id = k.project_id
WHERE k.secret_hash = $1 AND k.revoked_at IS NULL
"""


class ApiKeyAuthenticator:
    """Resolves ``Authorization: Bearer <key>`` to a Principal, with a short TTL cache.

    Known keys live in a plain dict of digest -> (expiry on the monotonic clock, Principal): this
    runs on every engine check, and a hit costs one hash and one lookup. Unknown digests are
    remembered apart, in a smaller table, so a flood of made-up keys can neither evict real ones
    nor reach PostgreSQL more than once per TTL each. A cached entry expires ``ttl_seconds`` after
    the query that produced it *started*, and a lookup that was in flight when ``invalidate`` or
    ``clear`` ran is never cached, so a revocation cannot be undone by a slow reply.
    """

    def __init__(self, pool: asyncpg.Pool, *, ttl_seconds: float, maxsize: int = 100_000,
                 unknown_maxsize: int = 10_000) -> None:
        self._pool = pool
        self._ttl = ttl_seconds
        self._maxsize = maxsize
        self._unknown_maxsize = unknown_maxsize
        self._known: dict[str, tuple[float, Principal]] = {}
        self._unknown: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Future[Principal | None]] = {}
        self._generation = 0  # bumped by every invalidation

    async def authenticate(self, authorization: str | None) -> Principal:
        """Raises MissingApiKey (no Bearer token) or InvalidApiKey (unknown or revoked)."""
        if not authorization:
            raise MissingApiKey()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise MissingApiKey()
        if not token.startswith(KEY_PREFIXES):
            raise InvalidApiKey()
        digest = hash_secret(token)
        now = time.monotonic()
        entry = self._known.get(digest)
        if entry is not None and entry[0] > now:
            _tag_span(entry[1])
            return entry[1]
        if self._unknown.get(digest, 0.0) > now:
            raise InvalidApiKey()
        principal = await self._load(digest)
        if principal is None:
            raise InvalidApiKey()
        _tag_span(principal)
        return principal

    async def _load(self, digest: str) -> Principal | None:
        pending = self._inflight.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Principal | None] = asyncio.get_running_loop().create_future()
        self._inflight[digest] = fut
        generation, started = self._generation, time.monotonic()
        try:
            row = await self._pool.fetchrow(_LOOKUP_SQL, digest)
            principal = (
                None if row is None
                else Principal(row["id"], row["project_id"], row["tenant_id"],
                               frozenset(row["scopes"]), row["prefix"])
            )
            if generation == self._generation:
                self._remember(digest, principal, started + self._ttl)
            fut.set_result(principal)
            return principal
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved when nobody else waits
            raise
        finally:
            if self._inflight.get(digest) is fut:
                del self._inflight[digest]

    def _remember(self, digest: str, principal: Principal | None, expires: float) -> None:
        if principal is None:
            if len(self._unknown) >= self._unknown_maxsize:
                self._unknown.clear()
            self._unknown[digest] = expires
        else:
            if len(self._known) >= self._maxsize:
                self._known.clear()
            self._known[digest] = (expires, principal)

    def invalidate(self, digest: str) -> None:
        """Forget one key (called on a revocation message); later requests look it up afresh."""
        self._generation += 1
        self._known.pop(digest, None)
        self._inflight.pop(digest, None)

    def clear(self) -> None:
        """Forget every key (called when the revocation feed may have missed messages)."""
        self._generation += 1
        self._known.clear()
        self._unknown.clear()
        self._inflight.clear()


def revocation_channel(prefix: str) -> str:
    """Redis pub/sub channel carrying SHA-256 digests of revoked keys."""
    return f"{prefix}api_keys:revoked"


async def follow_revocations(redis: Redis, prefix: str, auth: ApiKeyAuthenticator) -> None:
    """Run forever: invalidate cached keys as revocations arrive, reconnecting on failure."""
    channel = revocation_channel(prefix)
    while True:
        try:
            async with redis.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                auth.clear()  # messages may have been missed while unsubscribed
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        auth.invalidate(data.decode() if isinstance(data, bytes) else str(data))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("revocation feed lost; retrying in 1 s", exc_info=True)
            await asyncio.sleep(1.0)
