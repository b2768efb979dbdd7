"""Any OpenID Connect provider, named by its issuer (OpenID Connect Discovery 1.0): the endpoints
from ``{issuer}/.well-known/openid-configuration``, the user from the ID token (OIDC Core)."""

from __future__ import annotations

from common.settings import Settings
from control_plane.oauth.protocol import Endpoints, OAuthClient, ProviderConfig
from control_plane.oauth.providers import OIDC_SCOPES, Provider, id_token_claims


async def _endpoints(client: OAuthClient, settings: Settings, config: ProviderConfig) -> Endpoints:
    assert config.issuer is not None  # needs_issuer
    return await client.discover(config.issuer)


PROVIDER = Provider(kind="oidc", default_scopes=OIDC_SCOPES, oidc=True, endpoints=_endpoints,
                    claims=id_token_claims, takes_issuer=True, needs_issuer=True)
