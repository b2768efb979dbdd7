"""Access tokens: signing and verifying the session JWT (SPEC.md 2 "Access token", DESIGN.md).

The token carries exactly the claims of SPEC.md 2 — ``iss`` (the service's base URL), ``aud``
(``"service"``), ``sub``, ``act_org`` and ``act_role`` (only when an organization is selected),
``sid``, ``iat``, ``nbf = iat``, ``exp = iat + access_token_ttl_seconds`` — plus ``pid`` (the
project id, so a verifier rejects another project's tokens). Header: ``alg`` (EdDSA or RS256,
the signing key's), ``kid``, ``typ: "JWT"``.

Hot path (sign-in and refresh at thousands per second): private keys are unsealed once per
``kid`` and kept in memory; the project's active ``kid`` is cached for ``ACTIVE_CACHE_SECONDS``
(a rotation by another process is picked up that quickly; the retired key stays published long
past that), so issuing a token costs no database query while the cache is warm. Verification
keys are cached per ``kid`` for ``VERIFY_CACHE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import asyncpg
import jwt
from cachetools import LRUCache, TTLCache

from common.errors import NoSession
from common.ids import is_id
from common.settings import Settings
from control_plane.kms import LocalKms
from control_plane.signing_keys import (
    ALGS,
    PrivateKey,
    PublicKey,
    ensure_active_key,
    open_private_key,
    public_key_from_jwk,
)

AUDIENCE: Final = "service"
LEEWAY_SECONDS: Final = 30
ACTIVE_CACHE_SECONDS: Final = 5.0
VERIFY_CACHE_SECONDS: Final = 60.0
REQUIRED_CLAIMS: Final = ("iss", "aud", "sub", "sid", "iat", "nbf", "exp", "pid")
_CACHE_SIZE: Final = 10_000


@dataclass(frozen=True, slots=True)
class AccessClaims:
    """The verified claims of an access token (Unix seconds for ``iat`` and ``exp``)."""

    sub: str
    sid: str
    pid: str
    act_org: str | None
    act_role: str | None
    iat: int
    exp: int
    kid: str


@dataclass(frozen=True, slots=True)
class _Signer:
    kid: str
    alg: str
    key: PrivateKey


@dataclass(frozen=True, slots=True)
class _Active:
    signer: _Signer
    fresh_until: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class _Verifier:
    project_id: str
    alg: str
    key: PublicKey
    publish_until: datetime | None


def _invalid(message: str = "The access token is not valid.") -> NoSession:
    return NoSession(message, details={"reason": "token_invalid"})


class TokenService:
    """Issues and verifies access JWTs with the projects' signing keys (one per process, in the
    app state under ``control_plane.appkeys.TOKENS``)."""

    def __init__(self, pool: asyncpg.Pool, kms: LocalKms, settings: Settings, *,
                 active_cache_seconds: float = ACTIVE_CACHE_SECONDS,
                 verify_cache_seconds: float = VERIFY_CACHE_SECONDS) -> None:
        self._pool, self._kms, self._settings = pool, kms, settings
        self._issuer = settings.public_base_url
        self._ttl = settings.access_token_ttl_seconds
        self._active_seconds = active_cache_seconds
        self._active: dict[str, _Active] = {}
        self._loading: dict[str, asyncio.Task[_Signer]] = {}
        self._signers: LRUCache[str, _Signer] = LRUCache(_CACHE_SIZE)
        self._verifiers: TTLCache[str, _Verifier | None] = TTLCache(_CACHE_SIZE, verify_cache_seconds)

    # --- issuing --------------------------------------------------------------------------------

    async def issue(self, *, project_id: str, user_id: str, session_id: str, org_id: str | None,
                    role: str | None, iat: int) -> str:
        """The signed access JWT for a session (claims above; ``act_org``/``act_role`` only when
        ``org_id`` is given). Creates the project's first signing key when it has none.
        Raises ProjectNotFound for an unknown project."""
        signer = await self._signer(project_id)
        claims: dict[str, Any] = {"iss": self._issuer, "aud": AUDIENCE, "sub": user_id}
        if org_id is not None:
            claims["act_org"] = org_id
            if role is not None:
                claims["act_role"] = role
        claims.update(sid=session_id, iat=iat, nbf=iat, exp=iat + self._ttl, pid=project_id)
        return jwt.encode(claims, signer.key, algorithm=signer.alg,
                          headers={"kid": signer.kid, "typ": "JWT"})

    def forget(self, project_id: str) -> None:
        """Drop the cached active key of ``project_id`` (after this process rotated it), so the
        next token is signed with the new key at once."""
        self._active.pop(project_id, None)

    async def _signer(self, project_id: str) -> _Signer:
        cached = self._active.get(project_id)
        if cached is not None and cached.fresh_until > time.monotonic():
            return cached.signer
        # One load per project at a time, however many requests are waiting for it.
        task = self._loading.get(project_id)
        if task is None:
            task = asyncio.create_task(self._load_active(project_id), name=project_id)
            self._loading[project_id] = task
            task.add_done_callback(self._loaded)
        return await asyncio.shield(task)

    def _loaded(self, task: asyncio.Task[_Signer]) -> None:
        self._loading.pop(task.get_name(), None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter gets it, and none may be left

    async def _load_active(self, project_id: str) -> _Signer:
        row = await ensure_active_key(self._pool, self._kms, project_id)
        signer = self._signers.get(row["kid"])
        if signer is None:
            signer = _Signer(row["kid"], row["alg"],
                             open_private_key(self._kms, row["kid"], row["private_sealed"]))
            self._signers[signer.kid] = signer
        self._active[project_id] = _Active(signer, time.monotonic() + self._active_seconds)
        return signer

    # --- verifying ------------------------------------------------------------------------------

    async def verify(self, token: str) -> AccessClaims:
        """The claims of ``token`` after checking its signature against the published key its
        ``kid`` names (pending, active or retired within ``publish_until``), with the header
        ``alg`` equal to that key's (no ``none``, no algorithm confusion), ``aud``, ``iss``,
        ``exp``/``nbf``/``iat`` with 30 s leeway, every required claim present and typed, and
        ``pid`` naming the key's project.

        Raises NoSession with ``details.reason`` ``token_expired`` or ``token_invalid``.
        """
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, ValueError, TypeError):
            raise _invalid() from None
        kid, alg = header.get("kid"), header.get("alg")
        if not isinstance(kid, str) or not is_id(kid, "kid") or alg not in ALGS:
            raise _invalid()
        verifier = await self._verifier(kid)
        if verifier is None or verifier.alg != alg:
            raise _invalid()
        if verifier.publish_until is not None and verifier.publish_until < datetime.now(UTC):
            raise _invalid("The access token's signing key is no longer published.")
        try:
            claims = jwt.decode(
                token, verifier.key, algorithms=[verifier.alg], audience=AUDIENCE,
                issuer=self._issuer, leeway=LEEWAY_SECONDS,
                options={"require": list(REQUIRED_CLAIMS), "strict_aud": True},
            )
        except jwt.ExpiredSignatureError:
            raise NoSession("The access token has expired.", details={"reason": "token_expired"}) from None
        except (jwt.PyJWTError, ValueError, TypeError):
            raise _invalid() from None
        return _claims(claims, kid, verifier.project_id)

    async def _verifier(self, kid: str) -> _Verifier | None:
        try:
            return self._verifiers[kid]
        except KeyError:
            pass
        row = await self._pool.fetchrow(
            "SELECT project_id, alg, public_jwk, publish_until FROM signing_keys WHERE kid = $1", kid
        )
        verifier = None
        if row is not None:
            verifier = _Verifier(row["project_id"], row["alg"], public_key_from_jwk(row["public_jwk"]),
                                 row["publish_until"])
        self._verifiers[kid] = verifier  # an unknown kid is remembered too (no query per forgery)
        return verifier


def _claims(c: dict[str, Any], kid: str, project_id: str) -> AccessClaims:
    sub, sid, pid = c["sub"], c["sid"], c["pid"]
    act_org, act_role = c.get("act_org"), c.get("act_role")
    iat, nbf, exp = c["iat"], c["nbf"], c["exp"]
    if (
        pid != project_id or not isinstance(sub, str) or not is_id(sub, "user")
        or not isinstance(sid, str) or not is_id(sid, "sess")
        or not all(type(v) is int for v in (iat, nbf, exp))
        or (act_org is not None and not (isinstance(act_org, str) and is_id(act_org, "org")))
        or (act_role is not None and (act_org is None or not isinstance(act_role, str)))
    ):
        raise _invalid()
    return AccessClaims(sub=sub, sid=sid, pid=pid, act_org=act_org, act_role=act_role, iat=iat,
                        exp=exp, kid=kid)

