"""Authenticating the caller of a control-plane endpoint."""

from __future__ import annotations

from aiohttp import web

from common.appkeys import AUTHENTICATOR
from common.auth import Principal
from common.errors import InsufficientScope


async def authenticate(request: web.Request, *scopes: str) -> Principal:
    """The calling API key; it must hold at least one of ``scopes`` (none given: any key).

    Raises MissingApiKey, InvalidApiKey, InsufficientScope.
    """
    principal = await request.app[AUTHENTICATOR].authenticate(request.headers.get("Authorization"))
    if scopes and not any(principal.allows(s) for s in scopes):
        raise InsufficientScope(
            f"This API key needs one of the scopes {', '.join(scopes)}.",
            details={"required_scopes": list(scopes)},
        )
    return principal
