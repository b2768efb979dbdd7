"""Typed application state of the engine only (aiohttp ``web.AppKey``; no string keys).

Shared state (settings, pool, Redis, authenticator, readiness probes) lives in
``common.appkeys``.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.jwks import PublishedKeys
from common.revocations import RevocationMirror
from engine.registry import StoreRegistry
from engine.sessions import SessionJudge

STORES: Final = web.AppKey("engine_stores", StoreRegistry)
"""The store registry: every store's tuple graph in memory (set while the app runs)."""

REVOCATIONS: Final = web.AppKey("engine_revocations", RevocationMirror)
"""The revoked sessions, mirrored from Redis by ``engine.edge`` (set while the app runs)."""

JUDGE: Final = web.AppKey("engine_session_judge", SessionJudge)
"""Judges sessions at the edge, with the access tokens it verified remembered until they
expire (``engine.sessions``; set by ``engine.edge`` while the app runs)."""

KEYS: Final = web.AppKey("engine_keys", PublishedKeys)
"""Every project's signing keys in memory, kept current by ``engine.keys`` (set while the app
runs)."""
