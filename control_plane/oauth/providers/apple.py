"""Sign in with Apple (OpenID Connect): discovery at ``SERVICE_OAUTH_APPLE_ISSUER``
(``https://appleid.apple.com``). The ID token carries ``email`` and ``email_verified`` (a string
``"true"``), also for private relay addresses. The configured ``client_secret`` is the client
secret JWT Apple asks for (ES256, signed with the developer's key, valid up to six months).

Apple answers with ``response_mode=form_post`` (a POST to the callback) when the ``name`` or
``email`` scope is asked; the callback takes GET only, so the default scopes are ``openid``
alone and the e-mail comes from the ID token, which Apple fills when the user shares it."""

from __future__ import annotations

from common.settings import Settings
from control_plane.oauth.protocol import Endpoints, OAuthClient, ProviderConfig
from control_plane.oauth.providers import Provider, id_token_claims


async def _endpoints(client: OAuthClient, settings: Settings, config: ProviderConfig) -> Endpoints:
    return await client.discover(settings.oauth_apple_issuer)


PROVIDER = Provider(kind="apple", default_scopes=("openid",), oidc=True, endpoints=_endpoints,
                    claims=id_token_claims)
