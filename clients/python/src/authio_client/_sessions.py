"""Local verification of access tokens (session JWTs) against the project's JWKS: the part both
clients share (no I/O; the clients fetch the JWKS and call the engine).

What is checked (SPEC.md 2 "Access token" and 5 rule 4, DESIGN.md "access token"; the service's
own verifier, ``common/access_tokens.py``, holds the same rules):

* the header's ``kid`` names a key of the project's JWKS (``GET
  /v1/auth/.well-known/jwks.json?project_id=``) and its ``alg`` (EdDSA or RS256) is that key's
  (no ``none``, no algorithm confusion: RFC 8725 3.1);
* the signature, ``iss`` (the service's base URL), ``aud`` (``"service"``), ``exp`` and ``nbf``
  (with ``leeway`` seconds of clock skew; ``iat``, ``nbf`` and ``exp`` integers), and ``pid``
  (the project's id: a token of another project is refused with reason ``project``), ``sub`` a
  ``user_`` id, ``sid`` a ``sess_`` id.

Refusals are :class:`~authio_client.errors.InvalidSession` with ``details["reason"]`` as the
engine's ``/v1/edge/validate`` says them: ``signature`` (malformed, unknown key, bad signature
or claims), ``expired``, ``project``; :class:`~authio_client.errors.NoSession` when no token
was given.

The JWKS cache (:class:`JwksCache`): fetched at first use, kept ``ttl`` seconds (600, as SPEC.md
5.4 and 8 recommend); when it is older the next verification fetches it again, and keeps using
the old keys if that fetch fails. A token whose ``kid`` is not in the cache fetches it again at
once (an emergency rotation signs with a key published that moment), but at most once per
``refetch_interval`` seconds (60): a flood of tokens with made-up ``kid``s costs one request a
minute, not one each.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt

from authio_client.errors import InvalidSession, NoSession
from authio_client.models import Session

__all__ = ["ALGS", "AUDIENCE", "JwksCache", "header_of", "verify_with"]

AUDIENCE: Final = "service"
ALGS: Final = ("EdDSA", "RS256")
LEEWAY_SECONDS: Final = 30
JWKS_TTL_SECONDS: Final = 600.0
REFETCH_INTERVAL_SECONDS: Final = 60.0
_REQUIRED: Final = ["iss", "aud", "sub", "sid", "iat", "nbf", "exp", "pid"]


def refused(reason: str, message: str) -> InvalidSession:
    return InvalidSession(message, status=401, details={"reason": reason})


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Header:
    kid: str
    alg: str
    pid: str | None  # the unverified pid claim: only to refuse another project's token early


def header_of(token: str | None) -> Header:
    """The ``kid``, ``alg`` and unverified ``pid`` of a compact JWS. Raises NoSession for no
    token, InvalidSession (``signature``) for one that is not a well-formed JWT."""
    if not token:
        raise NoSession("No access token was presented.", status=401)
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise ValueError
        header = json.loads(_b64(parts[0]))
        claims = json.loads(_b64(parts[1]))
    except ValueError:
        raise refused("signature", "The access token is not a well-formed JWT.") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise refused("signature", "The access token is not a well-formed JWT.")
    kid, alg, pid = header.get("kid"), header.get("alg"), claims.get("pid")
    if not isinstance(kid, str) or alg not in ALGS:
        raise refused("signature", "The access token's header names no usable key.")
    return Header(kid, str(alg), pid if isinstance(pid, str) else None)


class JwksCache:
    """The project's verification keys by ``kid`` (see the module docstring for the rules).
    ``fetches`` counts the JWKS fetches made. Not locked: the clients hold their own lock (a
    ``threading.Lock`` or an ``asyncio.Lock``) around :meth:`needs_fetch`/:meth:`store`."""

    def __init__(self, *, ttl: float = JWKS_TTL_SECONDS, refetch_interval: float = REFETCH_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.refetch_interval, self.clock = ttl, refetch_interval, clock
        self.keys: dict[str, jwt.PyJWK] = {}
        self.fetched_at: float | None = None
        self.last_miss_fetch = -float("inf")
        self.fetches = 0

    def expired(self) -> bool:
        """Whether the keys must be fetched (never fetched, or older than ``ttl``)."""
        return self.fetched_at is None or self.clock() - self.fetched_at >= self.ttl

    def may_refetch_for(self, kid: str) -> bool:
        """Whether a token naming the unknown ``kid`` may fetch the JWKS now (and, if so, counts
        this as the interval's one refetch)."""
        if kid in self.keys:
            return False
        now = self.clock()
        if now - self.last_miss_fetch < self.refetch_interval:
            return False
        self.last_miss_fetch = now
        return True

    def postpone(self, seconds: float = 30.0) -> None:
        """After a failed refresh of cached keys: keep them, and try again in ``seconds``."""
        if self.fetched_at is not None:
            self.fetched_at = self.clock() - self.ttl + seconds

    def store(self, jwks: Mapping[str, Any]) -> None:
        """Replace the keys with those of the JWK Set ``jwks`` (keys that cannot be read, or of
        another algorithm, are left out)."""
        keys: dict[str, jwt.PyJWK] = {}
        for jwk in jwks.get("keys") or []:
            if not isinstance(jwk, dict) or not isinstance(jwk.get("kid"), str):
                continue
            if jwk.get("alg") not in ALGS:
                continue
            try:
                keys[jwk["kid"]] = jwt.PyJWK(jwk)
            except jwt.PyJWTError:
                continue
        self.keys = keys
        self.fetched_at = self.clock()
        self.fetches += 1


def verify_with(token: str, header: Header, key: jwt.PyJWK | None, *, issuer: str, project_id: str,
                leeway: float = LEEWAY_SECONDS) -> Session:
    """The :class:`~authio_client.models.Session` of ``token`` checked with ``key`` (None: the
    ``kid`` is not published). Raises InvalidSession."""
    if key is None:
        raise refused("signature", "The access token's signing key is not published.")
    if key.algorithm_name != header.alg:
        raise refused("signature", "The access token's algorithm is not its key's.")
    try:
        claims = jwt.decode(token, key.key, algorithms=[header.alg], audience=AUDIENCE, issuer=issuer,
                            leeway=leeway, options={"require": _REQUIRED, "strict_aud": True})
    except jwt.ExpiredSignatureError:
        raise refused("expired", "The access token has expired.") from None
    except (jwt.PyJWTError, ValueError, TypeError):
        raise refused("signature", "The access token is not valid.") from None
    sub, sid, pid = claims.get("sub"), claims.get("sid"), claims.get("pid")
    org, role = claims.get("act_org"), claims.get("act_role")
    if pid != project_id:
        raise refused("project", "The access token belongs to another project.")
    if (not (isinstance(sub, str) and sub.startswith("user_"))
            or not (isinstance(sid, str) and sid.startswith("sess_"))
            or not all(type(claims.get(c)) is int for c in ("iat", "nbf", "exp"))
            or (org is not None and not (isinstance(org, str) and org.startswith("org_")))
            or (role is not None and (org is None or not isinstance(role, str)))):
        raise refused("signature", "The access token's claims are not valid.")
    return Session(user_id=sub, session_id=sid, project_id=pid, org_id=org, org_role=role,
                   issued_at=claims["iat"], expires_at=claims["exp"], kid=header.kid, claims=claims,
                   token=token)
