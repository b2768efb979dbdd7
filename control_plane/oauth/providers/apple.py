"""Sign in with Apple (OpenID Connect): discovery at ``SERVICE_OAUTH_APPLE_ISSUER``
(``https://appleid.apple.com``). The ID token carries ``email`` and ``email_verified`` (a string
``"true"``), also for private relay addresses. The configured ``client_secret`` is the client
secret JWT Apple asks for (ES256, signed with the developer's key, valid up to six months).

Apple requires ``response_mode=form_post`` when scopes are asked (``email`` is needed for the
e-mail claim): the browser comes back by a cross-site POST to the callback, so the binding
cookie of such a start is ``SameSite=None; Secure``."""

from __future__ import annotations

from common.settings import Settings
from control_plane.oauth.protocol import Endpoints, OAuthClient, ProviderConfig
from control_plane.oauth.providers import Provider, id_token_claims


async def _endpoints(client: OAuthClient, settings: Settings, config: ProviderConfig) -> Endpoints:
    return await client.discover(settings.oauth_apple_issuer)


PROVIDER = Provider(kind="apple", default_scopes=("openid", "email", "name"), oidc=True,
                    endpoints=_endpoints, claims=id_token_claims,
                    authorization_params=(("response_mode", "form_post"),), form_post=True)
