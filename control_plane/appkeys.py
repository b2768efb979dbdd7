"""Typed application state of the control plane alone (``web.AppKey``; no string keys).

State both services share lives in ``common.appkeys``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web

from control_plane.kms import LocalKms

# The deployment's cursor-signing secret (``control_plane.pagination``), loaded at start.
CURSOR_SECRET: Final = web.AppKey("cursor_secret", bytes)
# Envelope encryption of secrets at rest (``control_plane.kms``), from SERVICE_KMS_KEY[_FILE].
KMS: Final = web.AppKey("kms", LocalKms)

# Access-token signing and verification (``control_plane.tokens.TokenService``), created at start
# by ``control_plane.signing_keys.setup``. The class is named for the type checker only, since
# ``control_plane.tokens`` imports modules that import this one.
if TYPE_CHECKING:
    from control_plane.tokens import TokenService
TOKENS: Final[web.AppKey[TokenService]] = web.AppKey("tokens")
