"""GitHub (OAuth 2.0 only: no ID token;
https://docs.github.com/en/apps/oauth-apps/building-oauth-apps/authorizing-oauth-apps).

The authorization and token endpoints are under ``SERVICE_OAUTH_GITHUB_BASE_URL``
(``https://github.com``), the REST API under ``SERVICE_OAUTH_GITHUB_API_URL``
(``https://api.github.com``). The subject is the numeric user ``id`` of ``GET /user``; the e-mail
is the primary address of ``GET /user/emails`` (scope ``user:email``), verified when GitHub says
``verified``."""

from __future__ import annotations

from typing import Any

from common.settings import Settings
from control_plane.oauth.protocol import (
    Endpoints,
    OAuthClient,
    ProviderClaims,
    ProviderConfig,
    ProviderError,
)
from control_plane.oauth.providers import Provider

_API_HEADERS = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}


async def _endpoints(client: OAuthClient, settings: Settings, config: ProviderConfig) -> Endpoints:
    base = settings.oauth_github_base_url
    return Endpoints(authorization_endpoint=f"{base}/login/oauth/authorize",
                     token_endpoint=f"{base}/login/oauth/access_token",
                     auth_methods=("client_secret_post",))


async def _claims(client: OAuthClient, endpoints: Endpoints, config: ProviderConfig,
                  tokens: dict[str, Any], nonce: str) -> ProviderClaims:
    api = client.settings.oauth_github_api_url
    headers = {**_API_HEADERS, "Authorization": f"Bearer {tokens['access_token']}"}
    user = await client.get_json(f"{api}/user", reason="userinfo", headers=headers)
    if not isinstance(user, dict) or not isinstance(user.get("id"), int):
        raise ProviderError("userinfo", "GitHub's /user has no id")
    emails = await client.get_json(f"{api}/user/emails", reason="userinfo", headers=headers)
    primary = next((e for e in emails if isinstance(e, dict) and e.get("primary") is True
                    and isinstance(e.get("email"), str)), None) if isinstance(emails, list) else None
    name = user.get("name") or user.get("login")
    return ProviderClaims(
        subject=str(user["id"]), email=primary["email"] if primary else None,
        email_verified=bool(primary and primary.get("verified") is True),
        name=name if isinstance(name, str) else None)


PROVIDER = Provider(kind="github", default_scopes=("read:user", "user:email"), oidc=False,
                    endpoints=_endpoints, claims=_claims)
