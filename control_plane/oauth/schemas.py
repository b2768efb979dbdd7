"""OAuth bodies: a provider's configuration (``PUT /v1/oauth/providers/{provider}``) and what is
answered of it, and the query strings of ``start`` and ``callback``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

from common.schemas import QueryModel, RequestModel, printable
from common.settings import is_loopback_host, provider_url_problem

MAX_REDIRECT_URIS: Final = 20
SCOPE_TOKEN: Final = r"^[\x21\x23-\x5b\x5d-\x7e]+$"
"""RFC 6749 3.3 ``scope-token``."""
PROVIDER_NAME: Final = re.compile(r"[a-z][a-z0-9_-]{0,39}")
"""A provider's name: a lowercase letter, then up to 39 lowercase letters, digits, ``_`` and
``-``. The path takes any segment, as it does an id: a name no provider can have is not found."""


def _redirect_uri(value: str) -> str:
    """An application's redirect URI: absolute https (http only on a loopback host, RFC 8252
    7.3), no fragment (RFC 6749 3.1.2)."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        raise ValueError("must be a URL") from None
    if not parts.hostname or parts.fragment or "#" in value:
        raise ValueError("must be an absolute URL with a host and no fragment")
    if not (parts.scheme == "https" or (parts.scheme == "http" and is_loopback_host(parts.hostname))):
        raise ValueError("must use https (http only for a loopback host)")
    return value


def _issuer(value: str) -> str:
    problem = provider_url_problem(value)
    if problem:
        raise ValueError(problem)
    return value.rstrip("/")


Credential = Annotated[str, StringConstraints(min_length=1, max_length=4096,
                                              pattern=r"^[\x21-\x7e]+$")]
_URL_SCHEMA: Final = {
    "type": "string", "minLength": 1, "maxLength": 2048, "pattern": "^https?://[^#]+$",
    "description": "An absolute https URL (http only for a loopback host), without fragment."}
RedirectUri = Annotated[str, StringConstraints(min_length=1, max_length=2048),
                        AfterValidator(printable), AfterValidator(_redirect_uri),
                        WithJsonSchema(_URL_SCHEMA)]
Scope = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=SCOPE_TOKEN)]
Issuer = Annotated[str, StringConstraints(min_length=1, max_length=2048),
                   AfterValidator(printable), AfterValidator(_issuer), WithJsonSchema(_URL_SCHEMA)]


class ProviderBody(RequestModel):
    """A provider's configuration in the project (replaces any previous one).

    ``client_id`` and ``client_secret`` are what the provider issued for the application (for
    Apple, the client secret JWT); ``redirect_uris`` the application's pages a sign-in may
    return to (the ``redirect_uri`` of ``start`` must be one of them); ``scopes`` what to ask
    for (default: ``openid email profile``; GitHub ``read:user user:email``; Apple ``openid``);
    ``issuer`` the OpenID Connect issuer: required for a generic provider (any name other than
    ``google``, ``github``, ``microsoft`` and ``apple``), a tenant's issuer for ``microsoft``,
    refused for the others. https, or http for a loopback host."""

    client_id: Credential
    client_secret: Credential
    redirect_uris: Annotated[list[RedirectUri], Field(min_length=1, max_length=MAX_REDIRECT_URIS)]
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=50)] | None = None
    issuer: Issuer | None = None


@dataclass(frozen=True, slots=True)
class Provider:
    """A configured provider (the client secret is never answered). ``kind``: ``google``,
    ``github``, ``microsoft``, ``apple`` or ``oidc``; ``callback_url`` is the redirect URI to
    register at the provider."""

    provider: str
    kind: str
    client_id: str
    redirect_uris: list[str]
    scopes: list[str]
    issuer: str | None
    callback_url: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class DeletedProvider:
    """The provider's configuration was deleted."""

    provider: str
    deleted: bool


class StartQuery(QueryModel):
    """Where the sign-in returns to (``project_id`` names the project, as on every public
    route)."""

    project_id: Annotated[str | None, Field(description="The project.")] = None
    redirect_uri: Annotated[str, Field(
        min_length=1, max_length=2048,
        description="Where the browser goes once signed in: one of the provider's redirect_uris.")]


class CallbackQuery(QueryModel):
    """The provider's authorization response (RFC 6749 4.1.2 and 4.1.2.1)."""

    state: Annotated[str, Field(min_length=1, max_length=512,
                                description="The state sent by start.")]
    code: Annotated[str | None, Field(max_length=4096, description="The authorization code.")] = None
    error: Annotated[str | None, Field(max_length=512, description="The provider's error code.")] = None
    error_description: Annotated[str | None, Field(
        max_length=2048, description="The provider's error text.")] = None
    iss: Annotated[str | None, Field(
        max_length=2048, description="The issuer, from providers that name it (RFC 9207).")] = None
