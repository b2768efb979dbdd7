"""Google (OpenID Connect; https://developers.google.com/identity/openid-connect/openid-connect):
discovery at ``SERVICE_OAUTH_GOOGLE_ISSUER`` (``https://accounts.google.com``); the ID token
carries ``email`` and ``email_verified``."""

from __future__ import annotations

from common.settings import Settings
from control_plane.oauth.protocol import Endpoints, OAuthClient, ProviderConfig
from control_plane.oauth.providers import OIDC_SCOPES, Provider, id_token_claims


async def _endpoints(client: OAuthClient, settings: Settings, config: ProviderConfig) -> Endpoints:
    return await client.discover(settings.oauth_google_issuer)


PROVIDER = Provider(kind="google", default_scopes=OIDC_SCOPES, oidc=True, endpoints=_endpoints,
                    claims=id_token_claims)
