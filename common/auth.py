"""API keys: format, hashing, and the cached authenticator both services use.

Keys are ``sk_live_``/``sk_test_`` plus 32 random bytes in base62 (DESIGN.md); only their SHA-256
hex digest is stored. Lookups are cached for ``SERVICE_API_KEY_CACHE_SECONDS`` (default 1 s), and a
revocation published on Redis drops the entry at once, so a revoked key stops working everywhere
within a second even if a pub/sub message is lost. While PostgreSQL cannot be reached, keys the
process already knows keep working (see :class:`ApiKeyAuthenticator`). A successful
authentication tags the current (server) span with ``authio.project_id`` and
``authio.api_key_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Final

import asyncpg
from opentelemetry import trace
from redis.asyncio import Redis

from common.db import DatabaseUnresponsive, follow_channel, is_connection_error
from common.errors import InsufficientScope, InvalidApiKey, MissingApiKey
from common.telemetry import traces_requests

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
    """Who is calling: the API key, its project and tenant, its scopes (empty = full access),
    its prefix (``sk_live_`` or ``sk_test_``) and its project's name (read with the key, and
    never changed after the project's creation: what an enrollment message names without a
    lookup of its own)."""

    key_id: str
    project_id: str
    tenant_id: str
    scopes: frozenset[str]
    prefix: str
    project_name: str

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
    """Tag the request's server span with the caller (SPEC.md 1.5); a no-op when not traced
    (without tracing set up, not even the context lookup: it is on every API-key request)."""
    if not traces_requests():
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("authio.project_id", principal.project_id)
        span.set_attribute("authio.api_key_id", principal.key_id)


_LOOKUP_SQL: Final = """
SELECT k.id, k.project_id, p.tenant_id, k.scopes, k.prefix, p.name AS project_name
FROM api_keys k JOIN projects p ON p.id = k.project_id
WHERE k.secret_hash = $1 AND k.revoked_at IS NULL
"""


STALE_GRACE_SECONDS: Final = 300.0
"""During a PostgreSQL outage, keys confirmed by PostgreSQL at most this long before the outage
began keep working."""
LOOKUP_WAIT_SECONDS: Final = 1.0
"""How long a request waits for a key's lookup before PostgreSQL counts as away for it (a server
that is stopped or cut off answers nothing, and the pool's own timeouts are far longer)."""


class ApiKeyAuthenticator:
    """Resolves ``Authorization: Bearer <key>`` to a Principal, with a short TTL cache.

    Known keys live in a plain dict of digest -> (expiry on the monotonic clock, Principal, when
    PostgreSQL last confirmed it): this runs on every engine check, and a hit costs two dict
    lookups (the digest of a key already answered is remembered by the key, so the SHA-256 is
    computed once per key, not per request). Unknown digests are remembered apart, in a smaller
    table, so a flood of made-up keys can neither evict real ones nor reach PostgreSQL more than
    once per TTL each. A cached entry expires ``ttl_seconds`` after the query that produced it
    *started*, and a lookup that was in flight when ``invalidate`` or ``clear`` ran is never
    cached, so a revocation cannot be undone by a slow reply.

    **PostgreSQL away.** When a lookup fails because PostgreSQL cannot be reached, or gives no
    answer within ``lookup_wait_seconds`` (the query goes on in the background and its answer is
    still taken), a key this process knows (confirmed at most ``stale_grace_seconds`` before the
    outage began, and not invalidated since) is served as it was, and PostgreSQL is asked again
    once per TTL, in the background: no request waits on a database known to be away. An engine
    thus keeps answering checks from memory. A key it does not know cannot be told valid or not:
    the lookup's error stands (503 ``db_unavailable``, never 401). Revocations still win the
    moment they are seen: a revocation on Redis drops the key (``invalidate``), as does a lookup
    once PostgreSQL answers again.
    """

    def __init__(self, pool: asyncpg.Pool, *, ttl_seconds: float, maxsize: int = 100_000,
                 unknown_maxsize: int = 10_000,
                 stale_grace_seconds: float = STALE_GRACE_SECONDS,
                 lookup_wait_seconds: float = LOOKUP_WAIT_SECONDS) -> None:
        self._pool = pool
        self._ttl = ttl_seconds
        self._lookup_wait = lookup_wait_seconds
        self._maxsize = maxsize
        self._unknown_maxsize = unknown_maxsize
        self._stale_grace = stale_grace_seconds
        self._known: dict[str, tuple[float, Principal, float]] = {}
        # The digest of each key answered from ``_known``, by the key itself: a hit then costs two
        # dict lookups and no SHA-256. Only keys that were known get in (a flood of made-up keys
        # cannot fill it), and it needs no invalidation: a key's digest never changes, and
        # whether the digest is still good is ``_known``'s business.
        self._digests: dict[str, str] = {}
        self._unknown: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[Principal | None]] = {}
        self._generation = 0  # bumped by every invalidation
        self._outage_since: float | None = None  # the first failed lookup since the last answer
        self._background: set[asyncio.Task[None]] = set()

    @property
    def outage(self) -> bool:
        """True while the last lookup failed for want of PostgreSQL."""
        return self._outage_since is not None

    async def authenticate(self, authorization: str | None) -> Principal:
        """Raises MissingApiKey (no Bearer token) or InvalidApiKey (unknown or revoked); the
        lookup's own error when PostgreSQL cannot be reached and the key is not known."""
        if not authorization:
            raise MissingApiKey()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise MissingApiKey()
        if not token.startswith(KEY_PREFIXES):
            raise InvalidApiKey()
        remembered = self._digests.get(token)
        digest = remembered or hash_secret(token)
        now = time.monotonic()
        entry = self._known.get(digest)
        if entry is not None and entry[0] > now:
            if remembered is None:
                if len(self._digests) >= self._maxsize:
                    self._digests.clear()
                self._digests[token] = digest
            _tag_span(entry[1])
            return entry[1]
        if self._unknown.get(digest, 0.0) > now:
            raise InvalidApiKey()
        if entry is not None and self._outage_since is not None and self._usable(entry):
            # PostgreSQL is away: answer from what we know, and ask it again in the background.
            self._remember(digest, entry[1], now + self._ttl, entry[2])
            if digest not in self._inflight:
                task = asyncio.create_task(self._revalidate(digest))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            _tag_span(entry[1])
            return entry[1]
        principal = await self._load(digest)
        if principal is None:
            raise InvalidApiKey()
        _tag_span(principal)
        return principal

    def _usable(self, entry: tuple[float, Principal, float]) -> bool:
        """Whether a known entry may stand in for PostgreSQL during the current outage."""
        since = self._outage_since
        return since is not None and entry[2] >= since - self._stale_grace

    async def _revalidate(self, digest: str) -> None:
        with contextlib.suppress(Exception):
            await self._load(digest)

    async def _load(self, digest: str) -> Principal | None:
        """The key's principal (None: unknown or revoked) by one lookup shared by every request
        asking meanwhile, waited for at most ``lookup_wait_seconds``; on a connection error or
        no answer in time, the known principal standing in, else the error."""
        started = time.monotonic()
        lookup = self._inflight.get(digest)
        if lookup is None:
            lookup = asyncio.create_task(self._lookup(digest, self._generation, started))
            self._inflight[digest] = lookup
            lookup.add_done_callback(lambda done: self._lookup_done(digest, done))
        try:
            async with asyncio.timeout(self._lookup_wait):
                return await asyncio.shield(lookup)
        except Exception as exc:
            error: Exception = exc
            if isinstance(exc, TimeoutError):
                if lookup.done() and not lookup.cancelled():
                    # It finished as the wait ran out: its own outcome, not the timeout's.
                    found = lookup.exception()
                    if found is None:
                        return lookup.result()
                    error = found if isinstance(found, Exception) else exc
                else:
                    error = DatabaseUnresponsive(
                        f"the API-key lookup got no answer within {self._lookup_wait} s")
        stale = self._stand_in(digest, error, started)
        if stale is None:
            raise error
        return stale

    async def _lookup(self, digest: str, generation: int, started: float) -> Principal | None:
        """Ask PostgreSQL; remember the answer unless an invalidation came meanwhile."""
        row = await self._pool.fetchrow(_LOOKUP_SQL, digest)
        self._outage_since = None
        principal = (
            None if row is None
            else Principal(row["id"], row["project_id"], row["tenant_id"],
                           frozenset(row["scopes"]), row["prefix"], row["project_name"])
        )
        if generation == self._generation:
            self._remember(digest, principal, started + self._ttl, started)
        return principal

    def _lookup_done(self, digest: str, lookup: asyncio.Task[Principal | None]) -> None:
        if self._inflight.get(digest) is lookup:
            del self._inflight[digest]
        if not lookup.cancelled():
            lookup.exception()  # retrieved: whoever waited saw it, or stopped waiting

    def _stand_in(self, digest: str, exc: Exception, started: float) -> Principal | None:
        """After a failed lookup: the known principal to serve instead, when PostgreSQL is away
        and the key is known (and not invalidated meanwhile: ``invalidate`` removes it)."""
        if not is_connection_error(exc):
            return None
        if self._outage_since is None:
            self._outage_since = started
            log.warning("PostgreSQL is unreachable; known API keys keep working meanwhile")
        entry = self._known.get(digest)
        if entry is None or not self._usable(entry):
            return None
        self._remember(digest, entry[1], time.monotonic() + self._ttl, entry[2])
        return entry[1]

    def _remember(self, digest: str, principal: Principal | None, expires: float,
                  confirmed: float) -> None:
        if principal is None:
            self._known.pop(digest, None)  # revoked: no longer a stand-in during an outage
            if len(self._unknown) >= self._unknown_maxsize:
                self._unknown.clear()
            self._unknown[digest] = expires
        else:
            if len(self._known) >= self._maxsize:
                self._known.clear()
            self._known[digest] = (expires, principal, confirmed)

    def invalidate(self, digest: str) -> None:
        """Forget one key (called on a revocation message); later requests look it up afresh,
        and it no longer stands in for PostgreSQL."""
        self._generation += 1
        self._known.pop(digest, None)
        self._inflight.pop(digest, None)

    def clear(self) -> None:
        """Look every key up afresh (called when the revocation feed may have missed messages):
        every cached answer expires at once. Known keys are expired, not forgotten: a revocation
        missed is no revocation seen, so while PostgreSQL is away they still stand in for it
        (a feed that reconnects during a database outage must not turn checks into 503s)."""
        self._generation += 1
        self._known = {digest: (0.0, principal, confirmed)
                       for digest, (_, principal, confirmed) in self._known.items()}
        self._unknown.clear()
        self._inflight.clear()


def revocation_channel(prefix: str) -> str:
    """Redis pub/sub channel carrying SHA-256 digests of revoked keys."""
    return f"{prefix}api_keys:revoked"


class _ForgetOnReconnect:
    """A connect callback for the revocation feed's connection (redis-py keeps it as a weak
    method): redis-py reconnects a pub/sub connection and subscribes again by itself, and any
    revocation published while it was away was missed, so the cache is forgotten each time."""

    def __init__(self, auth: ApiKeyAuthenticator) -> None:
        self.auth = auth

    def connected(self, _connection: object) -> None:
        self.auth.clear()


async def follow_revocations(redis: Redis, prefix: str, auth: ApiKeyAuthenticator) -> None:
    """Run forever: invalidate cached keys as revocations arrive on :func:`revocation_channel`.

    Whenever the subscription may have missed a message (the first subscription, every
    reconnection redis-py makes by itself, and every one made here after it gave up) the whole
    cache is forgotten, so a key revoked while Redis was away is looked up again at once."""
    hook = _ForgetOnReconnect(auth)

    async def subscribed() -> None:
        auth.clear()  # messages may have been missed while unsubscribed

    await follow_channel(redis, revocation_channel(prefix), on_message=auth.invalidate,
                         on_subscribed=subscribed, on_reconnect=hook.connected,
                         what="API-key revocation feed", logger=log)
