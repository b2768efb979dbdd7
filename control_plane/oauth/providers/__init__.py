"""The providers, one module each: what differs between them is where their endpoints are and
how the user's subject and e-mail are read from their answers. Every module defines ``PROVIDER``,
a :class:`Provider`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

from common.settings import Settings
from control_plane.oauth.protocol import (
    Endpoints,
    OAuthClient,
    ProviderClaims,
    ProviderConfig,
    truthy,
)


class EndpointsOf(Protocol):
    async def __call__(self, client: OAuthClient, settings: Settings,
                       config: ProviderConfig) -> Endpoints: ...


class ClaimsOf(Protocol):
    async def __call__(self, client: OAuthClient, endpoints: Endpoints, config: ProviderConfig,
                       tokens: dict[str, Any], nonce: str) -> ProviderClaims: ...


@dataclass(frozen=True, slots=True)
class Provider:
    """One kind of provider: ``kind`` (a fixed name, or ``oidc`` for generic OpenID Connect),
    the ``default_scopes`` asked for when a configuration names none, whether it speaks OpenID
    Connect (``oidc``: a ``nonce`` is sent and an ID token expected), whether a configuration
    may name an ``issuer`` (``takes_issuer``) or must (``needs_issuer``), extra authorization
    parameters (``form_post``: the answer comes as a POST), and the two functions that find its
    ``endpoints`` and read the user's
    ``claims`` from its token response."""

    kind: str
    default_scopes: tuple[str, ...]
    oidc: bool
    endpoints: EndpointsOf
    claims: ClaimsOf
    takes_issuer: bool = False
    needs_issuer: bool = False
    authorization_params: tuple[tuple[str, str], ...] = ()
    form_post: bool = False
    """The provider answers with ``response_mode=form_post`` (OAuth 2.0 Form Post Response Mode):
    a cross-site POST to the callback, which a SameSite=Lax cookie would not accompany."""


OIDC_SCOPES: Final = ("openid", "email", "profile")


def claims_of(claims: dict[str, Any]) -> ProviderClaims:
    """The user as validated ID token ``claims`` describe them (OIDC Core 2, 5.1): ``sub``,
    ``email``, ``email_verified``, ``name``."""
    email, name = claims.get("email"), claims.get("name")
    return ProviderClaims(
        subject=str(claims["sub"]), email=email if isinstance(email, str) and email else None,
        email_verified=truthy(claims.get("email_verified")),
        name=name if isinstance(name, str) else None)


async def id_token_claims(client: OAuthClient, endpoints: Endpoints, config: ProviderConfig,
                          tokens: dict[str, Any], nonce: str) -> ProviderClaims:
    """The user of the token response's ID token, once validated (OIDC Core 3.1.3.7). Raises
    ProviderError."""
    return claims_of(await client.validate_id_token(tokens.get("id_token"), endpoints,
                                                    client_id=config.client_id, nonce=nonce))
