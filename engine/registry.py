"""Every store's tuple graph in memory, kept current by following the ``tuple_changes`` log.

Life cycle of a :class:`StoreRegistry` (DESIGN.md "Two services, one product"):

1. ``start()`` spawns the runner. It first opens a dedicated connection and ``LISTEN``\\s on
   ``authio_tuple_changes`` (the contract of :mod:`common.changes`: payload
   ``"<store_id>:<revision>"``, sent by the control plane in the write transaction, and with
   revision 0 when a store is created), *then* loads a consistent snapshot of every store in one
   ``REPEATABLE READ READ ONLY`` transaction (``COPY ... TO STDOUT``, parsed here), then runs one
   poll pass that catches up every store still behind. Only then is :attr:`StoreRegistry.ready`
   true. Listening before the snapshot means no change committed after the snapshot can go
   unnoticed.
2. Following: a notification newer than the store's revision schedules a catch-up of that store
   (at most one running per store; one more run if more arrived meanwhile); a notification for an
   unknown store loads it. A poll every ``poll_seconds`` (``SELECT id, project_id, revision FROM
   stores``) is the fallback: it catches up stores behind, loads new ones and forgets deleted
   ones. A lost listener connection is reopened with backoff, followed by a full poll pass; one
   that stopped answering without closing (a half-open TCP link: no FIN, no RST, as after a
   network partition or a failover behind an address that stays) is found by a probe query
   every ``listener_probe_seconds`` and counted as lost.
   While the engine cannot follow the log (its listener connection is lost, or a poll failed or
   did not answer within ``contact_timeout_seconds``), :attr:`StoreRegistry.stale` is true and
   checks say they are answered from memory; it turns false again after a poll succeeds with
   the listener connected, that is once the engine has caught up.
3. ``close()`` cancels every task and closes the listener connection.

On-demand mode (``stores="on_demand"``, ``SERVICE_ENGINE_STORES=on_demand``; docs/sharding.md):
for an engine replica behind an ingress that shards checks by ``store_id``, which should hold
only the stores routed to it. No snapshot: the registry is :attr:`~StoreRegistry.ready` as soon
as the listener is connected. A store is loaded on its first lookup (:meth:`StoreRegistry.find`:
one load per store however many requests ask, each waiting at most its bound, then ``not_ready``
503 with ``Retry-After`` while the load goes on; a failed load raises to the requests that
waited on it and the next request starts another), then followed like any other. Notifications
and polls only concern stores in memory (the poll reads their rows alone); a notification heard
while a store loads is kept and caught up after. A store no lookup touched for
``idle_seconds`` is dropped (a sweep every quarter of that, at most every minute, so a store is
dropped between ``idle_seconds`` and 1.25 times that after its last use); its next lookup loads
it again from a new snapshot, which holds every change made meanwhile.

Other feeds may share the listener connection (:class:`Follower`: ``engine.keys`` follows the
signing-key channel of :mod:`common.jwks` this way): each hears its channel's payloads, and is
told after every (re)connection, since what was sent while nobody listened is gone.

The revision is the cursor: a catch-up reads, in one statement (one snapshot), the store's
current ``stores.revision`` and every ``tuple_changes`` row above the loaded revision up to it,
applies them in ``(revision, seq)`` order without yielding to the event loop, and only then sets
the store's revision. A check therefore never sees half a revision, and nothing is skipped:
revisions commit in order per store (the write transaction locks the store row first).

This module knows no HTTP. It never writes PostgreSQL. Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import asyncpg
from cachetools import TTLCache

from common import changes
from common.errors import NotReady
from engine import store_metrics
from engine.graph import StoreGraph, gc_paused

__all__ = ["Follower", "LoadedStore", "StoreMode", "StoreRegistry"]

log = logging.getLogger("authio.engine.registry")

PROBE_SECONDS_MAX: Final = 5.0
"""The longest default period of the listener's probe (``SERVICE_ENGINE_POLL_SECONDS`` may be
much longer: a silent listener would then go unnoticed for as long)."""

StoreMode = Literal["all", "on_demand"]
"""Which stores a registry holds: every store from start (``all``), or the ones asked for
(``on_demand``, see the module docstring)."""

ON_DEMAND_FREEZE_ROWS: Final = 100_000
"""In on-demand mode, a store loaded with at least this many tuples is moved out of the
collected generations (``gc.freeze()``) as the start-up snapshot is: a full collection would
otherwise walk it. Smaller ones are left to the collector: each freeze also keeps whatever
cyclic garbage exists at that moment, and a replica loads stores all its life."""

IDLE_SWEEP_SECONDS_MAX: Final = 60.0
"""The longest period of the idle sweep (on-demand mode)."""

_STORES_SQL: Final = "SELECT id, project_id, revision FROM stores"
# On-demand mode's poll: the rows of the stores in memory only (the primary key).
_SOME_STORES_SQL: Final = (
    "SELECT id, project_id, revision FROM stores WHERE id = ANY($1::text[])")
_STORE_SQL: Final = "SELECT project_id, revision FROM stores WHERE id = $1"
_HEAD_SQL: Final = "SELECT revision FROM stores WHERE id = $1"  # the primary key
# The node key "object#relation" is joined here, not per row in Python (StoreGraph.load_nodes).
_ALL_TUPLES_SQL: Final = "SELECT store_id, object || '#' || relation, subject FROM tuples"
_STORE_TUPLES_SQL: Final = (
    "SELECT store_id, object || '#' || relation, subject FROM tuples WHERE store_id = $1")
# One statement, hence one snapshot: the store's revision and every change above the cursor up to
# it. The LEFT JOIN yields one all-NULL change row when there is nothing to apply, and no row at
# all when the store no longer exists.
_CATCH_UP_SQL: Final = """
SELECT s.revision AS store_revision, c.operation, c.object, c.relation, c.subject
FROM stores s
LEFT JOIN tuple_changes c
  ON c.store_id = s.id AND c.revision > $2 AND c.revision <= s.revision
WHERE s.id = $1
ORDER BY c.revision, c.seq
"""

_COPY_UNESCAPE: Final = re.compile(r"\\(.)")
_COPY_ESCAPES: Final = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


@dataclass(frozen=True, slots=True)
class Follower:
    """Another ``NOTIFY`` channel heard on the registry's listener connection.

    ``on_notify(payload)`` runs for each notification on ``channel``; ``on_listening()`` after
    every (re)connection of the listener, the first included, once ``channel`` is listened to
    (what was sent before may have been missed: read it all again). Both are sync, on the event
    loop, and must not raise (an error is logged)."""

    channel: str
    on_notify: Callable[[str], None]
    on_listening: Callable[[], None]


@dataclass(slots=True, eq=False)
class LoadedStore:
    """One store in memory.

    * ``id``, ``project_id``: from the ``stores`` row.
    * ``graph``: its tuples (mutated in place as changes are applied).
    * ``revision``: the store revision ``graph`` reflects exactly (the ``tuple_changes`` cursor);
      only ever increases.
    * ``used``: set by every :meth:`StoreRegistry.peek` that finds it, cleared by the idle sweep
      (on-demand mode), which then notes ``idle_since`` (``time.monotonic()`` seconds).
    """

    id: str
    project_id: str
    graph: StoreGraph
    revision: int
    used: bool = False
    idle_since: float = 0.0


def _unescape_copy(field: str) -> str:
    """Undo the backslash escapes of PostgreSQL's text ``COPY`` output."""
    return _COPY_UNESCAPE.sub(lambda m: _COPY_ESCAPES.get(m.group(1), m.group(1)), field)


class _CopySink:
    """Parses text-format ``COPY (store_id, object || '#' || relation, subject) TO STDOUT``
    chunks.

    Rows are fed straight into ``graphs[store_id].load_nodes`` chunk by chunk, so the whole table
    is never held in memory twice. Rows of a store absent from ``graphs`` are ignored (cannot
    happen inside one snapshot: ``tuples.store_id`` references ``stores``). The graphs must be
    new: the rows of one snapshot are distinct pairs (the table's primary key is the tuple, and
    its constraints keep ``#`` out of objects and relations: migration 0008), which
    ``load_nodes(..., distinct=True)`` takes on trust.
    """

    __slots__ = ("_rest", "graphs", "rows")

    def __init__(self, graphs: dict[str, StoreGraph]) -> None:
        self.graphs = graphs
        self.rows = 0
        self._rest = b""

    async def __call__(self, chunk: bytes) -> None:
        data = self._rest + chunk if self._rest else chunk
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        if cut:
            self._feed(data[: cut - 1].decode())

    def finish(self) -> None:
        """Raise ValueError when the stream ended inside a row."""
        if self._rest:
            raise ValueError("COPY output ended inside a row")

    def _feed(self, text: str) -> None:
        # Tabs and newlines inside values are escaped, so splitting on the raw characters is exact.
        f = text.replace("\n", "\t").split("\t")
        if len(f) % 3:
            raise ValueError("unexpected COPY row shape")
        if "\\" in text:
            f = [_unescape_copy(x) if "\\" in x else x for x in f]
        n = len(f) // 3
        self.rows += n
        sids = f[0::3]
        first = sids[0]
        if sids[-1] == first and sids.count(first) == n:  # the usual case: one store per chunk
            graph = self.graphs.get(first)
            if graph is not None:
                graph.load_nodes(zip(f[1::3], f[2::3], strict=True), distinct=True)
            return
        per_store: dict[str, list[tuple[str, str]]] = {}
        for i in range(0, len(f), 3):
            per_store.setdefault(f[i], []).append((f[i + 1], f[i + 2]))
        for sid, rows in per_store.items():
            graph = self.graphs.get(sid)
            if graph is not None:
                graph.load_nodes(rows, distinct=True)


class StoreRegistry:
    """All stores' graphs in memory, following the change log (see the module docstring).

    ``pool`` serves snapshot, load, catch-up and poll queries (read-only); ``dsn`` opens the
    dedicated listener connection. ``poll_seconds`` is the fallback poll period (s);
    ``negative_ttl_seconds`` how long "no such store" is remembered (s); ``load_timeout_seconds``
    bounds one snapshot or store load (s); ``max_backoff_seconds`` caps the listener reconnect
    backoff (s); ``contact_timeout_seconds`` how long a poll's first query, or the listener's
    probe, may take before the engine counts itself cut off from the log (s);
    ``listener_probe_seconds`` how often the listener connection is asked ``SELECT 1`` (s,
    default ``poll_seconds``, at most :data:`PROBE_SECONDS_MAX` whatever the poll), so that one
    which went silent is replaced within that period plus ``contact_timeout_seconds``, not left
    deaf. ``freeze_gc`` moves everything alive after the
    snapshot into the interpreter's permanent GC generation (``gc.freeze()``, process-wide): the
    graphs hold no reference cycles and are still freed by reference counting, and a full
    collection no longer walks them (measured: about 65 ms per full collection with 1M tuples
    loaded, about 0 after). The collection before freezing runs before the snapshot, not after.
    ``stores`` is ``"all"`` (the snapshot of every store at start) or ``"on_demand"`` (see the
    module docstring), with ``idle_seconds`` (s) before an unused store is dropped (on-demand
    only).
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        dsn: str,
        poll_seconds: float = 1.0,
        negative_ttl_seconds: float = 1.0,
        load_timeout_seconds: float = 3600.0,
        max_backoff_seconds: float = 5.0,
        contact_timeout_seconds: float = 5.0,
        listener_probe_seconds: float | None = None,
        freeze_gc: bool = True,
        followers: Iterable[Follower] = (),
        stores: StoreMode = "all",
        idle_seconds: float = 3600.0,
    ) -> None:
        if stores not in ("all", "on_demand"):
            raise ValueError(f"stores must be 'all' or 'on_demand', not {stores!r}")
        if idle_seconds <= 0:
            raise ValueError("idle_seconds must be positive")
        self.on_demand = stores == "on_demand"
        """True in on-demand mode (read only)."""
        self._idle_seconds = idle_seconds
        self._pool = pool
        self._dsn = dsn
        self._poll_seconds = poll_seconds
        self._load_timeout = load_timeout_seconds
        self._max_backoff = max_backoff_seconds
        self._contact_timeout = contact_timeout_seconds
        self._probe_seconds = min(poll_seconds, PROBE_SECONDS_MAX) if (
            listener_probe_seconds is None) else listener_probe_seconds
        self._freeze_gc = freeze_gc
        self._followers = tuple(followers)
        self._stores: dict[str, LoadedStore] = {}
        self._missing: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=negative_ttl_seconds)
        self._loads: dict[str, asyncio.Task[LoadedStore | None]] = {}
        self._load_hint: dict[str, int] = {}  # store being loaded -> highest revision heard of
        self._catch_ups: dict[str, asyncio.Task[None]] = {}
        self._heard: dict[str, int] = {}  # store -> a revision known committed (not applied yet)
        self._heads: dict[str, asyncio.Task[int | None]] = {}  # head lookups in flight
        self._dirty: set[str] = set()
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        # Notifications heard before the snapshot (none to wait for in on-demand mode).
        self._early: dict[str, int] | None = None if self.on_demand else {}
        self._ready = asyncio.Event()
        self._listener: Any = None  # asyncpg.Connection
        self._listener_lost = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.stale = False
        """True while the engine cannot follow the change log (see the module docstring): its
        stores are as of their last revision, which may be behind. A plain attribute: the check
        path reads it on every answer."""
        store_metrics.watch(self)

    # -- public surface ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once the snapshot is loaded and every store caught up (on-demand mode: once the
        listener is connected); stays true afterwards."""
        return self._ready.is_set()

    def __len__(self) -> int:
        """Number of stores in memory."""
        return len(self._stores)

    def tuples(self) -> int:
        """Number of tuples in memory, over every store (O(stores))."""
        return sum(len(s.graph) for s in list(self._stores.values()))

    def start(self) -> None:
        """Spawn the runner (listen, snapshot, catch up, then follow). Returns at once.

        Failures while starting (PostgreSQL down) are logged and retried with backoff;
        :attr:`ready` stays false until the snapshot is in. Raises RuntimeError if already started.
        """
        if self._tasks or self._closed:
            raise RuntimeError("StoreRegistry.start() called twice")
        self._tasks.append(asyncio.create_task(self._run(), name="engine-registry"))

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for :attr:`ready`; return whether it is."""
        if self._ready.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        return self._ready.is_set()

    def peek(self, store_id: str) -> LoadedStore | None:
        """The store if it is in memory, without any I/O (the hot path's first try); marks it
        used (one attribute store: what the idle sweep of on-demand mode reads)."""
        store = self._stores.get(store_id)
        if store is not None:
            store.used = True
        return store

    async def get(self, store_id: str) -> LoadedStore | None:
        """The store ``store_id``, loading it from PostgreSQL when not in memory; None if absent.

        Waits for :attr:`ready` first (the snapshot may hold the store). A lookup for an unknown
        id is single-flight per id, and a miss is remembered for ``negative_ttl_seconds``.
        Raises asyncpg / OSError errors when PostgreSQL cannot be read.
        """
        store = self._stores.get(store_id)
        if store is not None:
            return store
        if not self._ready.is_set():
            await self._ready.wait()
            store = self._stores.get(store_id)
            if store is not None:
                return store
        if store_id in self._missing:
            return None
        return await asyncio.shield(self._request_load(store_id))

    async def find(self, store_id: str, ready_timeout_s: float) -> LoadedStore | None:
        """:meth:`get` for a request: waits at most ``ready_timeout_s`` seconds for the start-up
        load, then raises ``common.errors.NotReady`` (503 ``not_ready``) instead of waiting on.
        In on-demand mode the store's own load is bounded the same way (``not_ready`` with
        ``Retry-After: 1``; the load goes on, and a retry finds it or waits on the same load).
        None if absent; raises what :meth:`get` raises (a failed load: asyncpg / OSError, 503
        ``db_unavailable`` through the envelope; the next request starts another load)."""
        store = self._stores.get(store_id)
        if store is None:
            if not self.ready and not await self.wait_ready(ready_timeout_s):
                raise NotReady()
            if not self.on_demand:
                return await self.get(store_id)
            bound = asyncio.timeout(ready_timeout_s)
            try:
                async with bound:
                    store = await self.get(store_id)
            except TimeoutError:
                if not bound.expired():
                    raise  # the load's own
                raise NotReady("The store is loading into this engine; retry.",
                               headers={"Retry-After": "1"}) from None
            if store is not None:
                store.used = True
        return store

    async def wait_for(self, store: LoadedStore, revision: int, timeout_s: float) -> bool:
        """Wait until ``store`` reflects at least ``revision``; True if reached within
        ``timeout_s`` seconds, False otherwise (``consistency.at_least_revision``).

        Returns at once when already reached; otherwise asks for a catch-up and waits for the
        apply step to wake it.
        """
        if store.revision >= revision:
            return True
        if self._stores.get(store.id) is not store:
            return False  # deleted meanwhile: it will never advance
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (revision, fut)
        self._waiters.setdefault(store.id, []).append(entry)
        try:
            self._request_catch_up(store.id)
            if timeout_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await fut
        finally:
            current = self._waiters.get(store.id)
            if current is not None:
                with contextlib.suppress(ValueError):
                    current.remove(entry)
                if not current:
                    del self._waiters[store.id]
        return store.revision >= revision

    def heard(self, store: LoadedStore) -> int:
        """The highest revision of ``store`` known to be committed, without any I/O: what it
        reflects, or more when a notification, a poll or a :meth:`head` lookup said so. A revision
        at or below it needs only a wait (:meth:`wait_for`); above it, :meth:`head` tells whether
        it exists at all."""
        heard = self._heard.get(store.id, -1)
        return heard if heard > store.revision else store.revision

    async def head(self, store_id: str, timeout_s: float) -> int | None:
        """The store's committed revision as PostgreSQL has it now (``stores.revision``, one
        primary-key lookup), or None when the store no longer exists. Asked only for a revision
        above :meth:`heard`, never on a check's usual path; concurrent lookups of one store share
        one query, and the answer raises what :meth:`heard` returns.

        Raises TimeoutError after ``timeout_s`` seconds (the query goes on for the other callers
        and is then cancelled by its own bound), asyncpg and OSError errors when PostgreSQL
        cannot be read."""
        task = self._heads.get(store_id)
        if task is None:
            task = asyncio.create_task(self._read_head(store_id, timeout_s),
                                       name=f"engine-head-{store_id}")
            self._heads[store_id] = task
            task.add_done_callback(functools.partial(self._head_done, store_id))
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(task)

    async def _read_head(self, store_id: str, timeout_s: float) -> int | None:
        async with asyncio.timeout(max(timeout_s, self._contact_timeout)):
            revision: int | None = await self._pool.fetchval(_HEAD_SQL, store_id)
        if revision is not None:
            self._hear(store_id, revision)
        return revision

    def _head_done(self, store_id: str, task: asyncio.Task[int | None]) -> None:
        if self._heads.get(store_id) is task:
            del self._heads[store_id]
        if not task.cancelled():
            task.exception()  # retrieved: each caller got it (or timed out first)

    def _hear(self, store_id: str, revision: int) -> None:
        """Remember that ``store_id`` has committed ``revision`` (for a store in memory)."""
        store = self._stores.get(store_id)
        if store is not None and revision > store.revision and revision > self._heard.get(
                store_id, -1):
            self._heard[store_id] = revision

    async def close(self) -> None:
        """Cancel every task, wake every waiter and close the listener connection."""
        self._closed = True
        tasks = [*self._tasks, *self._catch_ups.values(), *self._loads.values(),
                 *self._heads.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        for waiters in self._waiters.values():
            for _, fut in waiters:
                if not fut.done():
                    fut.cancel()
        self._waiters.clear()
        await self._close_listener()

    # -- the runner --------------------------------------------------------------------------

    async def _run(self) -> None:
        await self._retry("open the listener", self._connect_listener)
        if self.on_demand:
            if self._freeze_gc:
                gc.collect()
                gc.freeze()  # start-up's modules and objects: no store yet
            self._ready.set()
            log.info("engine ready: stores load on demand, dropped after %.0f s unused",
                     self._idle_seconds)
            self._tasks.append(asyncio.create_task(self._poll_loop(), name="engine-poll"))
            self._tasks.append(asyncio.create_task(self._keep_listening(), name="engine-listen"))
            self._tasks.append(asyncio.create_task(self._probe_loop(),
                                                   name="engine-listen-probe"))
            self._tasks.append(asyncio.create_task(self._idle_loop(), name="engine-idle"))
            return
        if self._freeze_gc:
            # Collect while the heap is still small: after the snapshot a full collection walks
            # every container of the graphs (0.2-0.6 s with 1M tuples, all in the youngest
            # generation since loads pause the collector) only to find them alive. What the
            # load leaves is reference-counted garbage, so freezing without a collection
            # keeps at most a few cycles of start-up objects.
            gc.collect()
        await self._retry("load the snapshot", self._load_snapshot)
        await self._retry("catch up after the snapshot", self._poll_once)
        if self._freeze_gc:
            gc.freeze()
        self._ready.set()
        log.info("engine ready: %d stores in memory", len(self._stores))
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="engine-poll"))
        self._tasks.append(asyncio.create_task(self._keep_listening(), name="engine-listen"))
        self._tasks.append(asyncio.create_task(self._probe_loop(), name="engine-listen-probe"))

    async def _retry(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        backoff = 0.1
        while True:
            try:
                await step()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("engine could not %s; retrying in %.1f s", what, backoff,
                            exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            listener = self._listener
            if listener is None or listener.is_closed():
                # Also true while _keep_listening reconnects; _connect_listener clears the flag
                # once the new connection is installed, so this cannot undo a slow reconnect.
                self._listener_lost.set()
            try:
                await self._poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._mark_stale("its poll of the change log failed")
                log.warning("engine poll failed; next try in %.1f s", self._poll_seconds,
                            exc_info=True)
            else:
                self._mark_fresh()

    async def _keep_listening(self) -> None:
        while True:
            await self._listener_lost.wait()
            log.warning("engine lost its LISTEN connection; reconnecting")
            await self._close_listener()
            await self._retry("reopen the listener", self._connect_listener)
            # Notifications sent while nobody listened are gone: a full pass finds what they said.
            await self._retry("poll after reconnecting", self._poll_once)
            self._mark_fresh()

    async def _probe_loop(self) -> None:
        """Ask the listener a question every ``listener_probe_seconds``: a connection whose link
        died without a word still says it is open (``is_closed()`` is false, no termination
        callback runs) and would never hear a notification again, so tuple changes would wait
        for the poll and key changes (``engine.keys``) for their five-minute reload. One that
        does not answer within ``contact_timeout_seconds`` is counted as lost."""
        while True:
            await asyncio.sleep(self._probe_seconds)
            listener = self._listener
            if listener is None or listener.is_closed() or self._listener_lost.is_set():
                continue  # gone already: _keep_listening is on it
            try:
                async with asyncio.timeout(self._contact_timeout):
                    await listener.fetchval("SELECT 1")
            except Exception as exc:  # TimeoutError, or the connection failed under the query
                if listener is self._listener:
                    log.warning("engine's LISTEN connection did not answer its probe (%s)",
                                type(exc).__name__)
                    self._mark_stale("its LISTEN connection stopped answering")
                    self._listener_lost.set()
                    listener.terminate()  # no goodbye over a link that cannot answer

    def _mark_stale(self, why: str) -> None:
        if not self.stale:
            self.stale = True
            log.warning("engine cannot follow the change log (%s); checks are answered from "
                        "memory and marked stale until it catches up", why)

    def _mark_fresh(self) -> None:
        """After a successful poll: fresh again if the listener is connected too."""
        listener = self._listener
        if self.stale and listener is not None and not listener.is_closed():
            self.stale = False
            log.info("engine follows the change log again")

    # -- listening ---------------------------------------------------------------------------

    async def _connect_listener(self) -> None:
        conn = await asyncpg.connect(
            self._dsn, timeout=10, server_settings={"application_name": "authio-engine-listen"}
        )
        try:
            conn.add_termination_listener(self._on_listener_terminated)
            await conn.add_listener(changes.CHANNEL, self._on_notify)
            for follower in self._followers:
                await conn.add_listener(follower.channel, functools.partial(
                    self._on_follower_notify, follower))
        except BaseException:
            conn.terminate()
            raise
        self._listener = conn
        # Cleared only now: while the connect was in progress (no listener), the poll loop may
        # have flagged the loss again; that flag is about the old connection, not this one.
        self._listener_lost.clear()
        for follower in self._followers:
            try:
                follower.on_listening()
            except Exception:
                log.exception("the %s follower failed on (re)connection", follower.channel)

    @staticmethod
    def _on_follower_notify(follower: Follower, conn: Any, pid: int, channel: str,
                            payload: str) -> None:
        try:
            follower.on_notify(payload)
        except Exception:
            log.exception("the %s follower failed on %r", channel, payload)

    def _on_listener_terminated(self, conn: Any) -> None:
        if conn is self._listener:
            self._listener_lost.set()
            if self._ready.is_set():
                self._mark_stale("its LISTEN connection was lost")

    async def _close_listener(self) -> None:
        conn, self._listener = self._listener, None
        if conn is None or conn.is_closed():
            return
        try:
            async with asyncio.timeout(2.0):
                await conn.close()
        except Exception:
            conn.terminate()

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        note = changes.parse(payload)
        if note is None:
            log.warning("ignoring malformed %s payload %r", changes.CHANNEL, payload)
            return
        self.notify(*note)

    def notify(self, store_id: str, revision: int) -> None:
        """Act on "``store_id`` reached ``revision``": schedule a catch-up or a load as needed."""
        if self._closed:
            return
        early = self._early
        if early is not None:  # the snapshot is not installed yet; replayed right after
            early[store_id] = max(revision, early.get(store_id, -1))
            return
        store = self._stores.get(store_id)
        if store is not None:
            if revision > store.revision:
                self._hear(store_id, revision)
                self._request_catch_up(store_id)
            return
        self._missing.pop(store_id, None)  # it exists now, whatever we remembered
        if self.on_demand:
            # Not held here: nothing to do, unless a load is under way, whose snapshot may
            # predate this revision (caught up once it is in: _load_done).
            if store_id in self._loads and revision > self._load_hint.get(store_id, -1):
                self._load_hint[store_id] = revision
            return
        self._request_load(store_id, revision)

    # -- snapshot, loads, polls --------------------------------------------------------------

    async def _load_snapshot(self) -> None:
        started = time.perf_counter()
        async with self._pool.acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            rows = await conn.fetch(_STORES_SQL)
            graphs = {r["id"]: StoreGraph() for r in rows}
            sink = _CopySink(graphs)
            with gc_paused():
                await conn.copy_from_query(_ALL_TUPLES_SQL, output=sink,
                                           timeout=self._load_timeout)
                if self._freeze_gc:  # before the collector resumes: its first (youngest
                    gc.freeze()  # generation) pass would walk every container just loaded
            sink.finish()
        loaded = [LoadedStore(r["id"], r["project_id"], graphs[r["id"]], r["revision"])
                  for r in rows]
        self._install(loaded)
        early, self._early = self._early or {}, None
        for store_id, revision in early.items():
            self.notify(store_id, revision)
        log.info("engine snapshot: %d stores, %d tuples in %.2f s",
                 len(loaded), sink.rows, time.perf_counter() - started)

    def _install(self, stores: Iterable[LoadedStore]) -> None:
        for store in stores:
            cur = self._stores.get(store.id)
            if cur is None or cur.revision < store.revision:
                self._stores[store.id] = store
                self._missing.pop(store.id, None)
                self._wake(store)

    def _request_load(self, store_id: str, revision: int = -1) -> asyncio.Task[LoadedStore | None]:
        """Single-flight load of ``store_id``; ``revision`` is what a notification or poll said
        it has reached (-1: nothing heard), used to catch up or retry once the load finishes."""
        if revision > self._load_hint.get(store_id, -1):
            self._load_hint[store_id] = revision
        task = self._loads.get(store_id)
        if task is None:
            task = asyncio.create_task(self._load_one(store_id), name=f"engine-load-{store_id}")
            self._loads[store_id] = task
            task.add_done_callback(functools.partial(self._load_done, store_id))
        return task

    def _load_done(self, store_id: str, task: asyncio.Task[LoadedStore | None]) -> None:
        if self._loads.get(store_id) is task:
            del self._loads[store_id]
        hint = self._load_hint.pop(store_id, -1)
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        if exc is not None:
            store_metrics.loaded("failed")
            log.warning("engine could not load store %s", store_id, exc_info=exc)
            return
        store = task.result()
        store_metrics.loaded("missing" if store is None else "loaded")
        if store is None:
            if hint >= 0:
                # Heard of it while a lookup that began before its creation was running: again.
                self._missing.pop(store_id, None)
                self._request_load(store_id)
        elif hint > store.revision:
            self._request_catch_up(store_id)

    async def _load_one(self, store_id: str) -> LoadedStore | None:
        started = time.perf_counter()
        async with self._pool.acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            row = await conn.fetchrow(_STORE_SQL, store_id)
            if row is None:
                self._missing[store_id] = True
                return None
            graph = StoreGraph()
            sink = _CopySink({store_id: graph})
            with gc_paused():
                await conn.copy_from_query(_STORE_TUPLES_SQL, store_id, output=sink,
                                           timeout=self._load_timeout)
                if self.on_demand and self._freeze_gc and sink.rows >= ON_DEMAND_FREEZE_ROWS:
                    gc.freeze()  # before the collector resumes (see ON_DEMAND_FREEZE_ROWS)
            sink.finish()
        current = self._stores.get(store_id)
        if current is not None:  # appeared meanwhile (cannot happen while loads are single-flight)
            return current
        store = LoadedStore(store_id, row["project_id"], graph, row["revision"],
                            idle_since=time.monotonic())
        self._install((store,))
        # One line per load: at INFO in on-demand mode, where loads are the replica's life.
        log.log(logging.INFO if self.on_demand else logging.DEBUG,
                "engine loaded store %s: %d tuples at revision %d in %.3f s",
                store_id, sink.rows, store.revision, time.perf_counter() - started)
        return store

    async def _poll_once(self) -> None:
        known_before = set(self._stores)
        async with asyncio.timeout(self._contact_timeout):
            if self.on_demand:  # only what is in memory (a store loading has its own snapshot)
                rows = await self._pool.fetch(_SOME_STORES_SQL, list(known_before))
            else:
                rows = await self._pool.fetch(_STORES_SQL)
        pending: list[asyncio.Future[Any]] = []
        seen: set[str] = set()
        for row in rows:
            store_id = row["id"]
            seen.add(store_id)
            store = self._stores.get(store_id)
            if store is None:
                if self.on_demand:
                    continue  # dropped while the poll ran
                self._missing.pop(store_id, None)
                pending.append(self._request_load(store_id, row["revision"]))
            elif row["revision"] > store.revision:
                self._hear(store_id, row["revision"])
                pending.append(self._request_catch_up(store_id))
        for store_id in known_before - seen:
            self._forget(store_id)
        if pending:
            results = await asyncio.gather(*(asyncio.shield(p) for p in pending),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise RuntimeError(f"{len(failed)} store loads or catch-ups failed") from failed[0]

    def _forget(self, store_id: str) -> None:
        self._heard.pop(store_id, None)
        store = self._stores.pop(store_id, None)
        if store is not None:
            store_metrics.dropped("deleted")
            log.info("engine dropped deleted store %s", store_id)
            self._wake(store)

    # -- on-demand mode: dropping idle stores -------------------------------------------------

    async def _idle_loop(self) -> None:
        period = min(max(self._idle_seconds / 4, 0.05), IDLE_SWEEP_SECONDS_MAX)
        while True:
            await asyncio.sleep(period)
            self.sweep_idle(time.monotonic())

    def sweep_idle(self, now: float) -> int:
        """One pass of the idle sweep at ``now`` (``time.monotonic()`` seconds): a store used
        since the last pass is noted idle from ``now``; one idle for ``idle_seconds`` is dropped,
        unless a catch-up or a waiter is on it (next pass then). Returns how many were dropped.
        A store is thus never dropped less than ``idle_seconds`` after its last use."""
        dropped = 0
        for store in list(self._stores.values()):
            if store.used:
                store.used = False
                store.idle_since = now
            elif (now - store.idle_since >= self._idle_seconds
                  and store.id not in self._catch_ups and not self._waiters.get(store.id)):
                del self._stores[store.id]
                self._heard.pop(store.id, None)
                store_metrics.dropped("idle")
                log.info("engine dropped store %s: unused for %.0f s (%d tuples)", store.id,
                         now - store.idle_since, len(store.graph))
                dropped += 1
        return dropped

    # -- catching up -------------------------------------------------------------------------

    def _request_catch_up(self, store_id: str) -> asyncio.Task[None]:
        """Coalesced catch-up of ``store_id``: at most one runs; a request arriving while one
        runs makes it run once more. The task raises what the last run raised."""
        task = self._catch_ups.get(store_id)
        if task is not None:
            self._dirty.add(store_id)
            return task
        task = asyncio.create_task(self._catch_up_loop(store_id),
                                   name=f"engine-catch-up-{store_id}")
        self._catch_ups[store_id] = task
        task.add_done_callback(functools.partial(self._catch_up_done, store_id))
        return task

    def _catch_up_done(self, store_id: str, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None and not self._closed:
            log.warning("engine could not catch up store %s; the poll retries", store_id,
                        exc_info=exc)

    async def _catch_up_loop(self, store_id: str) -> None:
        try:
            while True:
                self._dirty.discard(store_id)
                await self._catch_up_once(store_id)
                if store_id not in self._dirty:
                    return
        finally:
            self._catch_ups.pop(store_id, None)
            self._dirty.discard(store_id)

    async def _catch_up_once(self, store_id: str) -> None:
        store = self._stores.get(store_id)
        if store is None:
            return
        rows = await self._pool.fetch(_CATCH_UP_SQL, store_id, store.revision)
        if self._stores.get(store_id) is not store:
            return  # forgotten meanwhile
        if not rows:
            self._forget(store_id)
            return
        target = rows[0]["store_revision"]
        if target <= store.revision:
            return
        add, remove = store.graph.add, store.graph.remove
        # No await from here to the revision update: a check sees all of a revision or none.
        for row in rows:
            op = row["operation"]
            if op == "write":
                add(row["object"], row["relation"], row["subject"])
            elif op == "delete":
                remove(row["object"], row["relation"], row["subject"])
        store.revision = target
        if self._heard.get(store_id, -1) <= target:
            self._heard.pop(store_id, None)
        self._wake(store)

    def _wake(self, store: LoadedStore) -> None:
        waiters = self._waiters.get(store.id)
        if not waiters:
            return
        for revision, fut in waiters:
            if not fut.done() and (revision <= store.revision or self._stores.get(store.id)
                                   is not store):
                fut.set_result(None)
