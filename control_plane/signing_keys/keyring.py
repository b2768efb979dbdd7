"""The keyring: each project's active signing key, unsealed once and kept in memory.

Hot path (sign-in and refresh at thousands per second): a private key is unsealed once per
``kid`` and kept; the project's active ``kid`` is remembered for ``active_cache_seconds`` (a
rotation by another process is picked up that quickly; the retired key stays published long past
that), so signing costs no database query while the cache is warm. A process that rotates a
project's key calls :meth:`Keyring.forget`, so its next token is signed with the new key at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Final

import asyncpg
from cachetools import LRUCache

from common.access_tokens import Alg
from control_plane.kms import LocalKms
from control_plane.signing_keys.crypto import PrivateKey, open_private_key
from control_plane.signing_keys.service import ensure_active_key

ACTIVE_CACHE_SECONDS: Final = 5.0
_CACHE_SIZE: Final = 10_000


@dataclass(frozen=True, slots=True)
class Signer:
    """A project's active key, ready to sign: ``kid``, ``alg`` and the private key."""

    kid: str
    alg: Alg
    key: PrivateKey


@dataclass(frozen=True, slots=True)
class _Active:
    signer: Signer
    fresh_until: float  # time.monotonic()


class Keyring:
    """The active signer of each project (one per process, ``control_plane.appkeys.KEYRING``)."""

    def __init__(self, pool: asyncpg.Pool, kms: LocalKms, *,
                 active_cache_seconds: float = ACTIVE_CACHE_SECONDS) -> None:
        self._pool, self._kms = pool, kms
        self._active_seconds = active_cache_seconds
        self._active: dict[str, _Active] = {}
        self._loading: dict[str, asyncio.Task[Signer]] = {}
        self._signers: LRUCache[str, Signer] = LRUCache(_CACHE_SIZE)

    async def signer(self, project_id: str) -> Signer:
        """The project's active signer; creates the project's first key when it has none.
        Raises ProjectNotFound for an unknown project."""
        cached = self._active.get(project_id)
        if cached is not None and cached.fresh_until > time.monotonic():
            return cached.signer
        # One load per project at a time, however many requests are waiting for it.
        task = self._loading.get(project_id)
        if task is None:
            task = asyncio.create_task(self._load_active(project_id), name=project_id)
            self._loading[project_id] = task
            task.add_done_callback(self._loaded)
        return await asyncio.shield(task)

    def forget(self, project_id: str) -> None:
        """Drop the remembered active key of ``project_id`` (after this process rotated it)."""
        self._active.pop(project_id, None)

    def _loaded(self, task: asyncio.Task[Signer]) -> None:
        self._loading.pop(task.get_name(), None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter gets it, and none may be left

    async def _load_active(self, project_id: str) -> Signer:
        row = await ensure_active_key(self._pool, self._kms, project_id)
        signer = self._signers.get(row["kid"])
        if signer is None:
            signer = Signer(row["kid"], row["alg"],
                            open_private_key(self._kms, row["kid"], row["private_sealed"]))
            self._signers[signer.kid] = signer
        self._active[project_id] = _Active(signer, time.monotonic() + self._active_seconds)
        return signer
