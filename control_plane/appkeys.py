"""Every piece of the control plane's application state (``web.AppKey``, fully typed; no
string keys). State both services share (settings, pool, Redis, API-key authenticator, signing
keys, readiness probes) is in ``common.appkeys``; each is set in a cleanup context of
``control_plane.app``."""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web

from control_plane.compliance.service import MaintenanceBoard
from control_plane.kms import LocalKms
from control_plane.magic_links.service import SendLimits
from control_plane.messages.senders import ConsoleSink
from control_plane.oauth.protocol import OAuthClient
from control_plane.portal.resolver import TxtResolver
from control_plane.risk.service import RiskEngine
from control_plane.sessions.tokens import TokenService
from control_plane.signing_keys.service import Keyring
from control_plane.tenancy.cors import OriginCache

CURSOR_SECRET: Final = web.AppKey("cursor_secret", bytes)
"""The deployment's cursor-signing secret (``control_plane.web.pagination``)."""
KMS: Final = web.AppKey("kms", LocalKms)
"""Envelope encryption of secrets at rest, from ``SERVICE_KMS_KEY[_FILE]``."""
KEYRING: Final = web.AppKey("keyring", Keyring)
"""Each project's active signing key (``control_plane.signing_keys.service``)."""
TOKENS: Final = web.AppKey("tokens", TokenService)
"""Access-token issuing (``control_plane.sessions.tokens``)."""
SEND_LIMITS: Final = web.AppKey("send_limits", SendLimits)
"""The magic-link send rate limits, counted in Redis (``control_plane.web.ratelimit``)."""
OAUTH: Final = web.AppKey("oauth", OAuthClient)
"""HTTP to OAuth providers, with their discovery documents and JWKS cached
(``control_plane.oauth.protocol``)."""
RISK: Final = web.AppKey("risk", RiskEngine)
"""The risk engine: its limits, the GeoIP database, the attempt counters in Redis
(``control_plane.risk.service``)."""
OUTBOX_WAKE: Final = web.AppKey("outbox_wake", asyncio.Event)
"""Wakes this process's outbox worker (``control_plane.messages.tasks``): set after a statement
that queued messages without a ``NOTIFY`` committed (``messages.service.insert_from``)."""
MAILBOX: Final = web.AppKey("dev_mailbox", ConsoleSink)
"""The console message sink, present when a channel uses it (the development mailbox)."""
MAINTENANCE_BOARD: Final = web.AppKey("maintenance_board", MaintenanceBoard)
"""The started maintenance windows ``GET /readyz`` shows (``control_plane.compliance.service``)."""
OPENAPI: Final = web.AppKey("openapi_document", bytes)
"""The service's OpenAPI document, serialized (``control_plane.app.openapi_document``)."""
CORS_ORIGINS: Final = web.AppKey("cors_origins", OriginCache)
"""The allowed origins of projects, cached per process (``control_plane.tenancy.cors``)."""
TXT_RESOLVER: Final = web.AppKey("txt_resolver", TxtResolver)
"""DNS TXT lookups for the admin portal's domain verification, through ``SERVICE_DNS_RESOLVER``
or the system's resolver (``control_plane.portal.resolver``)."""
