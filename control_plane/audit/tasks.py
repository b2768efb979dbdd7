"""The audit log's workers: monthly partitions, and the audit streams.

**Partitions.** Monthly partitions of ``audit_events``: made ahead, dropped past retention.

SPEC.md 8: ``SERVICE_AUDIT_FORWARD_MONTHS`` (default 3) partitions ahead,
``SERVICE_AUDIT_RETENTION_MONTHS`` (default 3): partitions whose upper bound is older than
now minus the retention are dropped; run at start and every 24 hours. Rows that landed in the
DEFAULT partition (the guarantee that no insert fails) are moved into a new month's partition
when it is created, and deleted there once past retention.

**Statistics.** Autovacuum analyzes partitions, never the partitioned table above them, whose
statistics hold the search text's trigram frequencies (migration 0012) that a ``q`` search
chooses its index terms by: :func:`statistics_pass` runs ``ANALYZE audit_events`` (a sample of
30,000 events, seconds at 10M) when the last one is older than :data:`STATISTICS_MAX_AGE`,
looked at :data:`STATISTICS_CHECK_SECONDS` after start and every hour, by one process at a time.

**Streams** (:class:`Streamer`, one per process). Due streams are claimed under a lease
(``FOR UPDATE SKIP LOCKED``: a stream is sent by one process at a time). A claimed stream
sends the batch it holds (a retry: exactly the same events), or reads the next one after its
position (at most ``SERVICE_STREAM_BATCH_SIZE`` events of its project and actions, in ``(tx,
id)`` order and below the oldest running transaction, as the webhook fan-out reads the log:
an event whose transaction commits late is never passed) and holds it before sending, so a
crash mid-send sends it again. Once the destination acknowledged it, the position moves past
it and the next batch goes at once (up to :data:`BATCHES_PER_CLAIM` per claim); a refusal keeps
the batch and retries it after a backoff (1 s doubling to :data:`STREAM_BACKOFF_CAP_SECONDS`,
or the destination's longer ``Retry-After``), with ``status`` ``failing`` and ``last_error``.
Nothing after a failing batch is sent before it. A stream with nothing new is looked at again
after :data:`STREAM_IDLE_SECONDS`, or :data:`STREAM_QUIET_SECONDS` once it delivered nothing
for 30 s. Delivery is at least once (a batch acknowledged but not yet
recorded when the process died is sent again) with stable ``evt_`` ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

import aiohttp
import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import Outage
from common.runtime import background, every
from common.settings import Settings
from control_plane.appkeys import KMS
from control_plane.audit import repository, service
from control_plane.audit.streams import DESTINATIONS
from control_plane.audit.streams.base import Batch, Context, Refused
from control_plane.kms import LocalKms
from control_plane.web import outbound

log = logging.getLogger("authio.audit")

_LOCK_KEY: Final = 0x61756469  # advisory lock shared by every control-plane process
_NAME_RE: Final = re.compile(r"^audit_events_y(\d{4})m(\d{2})$")


def add_months(d: date, months: int) -> date:
    """First day of the month ``months`` after ``d``'s month (negative goes back)."""
    index = d.year * 12 + (d.month - 1) + months
    return date(index // 12, index % 12 + 1, 1)


def partition_name(month: date) -> str:
    """``audit_events_yYYYYmMM`` for the month starting ``month``."""
    return f"audit_events_y{month.year:04d}m{month.month:02d}"


def retention_cutoff(now: datetime, retention_months: int) -> datetime:
    """``now`` minus ``retention_months`` calendar months (day clamped to the month's length)."""
    target = add_months(now.date(), -retention_months)
    nxt = add_months(target, 1)
    day = min(now.day, (nxt - target).days)
    return now.replace(year=target.year, month=target.month, day=day)


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What one pass did: partition names created and dropped, default rows moved or purged."""

    created: tuple[str, ...]
    dropped: tuple[str, ...]
    moved_from_default: int
    purged_from_default: int


async def manage_partitions(
    conn: asyncpg.Connection, *, now: datetime, forward_months: int, retention_months: int
) -> PartitionReport:
    """One pass: create the months from the retention cutoff's month to ``forward_months`` ahead,
    drop those whose upper bound is older than the cutoff. Safe to run concurrently (advisory
    lock) and repeatedly (idempotent)."""
    cutoff = retention_cutoff(now, retention_months)
    first = add_months(cutoff.date(), 0)
    last = add_months(now.date(), forward_months)
    created: list[str] = []
    dropped: list[str] = []
    moved = purged = 0
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        existing = {
            r["relname"] for r in await conn.fetch(
                """SELECT c.relname FROM pg_inherits i
                   JOIN pg_class c ON c.oid = i.inhrelid
                   JOIN pg_class p ON p.oid = i.inhparent
                   WHERE p.relname = 'audit_events'"""
            )
        }
        missing = []
        month = first
        while month <= last:
            if partition_name(month) not in existing:
                missing.append(month)
            month = add_months(month, 1)
        if missing:
            # An insert planned before a new partition is attached could still route to the
            # DEFAULT partition and then fail its new constraint; holding the parent exclusively
            # until commit (partitions are created rarely, in milliseconds) rules that out.
            await conn.execute("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
        for month in missing:
            name = partition_name(month)
            moved += await _create_partition(conn, name, month, add_months(month, 1))
            created.append(name)
        for name in sorted(existing):
            m = _NAME_RE.match(name)
            if m is None:
                continue
            upper = add_months(date(int(m.group(1)), int(m.group(2)), 1), 1)
            if datetime(upper.year, upper.month, 1, tzinfo=UTC) <= cutoff:
                await conn.execute(f'DROP TABLE "{name}"')
                dropped.append(name)
        status = await conn.execute(
            "DELETE FROM audit_events_default WHERE created_at < $1", cutoff
        )
        purged = int(status.split()[-1])
    return PartitionReport(tuple(created), tuple(dropped), moved, purged)


async def _create_partition(conn: asyncpg.Connection, name: str, lo: date, hi: date) -> int:
    lo_ts = datetime(lo.year, lo.month, 1, tzinfo=UTC)
    hi_ts = datetime(hi.year, hi.month, 1, tzinfo=UTC)
    # Attaching a range the DEFAULT partition already holds rows for would fail, so those rows
    # move into the new table first (same transaction).
    await conn.execute(
        f'CREATE TABLE "{name}" (LIKE audit_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'
    )
    status = await conn.execute(
        f"""WITH moved AS (DELETE FROM audit_events_default
                           WHERE created_at >= $1 AND created_at < $2 RETURNING *)
            INSERT INTO "{name}" SELECT * FROM moved""",
        lo_ts, hi_ts,
    )
    await conn.execute(
        f"""ALTER TABLE audit_events ATTACH PARTITION "{name}"
            FOR VALUES FROM ('{lo_ts.isoformat()}') TO ('{hi_ts.isoformat()}')"""
    )
    return int(status.split()[-1])


async def partition_pass(pool: asyncpg.Pool, settings: Settings) -> PartitionReport:
    """One ``manage_partitions`` pass now, with the configured months; logs what changed."""
    async with pool.acquire() as conn:
        report = await manage_partitions(
            conn, now=datetime.now(UTC), forward_months=settings.audit_forward_months,
            retention_months=settings.audit_retention_months,
        )
    if report.created or report.dropped:
        log.info("audit partitions: created %s, dropped %s", report.created, report.dropped)
    return report


STATISTICS_MAX_AGE: Final = timedelta(hours=24)
STATISTICS_CHECK_SECONDS: Final = 3600.0
STATISTICS_FIRST_CHECK_SECONDS: Final = 30.0


async def statistics_pass(pool: asyncpg.Pool) -> bool:
    """``ANALYZE audit_events`` if its statistics are older than :data:`STATISTICS_MAX_AGE`;
    whether it ran."""
    async with pool.acquire() as conn:
        ran = await repository.analyze_if_older(conn, max_age=STATISTICS_MAX_AGE)
    if ran:
        log.info("audit log analyzed (the planner's estimates and the search trigrams)")
    return ran


# --- audit streams -------------------------------------------------------------------------------

STREAM_IDLE_SECONDS: Final = 0.25
STREAM_QUIET_SECONDS: Final = 0.75
"""How often a stream that delivered nothing for 30 s looks for new events."""
STREAM_BACKOFF_CAP_SECONDS: Final = 300.0
STREAM_CLAIM: Final = 16
BATCHES_PER_CLAIM: Final = 50


def stream_backoff(failures: int, retry_after: float | None) -> float:
    """Seconds before a refused batch is sent again, after its ``failures``-th refusal."""
    delay = min(STREAM_BACKOFF_CAP_SECONDS, 2.0 ** min(max(failures - 1, 0), 16))
    return max(delay, min(retry_after or 0.0, 86_400.0))


class Streamer:
    """The streams' worker of one process (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, kms: LocalKms, settings: Settings,
                 http: aiohttp.ClientSession) -> None:
        self._pool, self._kms, self._settings = pool, kms, settings
        self._ctx = Context(http, settings.webhook_allow_private_urls,
                            settings.webhook_timeout_seconds)
        self._lease = timedelta(seconds=3 * settings.webhook_timeout_seconds + 10)
        self._in_flight: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        outage = Outage("claiming audit streams", log)
        try:
            while True:
                try:
                    free = STREAM_CLAIM - len(self._in_flight)
                    rows = (await self._pool.fetch(repository.STREAM_CLAIM, self._lease, free)
                            if free > 0 else [])
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await outage.failed(exc)
                    continue
                outage.over()
                for row in rows:
                    task = asyncio.create_task(self._stream(row), name=f"stream-{row['id']}")
                    self._in_flight.add(task)
                    task.add_done_callback(self._in_flight.discard)
                await asyncio.sleep(STREAM_IDLE_SECONDS / 2)
        finally:
            for task in self._in_flight:
                task.cancel()
            await asyncio.gather(*self._in_flight, return_exceptions=True)
            for destination in DESTINATIONS.values():
                if destination.close is not None:
                    await destination.close()

    async def _stream(self, claim: asyncpg.Record) -> None:
        stream_id, size = claim["id"], self._settings.stream_batch_size
        try:
            destination = DESTINATIONS[claim["destination_type"]]
            config = service.open_destination(self._kms, stream_id, claim["destination_sealed"])
            position = (claim["tx"], claim["event_id"])
            failures = claim["failures"]
            held: _Held | None = None
            if claim["batch"] is not None:  # a batch sent before and not acknowledged
                held = _Held(list(claim["batch"]), claim["batch_last_tx"], await self._pool.fetch(
                    repository.STREAM_BATCH_EVENTS, claim["batch_created_at"], claim["batch"]))
            for _ in range(BATCHES_PER_CLAIM):
                if held is None:
                    rows = await self._pool.fetch(repository.STREAM_NEXT, claim["project_id"],
                                                  *position, claim["actions"], size)
                    if not rows:
                        break
                    held = _Held([r["id"] for r in rows], rows[-1]["tx"], rows)
                    await self._pool.execute(repository.STREAM_HOLD_BATCH, stream_id, held.ids,
                                             [r["created_at_ts"] for r in rows], held.last_tx)
                batch = Batch(stream_id, f"{stream_id}:{held.ids[0]}",
                              [_event(e) for e in held.events])
                try:
                    await destination.send(self._ctx, config, batch)
                except Refused as refusal:
                    await self._refused(claim, refusal, failures + 1)
                    return
                failures = 0
                status = await self._pool.fetchval(repository.STREAM_ACKNOWLEDGED, stream_id)
                if status in (None, "paused"):
                    break
                position, held = (held.last_tx, held.ids[-1]), None
            await self._pool.execute(repository.STREAM_IDLE, stream_id,
                                     timedelta(seconds=STREAM_IDLE_SECONDS),
                                     timedelta(seconds=STREAM_QUIET_SECONDS))
        except asyncio.CancelledError:
            raise
        except Exception:
            # The lease runs out and another pass (here or elsewhere) takes the stream again.
            log.exception("audit stream %s: unexpected error; it is retried when its lease ends",
                          stream_id)

    async def _refused(self, claim: asyncpg.Record, refusal: Refused, failures: int) -> None:
        delay = stream_backoff(failures, refusal.retry_after)
        log.warning("audit stream %s: the %s destination refused a batch (%s); retrying in %.0f s",
                    claim["id"], claim["destination_type"], refusal.reason, delay)
        await self._pool.execute(repository.STREAM_FAILED, claim["id"], refusal.reason,
                                 timedelta(seconds=delay))


@dataclass(frozen=True, slots=True)
class _Held:
    """A batch held by a stream until acknowledged: its event ids, the last one's ``tx``, and
    its events."""

    ids: list[str]
    last_tx: str
    events: list[asyncpg.Record]


def _event(row: asyncpg.Record) -> dict[str, Any]:
    """An event as ``GET /v1/audit/events`` lists it (the columns of ``JSON_COLUMNS``)."""
    return {k: row[k] for k in _EVENT_FIELDS}


_EVENT_FIELDS: Final = ("id", "created_at", "action", "actor_type", "actor_id", "user_id",
                        "project_id", "target_type", "target_id", "ip", "user_agent",
                        "description", "metadata")


@contextlib.asynccontextmanager
async def workers(app: web.Application) -> AsyncIterator[None]:
    """The partition manager: a first pass before the app serves (so the current month's
    partition exists before the first audit insert), then one every
    ``SERVICE_AUDIT_PARTITION_INTERVAL_SECONDS``; the statistics pass; and the audit streams'
    worker."""
    pool, settings = app[PG_POOL], app[SETTINGS]
    await partition_pass(pool, settings)
    interval = settings.audit_partition_interval_seconds
    async with outbound.client(timeout_seconds=settings.webhook_timeout_seconds,
                               allow_private=settings.webhook_allow_private_urls) as http:
        streamer = Streamer(pool, app[KMS], settings, http)
        async with background(
                audit_partitions=every(
                    interval, functools.partial(partition_pass, pool, settings),
                    what="audit partition pass", logger=log, first_after=interval),
                audit_statistics=every(
                    STATISTICS_CHECK_SECONDS, functools.partial(statistics_pass, pool),
                    what="audit statistics pass", logger=log,
                    first_after=STATISTICS_FIRST_CHECK_SECONDS),
                audit_streams=streamer.run()):
            yield
