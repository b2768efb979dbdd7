"""The OAuth tests' peers: the local OpenID Connect provider (once per run) and a cookie-keeping
client that plays the browser."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest_asyncio
from aiohttp import ClientSession, CookieJar

from common.settings import Settings
from tests.oauth.peers import OidcPeer, oidc_provider

PEER_PROVIDER_NAMES = ("corp", "google", "acme", "apple")
"""The provider names the tests configure against the local provider (its client allows each
one's callback URL)."""


@pytest_asyncio.fixture(scope="session")
async def oidc_peer(settings_factory: Callable[..., Settings]) -> AsyncIterator[OidcPeer]:
    base = settings_factory().public_base_url
    callbacks = [f"{base}/v1/auth/oauth/{name}/callback" for name in PEER_PROVIDER_NAMES]
    async with oidc_provider(callbacks) as peer:
        yield peer


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[ClientSession]:
    """A client that keeps cookies like a browser (also for 127.0.0.1, which aiohttp's default
    jar refuses)."""
    async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as session:
        yield session
