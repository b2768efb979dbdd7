"""Monthly partitions of ``audit_events`` (SPEC.md 2 "Audit event", 8 "Audit retention").

``control_plane.audit.tasks.manage_partitions`` runs against real PostgreSQL. Passes with a
``now`` other than today drop every partition older than their retention cutoff, which would
include the months the rest of the suite writes events into; so every test that moves ``now`` runs
in a private database of its own (copied from a migrated template, dropped afterwards). Only
passes with the real clock touch the shared test database (through the ``db`` fixture).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from common.ids import new_id
from control_plane.audit.tasks import add_months, manage_partitions, retention_cutoff
from control_plane.migrate import upgrade


def _with_db(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(_with_db(url, "postgres"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest_asyncio.fixture(scope="module")
async def template_db(database_url: str) -> AsyncIterator[str]:
    """A migrated database used only as the template of each test's private database."""
    name = f"authio_part_tpl_{secrets.token_hex(4)}"
    await _admin(database_url, f'CREATE DATABASE "{name}"')
    try:
        await asyncio.to_thread(upgrade, _with_db(database_url, name))
        yield name
    finally:
        await _admin(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest_asyncio.fixture
async def private_url(database_url: str, template_db: str) -> AsyncIterator[str]:
    """A fresh private database holding the schema and no month partitions."""
    name = f"authio_part_{secrets.token_hex(4)}"
    await _admin(database_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield _with_db(database_url, name)
    finally:
        await _admin(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest_asyncio.fixture
async def pdb(private_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(private_url)
    try:
        yield conn
    finally:
        await conn.close()


def ts(year: int, month: int, day: int = 1, hour: int = 0, minute: int = 0, second: int = 0,
       microsecond: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


def pname(year: int, month: int) -> str:
    return f"audit_events_y{year:04d}m{month:02d}"


def months(first: tuple[int, int], last: tuple[int, int]) -> set[str]:
    """Partition names from ``first`` to ``last`` (year, month), inclusive."""
    out, (y, m) = set(), first
    while (y, m) <= last:
        out.add(pname(y, m))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


async def partitions(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, str]:
    """Every partition of audit_events -> its bound expression (pg_inherits, pg_class)."""
    rows = await conn.fetch(
        """SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound
           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           JOIN pg_class p ON p.oid = i.inhparent
           WHERE p.relname = 'audit_events'"""
    )
    return {r["relname"]: r["bound"] for r in rows}


async def month_partitions(conn: asyncpg.Connection | asyncpg.Pool) -> set[str]:
    return {n for n in await partitions(conn) if n != "audit_events_default"}


async def insert_event(conn: asyncpg.Connection | asyncpg.Pool, created_at: datetime,
                       action: str = "test.partition.probe") -> str:
    event_id = new_id("evt")
    await conn.execute(
        """INSERT INTO audit_events (id, created_at, action, actor_type, actor_id, project_id,
                                     description, metadata)
           VALUES ($1, $2, $3, 'system', 'partition-test', 'proj_partition_test', $4, '{}'::jsonb)""",
        event_id, created_at, action, f"probe at {created_at.isoformat()}",
    )
    return event_id


async def home_of(conn: asyncpg.Connection | asyncpg.Pool, event_id: str) -> str | None:
    """The partition table holding the event (None when the event is gone)."""
    return await conn.fetchval(
        "SELECT tableoid::regclass::text FROM audit_events WHERE id = $1", event_id
    )


async def run(conn: asyncpg.Connection, now: datetime, forward: int, retention: int) -> object:
    return await manage_partitions(conn, now=now, forward_months=forward,
                                   retention_months=retention)


# --- pure date arithmetic --------------------------------------------------------------------


def test_add_months_crosses_year_boundaries() -> None:
    assert add_months(ts(2031, 12, 10).date(), 1) == ts(2032, 1).date()
    assert add_months(ts(2032, 1, 31).date(), -1) == ts(2031, 12).date()
    assert add_months(ts(2031, 5, 15).date(), -17) == ts(2029, 12).date()
    assert add_months(ts(2031, 5, 15).date(), 0) == ts(2031, 5).date()


def test_retention_cutoff_is_calendar_months_back_with_day_clamped() -> None:
    assert retention_cutoff(ts(2031, 5, 15, 12), 3) == ts(2031, 2, 15, 12)
    assert retention_cutoff(ts(2032, 1, 15), 1) == ts(2031, 12, 15)
    assert retention_cutoff(ts(2032, 3, 31, 8), 1) == ts(2032, 2, 29, 8)  # leap year
    assert retention_cutoff(ts(2031, 3, 31), 1) == ts(2031, 2, 28)


# --- creation ahead --------------------------------------------------------------------------


async def test_creates_monthly_partitions_ahead_with_exact_bounds(pdb: asyncpg.Connection) -> None:
    assert await month_partitions(pdb) == set()
    report = await run(pdb, ts(2031, 5, 15, 10), forward=3, retention=3)

    have = await month_partitions(pdb)
    # The current month and the three months after it, and nothing past the forward window.
    assert months((2031, 5), (2031, 8)) <= have
    assert not any(n > pname(2031, 8) for n in have), have
    # Nothing older than the retention cutoff's month (2031-02-15) is created.
    assert not any(n < pname(2031, 2) for n in have), have
    assert set(report.created) == have  # type: ignore[attr-defined]

    bounds = await partitions(pdb)
    assert "audit_events_default" in bounds and bounds["audit_events_default"] == "DEFAULT"
    june = bounds[pname(2031, 6)]
    assert "2031-06-01 00:00:00+00" in june and "2031-07-01 00:00:00+00" in june, june

    # A made partition keeps the parent's key and indexes.
    indexes = await pdb.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = $1",
                              pname(2031, 6))
    defs = " ".join(r["indexdef"] for r in indexes)
    assert "UNIQUE" in defs and "(created_at, id)" in defs, defs
    assert "(project_id, created_at DESC, id DESC)" in defs, defs

    # Events land in their month, edges included.
    cases = {
        ts(2031, 6, 10, 12): pname(2031, 6),
        ts(2031, 6, 30, 23, 59, 59, 999999): pname(2031, 6),
        ts(2031, 7, 1): pname(2031, 7),
        ts(2031, 8, 31, 23, 59, 59): pname(2031, 8),
        ts(2031, 9, 1): "audit_events_default",
    }
    for created_at, expected in cases.items():
        event_id = await insert_event(pdb, created_at)
        assert await home_of(pdb, event_id) == expected, created_at


async def test_default_partition_rows_move_into_their_month_when_it_is_created(
    pdb: asyncpg.Connection,
) -> None:
    await run(pdb, ts(2031, 5, 15), forward=1, retention=3)
    future = await insert_event(pdb, ts(2031, 9, 10, 8, 30))
    later = await insert_event(pdb, ts(2032, 3, 2))
    assert await home_of(pdb, future) == "audit_events_default"
    before = await pdb.fetchrow("SELECT * FROM audit_events WHERE id = $1", future)

    report = await run(pdb, ts(2031, 8, 20), forward=1, retention=3)

    assert pname(2031, 9) in report.created  # type: ignore[attr-defined]
    assert report.moved_from_default == 1  # type: ignore[attr-defined]
    assert await home_of(pdb, future) == pname(2031, 9)
    assert await pdb.fetchval("SELECT count(*) FROM audit_events_default WHERE id = $1", future) == 0
    after = await pdb.fetchrow("SELECT * FROM audit_events WHERE id = $1", future)
    assert dict(after) == dict(before)  # moved intact, exactly once
    assert await pdb.fetchval("SELECT count(*) FROM audit_events WHERE id = $1", future) == 1
    # A month still without a partition keeps its rows in DEFAULT.
    assert await home_of(pdb, later) == "audit_events_default"


async def test_retention_drops_only_partitions_whose_upper_bound_is_past_the_cutoff(
    pdb: asyncpg.Connection,
) -> None:
    now = ts(2031, 5, 15, 12)
    await run(pdb, now, forward=1, retention=12)
    assert await month_partitions(pdb) == months((2030, 5), (2031, 6))
    old = await insert_event(pdb, ts(2030, 6, 20))
    january = await insert_event(pdb, ts(2031, 1, 31, 23, 59))
    cutoff_month = await insert_event(pdb, ts(2031, 2, 20))
    recent = await insert_event(pdb, ts(2031, 4, 1))
    current = await insert_event(pdb, ts(2031, 5, 14))
    ahead = await insert_event(pdb, ts(2031, 6, 3))
    beyond = await insert_event(pdb, ts(2031, 12, 24))  # DEFAULT, in the future
    assert await home_of(pdb, cutoff_month) == pname(2031, 2)

    # Cutoff 2031-02-15 12:00: months up to January 2031 end before it; February does not.
    report = await run(pdb, now, forward=1, retention=3)

    assert set(report.dropped) == months((2030, 5), (2031, 1))  # type: ignore[attr-defined]
    assert await month_partitions(pdb) == months((2031, 2), (2031, 6))
    assert await home_of(pdb, old) is None
    assert await home_of(pdb, january) is None
    for event_id, home in ((cutoff_month, pname(2031, 2)), (recent, pname(2031, 4)),
                           (current, pname(2031, 5)), (ahead, pname(2031, 6)),
                           (beyond, "audit_events_default")):
        assert await home_of(pdb, event_id) == home


async def test_retention_purges_stale_default_rows_but_keeps_newer_ones(
    pdb: asyncpg.Connection,
) -> None:
    # Rows that sit in DEFAULT (no month partition was ever made for them) obey retention too.
    stale = await insert_event(pdb, ts(2029, 1, 5))
    fresh = await insert_event(pdb, ts(2033, 1, 5))
    assert await home_of(pdb, stale) == "audit_events_default"
    report = await run(pdb, ts(2031, 5, 15), forward=1, retention=3)
    assert report.purged_from_default == 1  # type: ignore[attr-defined]
    assert await home_of(pdb, stale) is None
    assert await home_of(pdb, fresh) == "audit_events_default"


async def test_year_boundary_december_to_january(pdb: asyncpg.Connection) -> None:
    await run(pdb, ts(2031, 12, 10), forward=2, retention=1)
    assert months((2031, 12), (2032, 2)) <= await month_partitions(pdb)
    bounds = await partitions(pdb)
    jan = bounds[pname(2032, 1)]
    assert "2032-01-01 00:00:00+00" in jan and "2032-02-01 00:00:00+00" in jan, jan
    dec = bounds[pname(2031, 12)]
    assert "2031-12-01 00:00:00+00" in dec and "2032-01-01 00:00:00+00" in dec, dec

    last_of_year = await insert_event(pdb, ts(2031, 12, 31, 23, 59, 59, 999999))
    first_of_year = await insert_event(pdb, ts(2032, 1, 1))
    assert await home_of(pdb, last_of_year) == pname(2031, 12)
    assert await home_of(pdb, first_of_year) == pname(2032, 1)

    # A month later, with one month of retention, November goes and December stays.
    nov = await insert_event(pdb, ts(2031, 11, 20))
    assert await home_of(pdb, nov) == pname(2031, 11)
    report = await run(pdb, ts(2032, 1, 15), forward=2, retention=1)
    assert pname(2031, 11) in report.dropped  # type: ignore[attr-defined]
    assert pname(2031, 12) not in report.dropped  # type: ignore[attr-defined]
    assert pname(2032, 3) in report.created  # type: ignore[attr-defined]
    assert await home_of(pdb, nov) is None
    assert await home_of(pdb, last_of_year) == pname(2031, 12)
    assert await home_of(pdb, first_of_year) == pname(2032, 1)


async def test_rerun_is_idempotent(pdb: asyncpg.Connection) -> None:
    now = ts(2032, 7, 4)
    await run(pdb, now, forward=3, retention=3)
    kept = await insert_event(pdb, ts(2032, 8, 1))
    first = await partitions(pdb)
    count = await pdb.fetchval("SELECT count(*) FROM audit_events")

    for _ in range(2):
        report = await run(pdb, now, forward=3, retention=3)
        assert report.created == () and report.dropped == ()  # type: ignore[attr-defined]
        assert report.moved_from_default == 0  # type: ignore[attr-defined]
        assert report.purged_from_default == 0  # type: ignore[attr-defined]
    assert await partitions(pdb) == first
    assert await pdb.fetchval("SELECT count(*) FROM audit_events") == count
    assert await home_of(pdb, kept) == pname(2032, 8)


async def test_concurrent_passes_do_not_collide(pdb: asyncpg.Connection, private_url: str) -> None:
    """Several control-plane processes may run the manager at once (advisory lock)."""
    others = [await asyncpg.connect(private_url) for _ in range(2)]
    try:
        reports = await asyncio.gather(
            *(run(c, ts(2031, 12, 10), forward=6, retention=2) for c in [pdb, *others])
        )
    finally:
        for c in others:
            await c.close()
    created = [n for r in reports for n in r.created]  # type: ignore[attr-defined]
    assert sorted(created) == sorted(set(created)), "a partition was created twice"
    assert set(created) == months((2031, 10), (2032, 6)) == await month_partitions(pdb)


async def test_insert_never_fails_for_want_of_a_partition(pdb: asyncpg.Connection) -> None:
    await run(pdb, ts(2031, 5, 15), forward=3, retention=3)
    far = await insert_event(pdb, ts(2041, 5, 15))
    past = await insert_event(pdb, ts(2001, 1, 1))
    assert await home_of(pdb, far) == "audit_events_default"
    assert await home_of(pdb, past) == "audit_events_default"


# --- against the shared test database, with the real clock only ------------------------------


async def test_shared_database_has_current_and_forward_months(db: asyncpg.Pool) -> None:
    now = datetime.now(UTC)
    async with db.acquire() as conn:
        # Same parameters as the service's defaults (3 ahead, 3 kept): nothing of this run's
        # months can be dropped by it.
        await manage_partitions(conn, now=now, forward_months=3, retention_months=3)
    have = await month_partitions(db)
    this_month = now.date().replace(day=1)
    for i in range(4):
        m = add_months(this_month, i)
        assert pname(m.year, m.month) in have, (m, have)
    event_id = await insert_event(db, now)
    try:
        assert await home_of(db, event_id) == pname(now.year, now.month)
    finally:
        await db.execute("DELETE FROM audit_events WHERE id = $1", event_id)


async def test_shared_database_accepts_an_event_ten_years_ahead(db: asyncpg.Pool) -> None:
    when = datetime.now(UTC) + timedelta(days=3653)
    event_id = await insert_event(db, when)
    try:
        assert await home_of(db, event_id) is not None
        stored = await db.fetchval("SELECT created_at FROM audit_events WHERE id = $1", event_id)
        assert stored == when
    finally:
        await db.execute("DELETE FROM audit_events WHERE id = $1", event_id)


@pytest.mark.parametrize("forward", [1, 3])
async def test_forward_window_follows_the_setting(pdb: asyncpg.Connection, forward: int) -> None:
    await run(pdb, ts(2033, 2, 1), forward=forward, retention=1)
    have = await month_partitions(pdb)
    assert months((2033, 1), add_ym(2033, 2, forward)) == have


def add_ym(year: int, month: int, n: int) -> tuple[int, int]:
    d = add_months(ts(year, month).date(), n)
    return d.year, d.month


async def _wait_blocked(conn: asyncpg.Connection, pid: int, within: float = 10.0) -> None:
    """Until backend ``pid`` waits on a lock."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while await conn.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
    ) != "Lock":
        assert loop.time() < deadline, f"backend {pid} never blocked on a lock"
        await asyncio.sleep(0.02)


async def test_insert_racing_a_partition_pass_does_not_fail(private_url: str) -> None:
    """An event written while the manager attaches its month's partition must be stored.

    Deterministic interleaving: a third session holds the name of the pass's last month, so the
    pass stops after attaching 2031-05 (uncommitted); an insert for 2031-05 then starts, and the
    pass is let go. PostgreSQL routes the insert by the partitions committed when it started
    (DEFAULT), so unless the pass keeps inserts out while it attaches (e.g. ``LOCK TABLE
    audit_events IN SHARE ROW EXCLUSIVE MODE`` first), the insert fails with "new row for
    relation audit_events_default violates partition constraint": exactly what a service's first
    requests hit while its startup pass makes the current month.
    """
    manager, writer, blocker, observer = [await asyncpg.connect(private_url) for _ in range(4)]
    try:
        hold = blocker.transaction()
        await hold.start()
        await blocker.execute(f'CREATE TABLE "{pname(2031, 6)}" (id int)')
        # Cutoff 2031-04-15: the pass makes 2031-04, 2031-05, then stops at 2031-06.
        pass_task = asyncio.create_task(run(manager, ts(2031, 5, 15), forward=1, retention=1))
        await _wait_blocked(observer, manager.get_server_pid())

        insert_task = asyncio.create_task(insert_event(writer, ts(2031, 5, 20)))
        await _wait_blocked(observer, writer.get_server_pid())
        await hold.rollback()

        report = await asyncio.wait_for(pass_task, 10)
        assert pname(2031, 5) in report.created  # type: ignore[attr-defined]
        event_id = await asyncio.wait_for(insert_task, 10)
        assert await home_of(observer, event_id) == pname(2031, 5)
    finally:
        for c in (manager, writer, blocker, observer):
            await c.close()
