"""Microsoft identity platform (Entra ID, OpenID Connect): discovery at
``SERVICE_OAUTH_MICROSOFT_ISSUER`` (``https://login.microsoftonline.com/common/v2.0``) or the
tenant's issuer a configuration names. The multi-tenant document's ``issuer`` is the template
``https://login.microsoftonline.com/{tenantid}/v2.0``: the token's ``tid`` fills it before it is
compared with ``iss`` (protocol.OAuthClient.validate_id_token).

Microsoft does not verify the ``email`` claim (an administrator of any tenant can set it): it is
verified only when the token says so (``email_verified``, or the optional claim ``xms_edov``,
"email domain owner verified")."""

from __future__ import annotations

import dataclasses
from typing import Any

from common.settings import Settings
from control_plane.oauth.protocol import (
    Endpoints,
    OAuthClient,
    ProviderClaims,
    ProviderConfig,
    truthy,
)
from control_plane.oauth.providers import OIDC_SCOPES, Provider, claims_of


async def _endpoints(client: OAuthClient, settings: Settings, config: ProviderConfig) -> Endpoints:
    return await client.discover(config.issuer or settings.oauth_microsoft_issuer,
                                 check_issuer=False)


async def _claims(client: OAuthClient, endpoints: Endpoints, config: ProviderConfig,
                  tokens: dict[str, Any], nonce: str) -> ProviderClaims:
    raw = await client.validate_id_token(tokens.get("id_token"), endpoints,
                                         client_id=config.client_id, nonce=nonce)
    claims = claims_of(raw)
    if not claims.email_verified and truthy(raw.get("xms_edov")):
        claims = dataclasses.replace(claims, email_verified=True)
    return claims


PROVIDER = Provider(kind="microsoft", default_scopes=OIDC_SCOPES, oidc=True,
                    endpoints=_endpoints, claims=_claims, takes_issuer=True)
