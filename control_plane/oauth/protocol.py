"""The protocol pieces every provider shares: OpenID Connect Discovery, the provider's JWKS, the
authorization URL and the token request of the authorization code grant with PKCE, and ID token
validation.

* Authorization request: RFC 6749 4.1.1 with PKCE S256 (RFC 7636 4.2, 4.3), ``state`` (RFC 6749
  10.12) and, for OpenID Connect, ``nonce`` (OIDC Core 3.1.2.1); built by Authlib
  (``prepare_grant_uri``, ``create_s256_code_challenge``).
* Token request: RFC 6749 4.1.3 with ``code_verifier`` (RFC 7636 4.5), the client
  authenticated by ``client_secret_basic`` or ``client_secret_post`` (RFC 6749 2.3.1), as the
  provider's discovery document allows; Authlib prepares it, aiohttp sends it.
* ID token: OIDC Core 3.1.3.7, by PyJWT against the provider's JWKS: the signature, with the
  algorithm pinned to what the discovery document lists (never ``none`` nor an HMAC), ``iss``
  (a Microsoft-style ``{tenantid}`` template filled from the token's ``tid``), ``aud`` (and
  ``azp`` when there are several audiences), ``exp``, ``iat`` and ``nonce``.

Every failure of the provider's answers raises :class:`ProviderError`; the sign-in turns it into
``verification_failed`` (400).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import jwt
import orjson
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc6749.parameters import prepare_grant_uri, prepare_token_request
from authlib.oauth2.rfc7636 import create_s256_code_challenge

from common.settings import Settings, is_internal_host, provider_url_problem

_ASYMMETRIC: Final = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
                                "ES384", "ES512", "EdDSA"})
_LEEWAY_SECONDS: Final = 60
_JWKS_REFRESH_SECONDS: Final = 30.0
"""A token naming a key the cached JWKS lacks fetches the JWKS again (a rotation), at most this
often."""
TENANT_TEMPLATE: Final = "{tenantid}"


class ProviderError(Exception):
    """The provider's answer cannot be used: ``reason`` names why (``discovery``,
    ``token_request``, ``id_token``, ``userinfo``, ``unreachable``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a provider is reached (OpenID Connect Discovery 1.0, section 3, or fixed).

    ``issuer`` is the ``iss`` ID tokens must carry (None: no ID tokens, e.g. GitHub), possibly
    a ``{tenantid}`` template; ``id_token_algs`` the signing algorithms accepted;
    ``auth_methods`` the client authentication methods of the token endpoint."""

    authorization_endpoint: str
    token_endpoint: str
    issuer: str | None = None
    jwks_uri: str | None = None
    userinfo_endpoint: str | None = None
    id_token_algs: tuple[str, ...] = ("RS256",)
    auth_methods: tuple[str, ...] = ("client_secret_basic",)


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """A project's configuration of one provider, the client secret opened."""

    project_id: str
    name: str
    kind: str
    client_id: str
    client_secret: str
    redirect_uris: tuple[str, ...]
    scopes: tuple[str, ...]
    issuer: str | None


@dataclass(frozen=True, slots=True)
class ProviderClaims:
    """What the provider says of the user: ``subject`` (stable per provider), ``email`` and
    whether the provider verified it, and a display ``name``."""

    subject: str
    email: str | None
    email_verified: bool
    name: str | None = None


def authorization_url(endpoints: Endpoints, config: ProviderConfig, *, callback_url: str,
                      state: str, code_verifier: str, nonce: str | None,
                      extra: Mapping[str, str] | None = None) -> str:
    """The URL of the authorization request (RFC 6749 4.1.1; RFC 7636 4.3; OIDC Core 3.1.2.1)."""
    params: dict[str, str] = {
        "code_challenge": create_s256_code_challenge(code_verifier),
        "code_challenge_method": "S256", **(extra or {})}
    if nonce is not None:
        params["nonce"] = nonce
    url: str = prepare_grant_uri(
        endpoints.authorization_endpoint, config.client_id, "code", redirect_uri=callback_url,
        scope=" ".join(config.scopes), state=state, **params)
    return url


def truthy(value: object) -> bool:
    """A boolean claim, also when a provider sends it as the string ``"true"`` (Apple)."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


class OAuthClient:
    """HTTP to providers (aiohttp), with the discovery documents and JWKS cached in memory.
    One per app; :meth:`close` on shutdown."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._discovery: dict[str, tuple[float, Endpoints]] = {}
        self._jwks: dict[str, tuple[float, jwt.PyJWKSet, dict[str, str]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.oauth_http_timeout_seconds),
                headers={"User-Agent": "authio-oauth"})
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get_json(self, url: str, *, reason: str,
                       headers: Mapping[str, str] | None = None) -> Any:
        """The JSON of ``GET url``. Raises ProviderError (``reason``) for a non-2xx answer, a
        body that is not JSON, or a provider out of reach."""
        try:
            async with self.session.get(url, headers=dict(headers or {})) as r:
                body = await r.read()
                if r.status // 100 != 2:
                    raise ProviderError(reason, f"GET {url} answered {r.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderError("unreachable", f"GET {url}: {exc.__class__.__name__}") from None
        try:
            return orjson.loads(body)
        except ValueError:
            raise ProviderError(reason, f"GET {url} did not answer JSON") from None

    async def discover(self, issuer: str, *, check_issuer: bool = True) -> Endpoints:
        """The endpoints of the OpenID Connect provider ``issuer``, from
        ``{issuer}/.well-known/openid-configuration`` (OpenID Connect Discovery 1.0, 4), cached
        ``SERVICE_OAUTH_DISCOVERY_CACHE_SECONDS``. The document's ``issuer`` must be ``issuer``
        (4.3) unless ``check_issuer`` is False (Microsoft's common endpoint names a
        ``{tenantid}`` template). Raises ProviderError."""
        issuer = issuer.rstrip("/")
        cached = self._discovery.get(issuer)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        doc = await self.get_json(f"{issuer}/.well-known/openid-configuration", reason="discovery")
        if not isinstance(doc, dict):
            raise ProviderError("discovery", "the discovery document is not an object")
        named = str(doc.get("issuer", ""))  # verbatim: the ID tokens' iss must equal it
        if check_issuer and named.rstrip("/") != issuer:
            raise ProviderError("discovery", f"the discovery document names issuer {named!r}")
        urls = {}
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
            value = doc.get(field)
            if value is None and field == "userinfo_endpoint":
                continue
            if not isinstance(value, str) or provider_url_problem(value) is not None or (
                    not self.settings.base_url_is_local
                    and is_internal_host(urlsplit(value).hostname)):
                raise ProviderError("discovery", f"the discovery document's {field} is unusable")
            urls[field] = value
        algs = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        endpoints = Endpoints(
            authorization_endpoint=urls["authorization_endpoint"],
            token_endpoint=urls["token_endpoint"], issuer=named, jwks_uri=urls["jwks_uri"],
            userinfo_endpoint=urls.get("userinfo_endpoint"),
            id_token_algs=tuple(a for a in algs if a in _ASYMMETRIC),
            auth_methods=tuple(str(m) for m in methods))
        ttl = self.settings.oauth_discovery_cache_seconds
        self._discovery[issuer] = (time.monotonic() + ttl, endpoints)
        return endpoints

    async def exchange_code(self, endpoints: Endpoints, config: ProviderConfig, *, code: str,
                            code_verifier: str, callback_url: str) -> dict[str, Any]:
        """The token response to the authorization ``code`` (RFC 6749 4.1.3 and 5.1; RFC 7636
        4.5). Raises ProviderError (``token_request``) for an error answer (RFC 6749 5.2)."""
        method = ("client_secret_post" if "client_secret_basic" not in endpoints.auth_methods
                  and "client_secret_post" in endpoints.auth_methods else "client_secret_basic")
        body = prepare_token_request("authorization_code", code=code, redirect_uri=callback_url,
                                     code_verifier=code_verifier)
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   "Accept": "application/json"}
        auth = ClientAuth(config.client_id, config.client_secret, method)
        url, headers, body = auth.prepare("POST", endpoints.token_endpoint, headers, body)
        try:
            async with self.session.post(url, data=body.encode(), headers=headers) as r:
                status, raw = r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderError("unreachable", f"token endpoint: {exc.__class__.__name__}") from None
        try:
            answer = orjson.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ProviderError("token_request", f"the token endpoint answered {status}, not JSON")
        if status // 100 != 2 or "error" in answer:
            raise ProviderError("token_request",
                                f"the token endpoint refused the code: {answer.get('error')}")
        if not isinstance(answer.get("access_token"), str):
            raise ProviderError("token_request", "the token response has no access_token")
        return answer

    async def _key(self, jwks_uri: str, kid: str | None) -> tuple[jwt.PyJWK, str | None]:
        """The signing key ``kid`` of the JWKS at ``jwks_uri`` and the ``alg`` it declares."""
        lock = self._locks.setdefault(jwks_uri, asyncio.Lock())
        async with lock:
            cached = self._jwks.get(jwks_uri)
            found = _find_key(cached[1], kid) if cached else None
            if found is None and (cached is None
                                  or time.monotonic() - cached[0] > _JWKS_REFRESH_SECONDS):
                doc = await self.get_json(jwks_uri, reason="id_token")
                try:
                    keys = jwt.PyJWKSet.from_dict(doc)
                    declared = {str(k["kid"]): str(k["alg"]) for k in doc["keys"]
                                if isinstance(k, dict) and "kid" in k and "alg" in k}
                except (jwt.PyJWTError, KeyError, TypeError):
                    raise ProviderError("id_token", "the provider's JWKS is unusable") from None
                cached = (time.monotonic(), keys, declared)
                self._jwks[jwks_uri] = cached
                found = _find_key(keys, kid)
        if found is None or cached is None:
            raise ProviderError("id_token", "the ID token's key is not in the provider's JWKS")
        return found, cached[2].get(found.key_id or "")

    async def validate_id_token(self, token: object, endpoints: Endpoints, *, client_id: str,
                                nonce: str) -> dict[str, Any]:
        """The claims of a valid ID token (OIDC Core 3.1.3.7). Raises ProviderError
        (``id_token``)."""
        if not isinstance(token, str) or endpoints.jwks_uri is None or endpoints.issuer is None:
            raise ProviderError("id_token", "the token response has no ID token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise ProviderError("id_token", "the ID token is not a JWT") from None
        alg = header.get("alg")
        if alg not in endpoints.id_token_algs:
            raise ProviderError("id_token", f"the ID token's algorithm {alg!r} is not allowed")
        key, declared = await self._key(endpoints.jwks_uri, header.get("kid"))
        if declared is not None and declared != alg:
            raise ProviderError("id_token", "the ID token's algorithm is not its key's")
        template = TENANT_TEMPLATE in endpoints.issuer
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[alg], audience=client_id,
                issuer=None if template else endpoints.issuer, leeway=_LEEWAY_SECONDS,
                options={"require": ["iss", "sub", "aud", "exp", "iat"]})
        except (jwt.PyJWTError, TypeError, ValueError) as exc:
            # TypeError/ValueError: a key of another type than the algorithm (a JWKS key that
            # declares no alg), which PyJWT reports outside its own errors.
            raise ProviderError("id_token", f"the ID token is not valid: {exc}") from None
        if template:
            tid = claims.get("tid")
            expected = endpoints.issuer.replace(TENANT_TEMPLATE, tid) if isinstance(tid, str) else None
            if expected is None or claims.get("iss") != expected:
                raise ProviderError("id_token", "the ID token's issuer is not its tenant's")
        audience = claims.get("aud")
        if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != client_id:
            raise ProviderError("id_token", "the ID token's azp is not this client")
        got = claims.get("nonce")
        if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
            raise ProviderError("id_token", "the ID token's nonce is not this sign-in's")
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise ProviderError("id_token", "the ID token has no subject")
        return claims


def _find_key(keys: jwt.PyJWKSet, kid: object) -> jwt.PyJWK | None:
    usable = [k for k in keys.keys if k.public_key_use in (None, "sig")]
    if kid is None:
        return usable[0] if len(usable) == 1 else None
    return next((k for k in usable if k.key_id == kid), None)
