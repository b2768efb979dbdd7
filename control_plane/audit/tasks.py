"""Monthly partitions of ``audit_events``: made ahead, dropped past retention.

SPEC.md 8: ``SERVICE_AUDIT_FORWARD_MONTHS`` (default 3) partitions ahead,
``SERVICE_AUDIT_RETENTION_MONTHS`` (default 3): partitions whose upper bound is older than
now minus the retention are dropped; run at start and every 24 hours. Rows that landed in the
DEFAULT partition (the guarantee that no insert fails) are moved into a new month's partition
when it is created, and deleted there once past retention.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.runtime import background, every
from common.settings import Settings

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


@contextlib.asynccontextmanager
async def workers(app: web.Application) -> AsyncIterator[None]:
    """The partition manager: a first pass before the app serves (so the current month's
    partition exists before the first audit insert), then one every
    ``SERVICE_AUDIT_PARTITION_INTERVAL_SECONDS``."""
    pool, settings = app[PG_POOL], app[SETTINGS]
    await partition_pass(pool, settings)
    interval = settings.audit_partition_interval_seconds
    async with background(audit_partitions=every(
            interval, functools.partial(partition_pass, pool, settings),
            what="audit partition pass", logger=log, first_after=interval)):
        yield
