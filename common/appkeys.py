"""Typed application state shared by both services (aiohttp ``web.AppKey``; no string keys)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

import asyncpg
from aiohttp import web
from redis.asyncio import Redis

from common.auth import ApiKeyAuthenticator
from common.jwks import PgKeySource
from common.settings import Settings

SETTINGS: Final = web.AppKey("settings", Settings)
PG_POOL: Final = web.AppKey("pg_pool", asyncpg.Pool)
REDIS: Final = web.AppKey("redis", Redis)
AUTHENTICATOR: Final = web.AppKey("authenticator", ApiKeyAuthenticator)
# The published signing keys of every project, for verifying access tokens (common.access_tokens).
SIGNING_KEYS: Final = web.AppKey("signing_keys", PgKeySource)
Readiness = Literal["ready", "stale", "not_ready"]
"""What a readiness probe says: serving; serving, but from memory without following PostgreSQL
(the engine during an outage); or not serving yet."""
# Each service appends a probe; /readyz answers 503 when one says not_ready, else 200 with
# status "stale" when one says stale, else "ready".
READINESS: Final = web.AppKey("readiness", list[Callable[[], Readiness]])
READINESS_DETAIL: Final = web.AppKey("readiness_detail",
                                     dict[str, Callable[[], Awaitable[Any]]])
"""What a ready ``/readyz`` shows besides its status: each entry's value (JSON) under its name in
``detail``. Informative only: readiness is the probes' alone, and an entry that fails is shown
as null. An entry answers quickly and reads nothing on every call (probes come every few
seconds): it shows what it last learnt."""
RESOURCES_INSTALLED: Final = web.AppKey("resources_installed", bool)
