"""Which provider a configured name is: ``google``, ``github``, ``microsoft`` and ``apple`` are
themselves; any other name is a generic OpenID Connect provider (DESIGN.md "OAuth")."""

from __future__ import annotations

from typing import Final

from control_plane.oauth.providers import Provider, apple, github, google, microsoft, oidc

FIXED: Final = {p.kind: p for p in (google.PROVIDER, github.PROVIDER, microsoft.PROVIDER,
                                    apple.PROVIDER)}


def provider_of(name: str) -> Provider:
    """The provider a configuration named ``name`` uses."""
    return FIXED.get(name, oidc.PROVIDER)
