"""The engine's signing keys: every project's published keys in memory
(:class:`common.jwks.PublishedKeys`), kept current from the key-change channel of
:mod:`common.jwks`, heard on the store registry's listener connection (:class:`KeyFollower` is
an ``engine.registry.Follower``).

How fast a key change reaches the engine: the control plane notifies in the transaction that
changes the key, the registry's listener hears it at commit, and the project's keys are read
again (one query): a new or rotated key verifies within milliseconds, well inside 1 s. After
every (re)connection of the listener every key is read again (what was announced meanwhile was
missed), and every :data:`REFRESH_SECONDS` as a safety net. A token whose ``kid`` is still
unknown makes the source reload at most once a second per project (``common.jwks``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

from common import jwks
from common.jwks import PublishedKeys
from common.runtime import every, stop_tasks
from engine.registry import Follower

__all__ = ["REFRESH_SECONDS", "KeyFollower"]

log = logging.getLogger("authio.engine.keys")

REFRESH_SECONDS: Final = 300.0
"""The safety-net full reload period (s)."""
_RETRY_MAX_SECONDS: Final = 5.0


class KeyFollower:
    """Keeps ``keys`` current: :attr:`follower` for the registry, :meth:`start` for the
    periodic refresh, :meth:`close` to stop everything it started."""

    def __init__(self, keys: PublishedKeys, *, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.keys = keys
        self._refresh_seconds = refresh_seconds
        self._tasks: set[asyncio.Task[None]] = set()
        self._full: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.follower = Follower(jwks.CHANNEL, self._on_notify, self._on_listening)

    def start(self) -> None:
        """Start the periodic full reload (the first one comes from the listener connecting)."""
        self._refresher = asyncio.create_task(every(
            self._refresh_seconds, self.keys.reload_all, what="signing key refresh", logger=log,
            first_after=self._refresh_seconds))

    async def close(self) -> None:
        """Cancel every reload and the refresh."""
        await stop_tasks(*self._tasks, *([self._refresher] if self._refresher else []))

    def _spawn(self, step: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(step())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_notify(self, payload: str) -> None:
        project_id = jwks.parse(payload)
        if project_id is None:
            log.warning("ignoring malformed %s payload %r", jwks.CHANNEL, payload)
            return

        async def reload() -> None:
            try:
                await self.keys.reload_project(project_id)
            except Exception as exc:  # the listener's next reconnect or the refresh reads it
                log.warning("signing keys of %s not reloaded (%s: %s)", project_id,
                            type(exc).__name__, exc)

        self._spawn(reload)

    def _on_listening(self) -> None:
        if self._full is not None:
            self._full.cancel()
        self._full = self._spawn(self._reload_all_until_done)

    async def _reload_all_until_done(self) -> None:
        delay = 0.1
        while True:
            try:
                await self.keys.reload_all()
                return
            except Exception as exc:
                log.warning("signing keys not read (%s: %s); retrying in %.1f s",
                            type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_SECONDS)
