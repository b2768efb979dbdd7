"""Signing-key rules: the lifecycle, first keys, manual and scheduled rotation, the JWK Set.

Lifecycle (SPEC.md 2 "overlap window"): ``pending`` (published in the JWKS, not yet signing, so
verifiers' 10-minute JWKS caches learn it first) → ``active`` → ``retired`` with ``publish_until
= retired_at + access-token lifetime + RETIRED_SKEW_SECONDS`` (every token it signed has expired
by then) → deleted once ``publish_until`` has passed.

* :func:`ensure_active_key`: a project with no active key gets one on first use (concurrent first
  uses end with one key, which all of them use).
* :func:`rotate_now`: ``POST /v1/signing-keys/rotate`` and a change of the project's
  ``signing_alg``: a new key signs at once.
* :class:`Keyring`: each project's active key, unsealed once and kept in memory: signing costs
  no query while its cache is warm (``active_cache_seconds``; a rotation by another process is
  picked up that quickly, and the retired key stays published long past that). A process that
  rotates a project's key calls :meth:`Keyring.forget`, so its next token is signed with the new
  key at once.
* :func:`rotation_pass`: every ``signing_key_check_seconds`` (``tasks``), a project whose active
  key is older than ``rotation_days - prepublish`` gets a pending key; once the active key is
  older than ``rotation_days`` and the pending key has been published ``prepublish`` seconds,
  the pending key becomes active and the old one retires (``signing_key.rotated``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import asyncpg
import orjson
from cachetools import LRUCache

from common.access_tokens import Alg
from common.errors import ProjectNotFound
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.signing_keys import repository
from control_plane.signing_keys.crypto import PrivateKey, generate_key, open_private_key
from control_plane.signing_keys.schemas import SigningKey
from control_plane.web.actor import Actor, system_actor

# Retired keys stay published this long past the access-token lifetime: tokens signed by
# another process in the few seconds it takes to notice a rotation, and verifiers' clock skew.
RETIRED_SKEW_SECONDS: Final = 300
ROTATION_ACTOR: Final = system_actor("signing_key_rotation")


def overlap(settings: Settings) -> timedelta:
    """How long a retired key stays published: the access-token lifetime plus the skew."""
    return timedelta(seconds=settings.access_token_ttl_seconds + RETIRED_SKEW_SECONDS)


async def ensure_active_key(pool: asyncpg.Pool, kms: LocalKms, project_id: str) -> asyncpg.Record:
    """The project's active key (``kid``, ``alg``, ``private_sealed``), created in the project's
    ``signing_alg`` when it has none (a project made by bootstrap starts without one).

    Race-safe without locks: the insert yields to the partial unique index (``ON CONFLICT DO
    NOTHING``) and the key is read back, so concurrent first uses all end with the one key that
    won. Raises ProjectNotFound.
    """
    row = await repository.active_key(pool, project_id)
    if row is not None:
        return row
    alg = await repository.project_alg(pool, project_id)
    if alg is None:
        raise ProjectNotFound(details={"project_id": project_id})
    key = await generate_key(kms, alg)
    async with pool.acquire() as conn, conn.transaction():
        if await repository.insert(conn, project_id, key, "active", unless_active=True):
            await audit.record(
                conn, ROTATION_ACTOR, action="signing_key.created", project_id=project_id,
                target_type="signing_key", target_id=key.kid,
                description=f"Created the project's first {alg} signing key",
                metadata={"kid": key.kid, "alg": alg},
            )
    row = await repository.active_key(pool, project_id)
    assert row is not None  # ours or the concurrent winner's (an active key is never removed)
    return row


async def published_jwks(pool: asyncpg.Pool, kms: LocalKms,
                         project_id: str) -> list[dict[str, Any]]:
    """The project's JWK Set members: active, pending and still-published retired keys (active
    first, then newest first). Creates the active key when the project has none yet, so a
    verifier that fetches the JWKS at boot already knows the key its first token will carry."""
    rows = await repository.published(pool, project_id)
    if not any(r["status"] == "active" for r in rows):
        await ensure_active_key(pool, kms, project_id)
        rows = await repository.published(pool, project_id)
    return [r["public_jwk"] for r in rows]


def jwks_etag(keys: list[dict[str, Any]]) -> str:
    """A strong ETag value (without quotes) of the JWK Set."""
    return hashlib.sha256(orjson.dumps(keys, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


async def _locked_alg(conn: asyncpg.Connection, project_id: str) -> Alg:
    alg = await repository.project_alg(conn, project_id, lock=True)
    if alg is None:
        raise ProjectNotFound(details={"project_id": project_id})
    return alg


async def rotate_now(
    conn: asyncpg.Connection, actor: Actor, *, kms: LocalKms, settings: Settings,
    project_id: str, alg: Alg | None = None, reason: str = "manual",
) -> SigningKey:
    """Make a new key active at once and retire the current one with the overlap window.

    ``alg`` (default: the project's ``signing_alg``) becomes the project's ``signing_alg`` so the
    next scheduled rotation keeps it. A pending key of that algorithm becomes the new active key
    (verifiers may already have it cached); a pending key of another algorithm never signed
    anything and is dropped. Writes ``signing_key.rotated`` (metadata ``old_kid``, ``old_alg``,
    ``new_kid``, ``alg``, ``reason``) in the same transaction (a savepoint of the caller's).
    Returns the new key. Raises ProjectNotFound.
    """
    async with conn.transaction():
        current = await _locked_alg(conn, project_id)
        target: Alg = alg or current
        if target != current:
            await repository.set_project_alg(conn, project_id, target)
        pending = await repository.pending_key(conn, project_id)
        if pending is not None and pending["alg"] == target:
            new_kid = pending["kid"]
            old = await repository.retire_active(conn, project_id, overlap(settings))
            await repository.activate(conn, new_kid)
        else:
            if pending is not None:
                await repository.delete_key(conn, pending["kid"])
            key = await generate_key(kms, target)
            new_kid = key.kid
            old = await repository.retire_active(conn, project_id, overlap(settings))
            await repository.insert(conn, project_id, key, "active")
        await audit.record(
            conn, actor, action="signing_key.rotated", project_id=project_id,
            target_type="signing_key", target_id=new_kid,
            description=f"Rotated the signing key ({reason})",
            metadata={"old_kid": old["kid"] if old else None, "old_alg": old["alg"] if old else None,
                      "new_kid": new_kid, "alg": target, "reason": reason},
        )
        return await repository.get_key(conn, new_kid)


@dataclass(frozen=True, slots=True)
class RotationPass:
    """What one pass of the rotation worker did (``kid``s)."""

    published: list[str]
    rotated: list[str]
    deleted: list[str]


async def _advance(conn: asyncpg.Connection, kms: LocalKms, settings: Settings,
                   project_id: str) -> tuple[str | None, str | None]:
    """One project's scheduled step, under its row lock. Returns (the kid newly published as
    pending, the kid newly activated)."""
    rotate_after = timedelta(days=settings.signing_key_rotation_days)
    prepublish = timedelta(seconds=settings.signing_key_prepublish_seconds)
    async with conn.transaction():
        try:
            project_alg = await _locked_alg(conn, project_id)
        except ProjectNotFound:
            return None, None
        keys = await repository.live_keys(conn, project_id)
        active, pending = keys.get("active"), keys.get("pending")
        if active is None or active["active_for"] < rotate_after - prepublish:
            return None, None  # re-checked under the lock: another process may have rotated
        if pending is not None and pending["alg"] != project_alg:
            await repository.delete_key(conn, pending["kid"])
            pending = None
        if pending is None:
            key = await generate_key(kms, project_alg)
            await repository.insert(conn, project_id, key, "pending")
            return key.kid, None
        if active["active_for"] < rotate_after or pending["published_for"] < prepublish:
            return None, None
        await repository.retire_active(conn, project_id, overlap(settings))
        await repository.activate(conn, pending["kid"])
        await audit.record(
            conn, ROTATION_ACTOR, action="signing_key.rotated", project_id=project_id,
            target_type="signing_key", target_id=pending["kid"],
            description="Rotated the signing key (scheduled)",
            metadata={"old_kid": active["kid"], "old_alg": active["alg"], "new_kid": pending["kid"],
                      "alg": pending["alg"], "reason": "scheduled"},
        )
        return None, pending["kid"]


async def rotation_pass(pool: asyncpg.Pool, kms: LocalKms, settings: Settings) -> RotationPass:
    """One pass over every project whose active key is due for a pending key or rotation, then
    the deletion of retired keys past ``publish_until``."""
    due_after = max(settings.signing_key_rotation_days * 86_400
                    - settings.signing_key_prepublish_seconds, 0.0)
    published: list[str] = []
    rotated: list[str] = []
    for project_id in await repository.projects_due(pool, due_after):
        async with pool.acquire() as conn:
            new_pending, activated = await _advance(conn, kms, settings, project_id)
        if new_pending:
            published.append(new_pending)
        if activated:
            rotated.append(activated)
    deleted = await repository.delete_expired(pool)
    return RotationPass(published, rotated, deleted)


# --- the keyring --------------------------------------------------------------------------------

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
