"""The JWKS source: every project's published verification keys, read from PostgreSQL, and how
a verifier hears that they changed.

Contract: the control plane writes ``signing_keys`` (``control_plane.signing_keys``); a key is
published while it is ``pending`` or ``active``, and once ``retired`` until its
``publish_until``; its ``public_jwk`` is the RFC 7517 public JWK with ``kid`` and ``alg``. Both
services verify access tokens against these keys (:mod:`common.access_tokens`): the control
plane through a :class:`PgKeySource` (looked up per ``kid``, cached for a TTL), the engine
through a :class:`PublishedKeys` (every key in memory, kept current by notifications).

Key-change notification (the sibling of :mod:`common.changes` for tuples):

* channel: PostgreSQL ``NOTIFY`` channel :data:`CHANNEL`;
* payload: the project id whose keys changed (:func:`payload`, :func:`parse`);
* sender: the control plane, with ``SELECT pg_notify(CHANNEL, project_id)`` *inside* every
  transaction that inserts, activates, retires or deletes a project's key (creation of a first
  key, a pending key published ahead of a rotation, a rotation, deletion past
  ``publish_until``). PostgreSQL delivers it only at commit, so a listener never reloads before
  the change is readable;
* listener: the engine (``engine.registry`` listens, :class:`PublishedKeys` reloads that
  project). A notification is a hint: one may be missed while the listener reconnects, so the
  listener reloads every key after each (re)connection, and now and then as a safety net.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Iterable
from typing import Final

import asyncpg
from cachetools import TTLCache

from common.access_tokens import VerificationKey, public_key_from_jwk
from common.ids import is_id

__all__ = [
    "CACHE_SECONDS",
    "CHANNEL",
    "MISS_RELOAD_SECONDS",
    "PgKeySource",
    "PublishedKeys",
    "parse",
    "payload",
]

CHANNEL: Final = "authio_signing_keys"
"""The PostgreSQL ``NOTIFY`` channel a project's key changes are announced on."""

CACHE_SECONDS: Final = 60.0
"""How long :class:`PgKeySource` remembers a looked-up key (or the absence of one): a key's
``publish_until`` is set when it retires, so such a verifier sees the retirement within this
time (well inside the overlap window)."""

MISS_RELOAD_SECONDS: Final = 1.0
"""An unknown ``kid`` makes :class:`PublishedKeys` reload at most once per this many seconds per
project (and once for all tokens whose ``pid`` names no known project)."""

_SQL: Final = "SELECT project_id, alg, public_jwk, publish_until FROM signing_keys WHERE kid = $1"
_COLUMNS: Final = "kid, project_id, alg, public_jwk, publish_until"
_ALL_SQL: Final = f"SELECT {_COLUMNS} FROM signing_keys"
_PROJECT_SQL: Final = f"SELECT {_COLUMNS} FROM signing_keys WHERE project_id = $1"
# The project that owns a kid, all its keys: the global bucket's one query for an unknown pid.
_OWNER_SQL: Final = (f"SELECT {_COLUMNS} FROM signing_keys WHERE project_id = "
                     "(SELECT project_id FROM signing_keys WHERE kid = $1)")
_CACHE_SIZE: Final = 10_000
_GLOBAL: Final = ""  # the bucket of tokens whose pid is absent or names no known project


def payload(project_id: str) -> str:
    """The notification text for a change of ``project_id``'s keys (the id itself)."""
    return project_id


def parse(text: str) -> str | None:
    """The project id of a key-change notification; None when it is not one."""
    return text if is_id(text, "proj") else None


class PgKeySource:
    """Verification keys by ``kid`` from ``signing_keys``, each cached for ``ttl_seconds``. An
    unknown ``kid`` is remembered too, so forged tokens cost no query each."""

    def __init__(self, pool: asyncpg.Pool, *, ttl_seconds: float = CACHE_SECONDS) -> None:
        self._pool = pool
        self._cache: TTLCache[str, VerificationKey | None] = TTLCache(_CACHE_SIZE, ttl_seconds)

    async def get(self, kid: str, pid: str | None = None) -> VerificationKey | None:
        """The published key ``kid``, or None (``pid`` is not needed here). Raises what asyncpg
        raises when PostgreSQL is unreachable."""
        try:
            return self._cache[kid]
        except KeyError:
            pass
        row = await self._pool.fetchrow(_SQL, kid)
        key = None
        if row is not None:
            key = VerificationKey(kid, row["project_id"], row["alg"],
                                  public_key_from_jwk(row["public_jwk"]), row["publish_until"])
        self._cache[kid] = key
        return key


class PublishedKeys:
    """Every project's verification keys in memory (the engine's :class:`KeySource`).

    Filled by :meth:`reload_all` (at start and after every listener (re)connection) and
    :meth:`reload_project` (on a :data:`CHANNEL` notification); :meth:`get` answers from
    memory. An unknown ``kid`` reloads at most once per ``miss_reload_seconds`` per bucket: the
    token's unverified ``pid`` when it names a project with keys here (that project is
    reloaded), else one global bucket (the project owning ``kid`` is looked up). Concurrent
    misses of one bucket share its reload; a miss whose bucket reloaded too recently is None at
    once, so a flood of forged ``kid``s costs at most one query per second per bucket.
    :meth:`still_published` re-checks a key in memory (a cached verified token's, on every use).

    ``loads`` counts the queries made (full, project and miss reloads). Not thread-safe: one
    event loop.
    """

    def __init__(self, pool: asyncpg.Pool, *,
                 miss_reload_seconds: float = MISS_RELOAD_SECONDS) -> None:
        self._pool = pool
        self._miss_seconds = miss_reload_seconds
        self._keys: dict[str, VerificationKey] = {}
        self._until: dict[str, float] = {}  # kid -> publish_until (Unix s), inf while not retired
        self._by_project: dict[str, set[str]] = {}
        self._last_miss: dict[str, float] = {}  # bucket -> time.monotonic() of its last reload
        self._miss_loads: dict[str, asyncio.Task[None]] = {}
        self._project_loads: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._generation = 0  # bumped by every full reload
        self._touched: set[str] = set()  # projects replaced since the last full read began
        self.loaded = asyncio.Event()
        """Set once the first full reload is in."""
        self.loads = 0

    def __len__(self) -> int:
        return len(self._keys)

    def peek(self, kid: str) -> VerificationKey | None:
        """The key ``kid`` if it is in memory (no I/O)."""
        return self._keys.get(kid)

    def still_published(self, kid: str, now: float) -> bool:
        """Whether ``kid`` is in memory and published at ``now`` (Unix seconds): one dict
        lookup, for a token verified earlier."""
        return self._until.get(kid, -math.inf) >= now

    async def get(self, kid: str, pid: str | None = None) -> VerificationKey | None:
        """The key ``kid`` (published or retired: the verifier judges ``publish_until``), or
        None. ``pid`` is the token's *unverified* ``pid`` claim, used only to choose what to
        reload on a miss. Raises what asyncpg raises when PostgreSQL is unreachable during a
        miss's reload."""
        key = self._keys.get(kid)
        if key is not None:
            return key
        bucket = pid if pid is not None and pid in self._by_project else _GLOBAL
        task = self._miss_loads.get(bucket)
        if task is None:
            now = time.monotonic()
            if now - self._last_miss.get(bucket, -math.inf) < self._miss_seconds:
                return None
            self._last_miss[bucket] = now
            load = self.reload_project(bucket) if bucket else self._load_owner(kid)
            task = asyncio.ensure_future(load)
            self._miss_loads[bucket] = task
            task.add_done_callback(functools.partial(self._miss_done, bucket))
        await asyncio.shield(task)
        return self._keys.get(kid)

    def _miss_done(self, bucket: str, task: asyncio.Task[None]) -> None:
        _settle(task, self._miss_loads.pop(bucket, None))

    async def reload_all(self) -> None:
        """Replace every key in memory with what ``signing_keys`` holds now (one query). Raises
        what asyncpg raises."""
        generation = self._generation = self._generation + 1
        self.loads += 1
        touched = self._touched = set()
        rows = await self._pool.fetch(_ALL_SQL)
        if generation != self._generation:
            return  # a later full reload supersedes this one
        keys: dict[str, VerificationKey] = {}
        for row in rows:
            keys[row["kid"]] = self._key(row)
        self._keys = keys
        self._until = {kid: _until(k) for kid, k in keys.items()}
        by_project: dict[str, set[str]] = {}
        for kid, k in keys.items():
            by_project.setdefault(k.project_id, set()).add(kid)
        self._by_project = by_project
        self.loaded.set()
        # A project reloaded while the full read ran may have read a later state than it:
        # read those again rather than keep whichever finished last.
        for project_id in touched:
            await self.reload_project(project_id)

    async def reload_project(self, project_id: str) -> None:
        """Reload ``project_id``'s keys (one query; coalesced: at most one runs per project, and
        one more when asked again meanwhile). Raises what asyncpg raises."""
        task = self._project_loads.get(project_id)
        if task is not None:
            self._dirty.add(project_id)
        else:
            task = asyncio.ensure_future(self._project_loop(project_id))
            self._project_loads[project_id] = task
            task.add_done_callback(lambda t: _settle(t, self._project_loads.pop(project_id, None)))
        await asyncio.shield(task)

    async def _project_loop(self, project_id: str) -> None:
        while True:
            self._dirty.discard(project_id)
            self.loads += 1
            self._replace(project_id, await self._pool.fetch(_PROJECT_SQL, project_id))
            if project_id not in self._dirty:
                return

    async def _load_owner(self, kid: str) -> None:
        if not is_id(kid, "kid"):
            return
        self.loads += 1
        rows = await self._pool.fetch(_OWNER_SQL, kid)
        if rows:
            self._replace(rows[0]["project_id"], rows)

    def _replace(self, project_id: str, rows: Iterable[asyncpg.Record]) -> None:
        """Install ``rows`` as all of ``project_id``'s keys (keys gone from them are dropped)."""
        self._touched.add(project_id)
        fresh = {row["kid"]: self._key(row) for row in rows}
        for kid in self._by_project.get(project_id, set()) - fresh.keys():
            self._keys.pop(kid, None)
            self._until.pop(kid, None)
        for kid, key in fresh.items():
            self._keys[kid], self._until[kid] = key, _until(key)
        if fresh:
            self._by_project[project_id] = set(fresh)
        else:
            self._by_project.pop(project_id, None)

    def _key(self, row: asyncpg.Record) -> VerificationKey:
        """The key of ``row``, its public key parsed once per kid (a kid's key never changes:
        the one in memory is reused; callers build the new maps before replacing them)."""
        kid = row["kid"]
        known = self._keys.get(kid)
        public = known.key if known is not None else public_key_from_jwk(row["public_jwk"])
        return VerificationKey(kid, row["project_id"], row["alg"], public, row["publish_until"])


def _settle(task: asyncio.Task[None], _popped: object) -> None:
    """A done callback: the task's error is its awaiters' (marked retrieved: none may be
    left)."""
    if not task.cancelled():
        task.exception()


def _until(key: VerificationKey) -> float:
    return math.inf if key.publish_until is None else key.publish_until.timestamp()
