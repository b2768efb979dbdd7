"""Access-token verification: the contract both services verify sessions by.

The control plane issues access JWTs (``control_plane.sessions.tokens``) and verifies them on
session routes; the engine verifies them at the edge. Both call :func:`verify_access_token`
with a :class:`KeySource` (``common.jwks``: the published keys of every project), so a token is
judged the same everywhere.

Contract (SPEC.md 2 "Access token", DESIGN.md "access token"):

* header: ``alg`` EdDSA or RS256, ``kid`` a ``kid_<ulid>``, ``typ`` JWT;
* claims: ``iss`` (the service's public base URL), ``aud`` ``"service"``, ``sub`` (a user id),
  ``act_org`` and ``act_role`` (only when an organization is selected; a role never without
  its organization), ``sid`` (a session id), ``iat``, ``nbf``, ``exp`` (integer seconds), and
  ``pid`` (the project id);
* the key is the one ``kid`` names, among the published keys (pending, active, or retired
  until its ``publish_until``); the header's ``alg`` must equal that key's (no ``none``, no
  algorithm confusion, RFC 8725 3.1); ``pid`` must be the key's project;
* times are checked with :data:`LEEWAY_SECONDS` of clock skew.

No I/O here beyond the awaited key source.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from common.ids import is_id

__all__ = [
    "ALGS",
    "AUDIENCE",
    "LEEWAY_SECONDS",
    "REQUIRED_CLAIMS",
    "AccessClaims",
    "Alg",
    "InvalidToken",
    "KeySource",
    "PublicKey",
    "VerificationKey",
    "public_key_from_jwk",
    "unverified_pid",
    "verify_access_token",
]

Alg = Literal["EdDSA", "RS256"]
ALGS: Final[tuple[Alg, ...]] = ("EdDSA", "RS256")
AUDIENCE: Final = "service"
SESSION_COOKIE: Final = "service_session"
"""The cookie that carries the access token to browsers (HttpOnly, SameSite=Lax; set by the
control plane at sign-in, read by the engine's edge validation)."""
LEEWAY_SECONDS: Final = 30
REQUIRED_CLAIMS: Final = ("iss", "aud", "sub", "sid", "iat", "nbf", "exp", "pid")

PublicKey = ed25519.Ed25519PublicKey | rsa.RSAPublicKey


class InvalidToken(Exception):
    """The token does not verify. ``reason`` is ``expired`` (a good token past its ``exp``) or
    ``invalid`` (anything else: malformed, unknown or retired key, bad signature, wrong claims);
    ``message`` says which in words fit for a client."""

    def __init__(self, reason: Literal["expired", "invalid"], message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


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
class VerificationKey:
    """A published signing key: its project, algorithm, public key, and until when it stays
    published (None while pending or active)."""

    kid: str
    project_id: str
    alg: Alg
    key: PublicKey
    publish_until: datetime | None


class KeySource(Protocol):
    """Where verification keys come from (``common.jwks.PgKeySource``,
    ``common.jwks.PublishedKeys``)."""

    async def get(self, kid: str, pid: str | None = None) -> VerificationKey | None:
        """The key ``kid`` names, or None when no project publishes it. ``pid`` is the token's
        *unverified* ``pid`` claim (:func:`unverified_pid`): a hint of where to look, never
        trusted."""
        ...


def unverified_pid(token: str) -> str | None:
    """The ``pid`` claim of a compact JWS read *without* verifying anything (only a hint of
    where to look for an unknown key); None when absent or malformed."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(_b64url_decode(parts[1]))
    except (binascii.Error, ValueError):  # orjson.JSONDecodeError is a ValueError
        return None
    pid = claims.get("pid") if isinstance(claims, dict) else None
    return pid if isinstance(pid, str) and is_id(pid, "proj") else None


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_key_from_jwk(jwk: dict[str, Any]) -> PublicKey:
    """The verification key of an Ed25519 (RFC 8037 OKP) or RSA (RFC 7518 6.3) public JWK.
    Raises ValueError for anything else."""
    if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519":
        return ed25519.Ed25519PublicKey.from_public_bytes(_b64url_decode(str(jwk["x"])))
    if jwk.get("kty") == "RSA":
        n = int.from_bytes(_b64url_decode(str(jwk["n"])), "big")
        e = int.from_bytes(_b64url_decode(str(jwk["e"])), "big")
        return rsa.RSAPublicNumbers(e, n).public_key()
    raise ValueError("not an Ed25519 or RSA public JWK")


def _invalid(message: str = "The access token is not valid.") -> InvalidToken:
    return InvalidToken("invalid", message)


async def verify_access_token(token: str, *, keys: KeySource, issuer: str) -> AccessClaims:
    """The claims of ``token`` once every rule of the module docstring holds.

    Raises InvalidToken (``reason`` ``expired`` or ``invalid``).
    """
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.PyJWTError, ValueError, TypeError):
        raise _invalid() from None
    kid, alg = header.get("kid"), header.get("alg")
    if not isinstance(kid, str) or not is_id(kid, "kid") or alg not in ALGS:
        raise _invalid()
    key = await keys.get(kid, unverified_pid(token))
    if key is None or key.alg != alg:
        raise _invalid()
    if key.publish_until is not None and key.publish_until < datetime.now(UTC):
        raise _invalid("The access token's signing key is no longer published.")
    try:
        claims = jwt.decode(
            token, key.key, algorithms=[key.alg], audience=AUDIENCE, issuer=issuer,
            leeway=LEEWAY_SECONDS, options={"require": list(REQUIRED_CLAIMS), "strict_aud": True},
        )
    except jwt.ExpiredSignatureError:
        raise InvalidToken("expired", "The access token has expired.") from None
    except (jwt.PyJWTError, ValueError, TypeError):
        raise _invalid() from None
    return _claims(claims, kid, key.project_id)


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
