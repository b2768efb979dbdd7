"""Access tokens: the session JWT, signed with the project's active key and verified against
the published ones (SPEC.md 2 "Access token"; the claims and checks are the contract of
``common.access_tokens``, which the engine verifies by too).

Claims: exactly SPEC.md 2's (``iss`` the service's base URL, ``aud`` ``"service"``, ``sub``,
``act_org`` and ``act_role`` only when an organization is selected, ``sid``, ``iat``, ``nbf =
iat``, ``exp = iat + access_token_ttl_seconds``) plus ``pid``; header ``alg``, ``kid``, ``typ``.
"""

from __future__ import annotations

from typing import Any

import jwt

from common.access_tokens import AUDIENCE
from common.settings import Settings
from control_plane.signing_keys.service import Keyring


class TokenService:
    """Issues access JWTs with the keyring's active keys (one per process,
    ``control_plane.appkeys.TOKENS``); ``control_plane.web.auth.verify_access`` verifies them."""

    def __init__(self, keyring: Keyring, settings: Settings) -> None:
        self.keyring = keyring
        self._issuer = settings.public_base_url
        self._ttl = settings.access_token_ttl_seconds

    async def issue(self, *, project_id: str, user_id: str, session_id: str, org_id: str | None,
                    role: str | None, iat: int) -> str:
        """The signed access JWT of a session (``act_org``/``act_role`` only when ``org_id`` is
        given). Creates the project's first signing key when it has none. Raises
        ProjectNotFound for an unknown project."""
        signer = await self.keyring.signer(project_id)
        claims: dict[str, Any] = {"iss": self._issuer, "aud": AUDIENCE, "sub": user_id}
        if org_id is not None:
            claims["act_org"] = org_id
            if role is not None:
                claims["act_role"] = role
        claims.update(sid=session_id, iat=iat, nbf=iat, exp=iat + self._ttl, pid=project_id)
        return jwt.encode(claims, signer.key, algorithm=signer.alg,
                          headers={"kid": signer.kid, "typ": "JWT"})
