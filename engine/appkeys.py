"""Typed application state of the engine only (aiohttp ``web.AppKey``; no string keys).

Shared state (settings, pool, Redis, authenticator, readiness probes) lives in
``common.appkeys``.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.access_tokens import AccessClaims
from common.jwks import PublishedKeys
from common.revocations import RevocationMirror
from engine.registry import StoreRegistry

STORES: Final = web.AppKey("engine_stores", StoreRegistry)
"""The store registry: every store's tuple graph in memory (set while the app runs)."""

REVOCATIONS: Final = web.AppKey("engine_revocations", RevocationMirror)
"""The revoked sessions, mirrored from Redis by ``engine.edge`` (set while the app runs)."""

VERIFIED_TOKENS: Final = web.AppKey("engine_verified_tokens", dict[str, AccessClaims])
"""Access tokens already verified, by their signature part, until they expire
(``engine.edge``)."""

KEYS: Final = web.AppKey("engine_keys", PublishedKeys)
"""Every project's signing keys in memory, kept current by ``engine.keys`` (set while the app
runs)."""
