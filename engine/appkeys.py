"""Typed application state of the engine only (aiohttp ``web.AppKey``; no string keys).

Shared state (settings, pool, Redis, authenticator, readiness probes) lives in
``common.appkeys``.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from engine.registry import StoreRegistry

STORES: Final = web.AppKey("engine_stores", StoreRegistry)
"""The store registry: every store's tuple graph in memory (set while the app runs)."""
