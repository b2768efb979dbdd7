"""The audit log's SQL: the insert, the listing and export queries, and their column lists.

Events are rows of the partitioned table ``audit_events`` (monthly partitions,
``control_plane.audit.tasks``). Listings are newest first on ``(created_at, id)``; each filter
has its index (migration 0002): ``(project_id, action, created_at, id)`` for types,
``(project_id, user_id, ...)``, ``(project_id, actor_id, ...)``, ``(project_id, created_at,
id)``, and a trigram index over :data:`SEARCH_EXPR` for ``q``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import asyncpg

from common.db import Params

COLUMNS: Final = ("id", "action", "actor_type", "actor_id", "user_id", "project_id",
                  "target_type", "target_id", "ip", "user_agent", "description", "api_key_id",
                  "metadata")
"""The columns an insert writes (``created_at`` is the database's ``now()``)."""


def _insert_statement() -> tuple[str, Params]:
    p = Params()
    return (f"INSERT INTO audit_events ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join(p[c] for c in COLUMNS)})"), p


_INSERT, _INSERT_PARAMS = _insert_statement()

CSV_COLUMNS: Final = ("id", "created_at", "action", "actor_type", "actor_id", "user_id",
                      "project_id", "target_type", "target_id", "ip", "user_agent", "description")
# The expression of the trigram index ``audit_events_search`` (migration 0002), to the character:
# the planner only uses an expression index for the identical expression.
SEARCH_EXPR: Final = (
    "lower(action || E'\\x1f' || coalesce(actor_id, '') || E'\\x1f' || coalesce(target_id, '')"
    " || E'\\x1f' || coalesce(metadata ->> 'description', ''))"
)

_TRIGRAMS_RE: Final = re.compile(r"[^\W_]{3}")  # a run of 3 letters or digits: a usable trigram
_FORMULA_LEADS: Final = "=+-@\t\r"
_CREATED: Final = """to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_DESCRIPTION: Final = "coalesce(e.description, e.metadata ->> 'description')"
_EVENT_COLUMNS: Final = (
    f"e.id, {_CREATED} AS created_at, e.action, e.actor_type, e.actor_id, e.user_id, e.project_id,"
    f" e.target_type, e.target_id, e.ip, e.user_agent, {_DESCRIPTION} AS description"
)
JSON_COLUMNS: Final = _EVENT_COLUMNS + ", e.metadata"
"""An event as ``schemas.AuditEvent``, with ``created_at`` already RFC 3339 text."""
JSONL_COLUMNS: Final = _EVENT_COLUMNS + ", e.metadata::text AS metadata"


def _neutralized(expr: str) -> str:
    """SQL for ``expr`` with the OWASP CSV-injection rule applied: a leading ``'`` when it starts
    with ``=`` ``+`` ``-`` ``@`` TAB or CR (``ascii`` gives the code of the first character)."""
    codes = ", ".join(str(ord(c)) for c in _FORMULA_LEADS)
    return f"CASE WHEN ascii({expr}) IN ({codes}) THEN '''' || {expr} ELSE {expr} END"


CSV_SELECT: Final = ", ".join(
    f"{_CREATED}" if name == "created_at"
    else _neutralized(_DESCRIPTION if name == "description" else f"e.{name}")
    for name in CSV_COLUMNS
)
"""The CSV columns, every one text, formula leads neutralized."""


# --- writing -----------------------------------------------------------------------------------


async def insert(conn: asyncpg.Connection, values: dict[str, object]) -> None:
    """Insert one event; ``values`` holds every name of ``COLUMNS``."""
    await conn.execute(_INSERT, *_INSERT_PARAMS.bind(values))


def insert_from(source: str, p: Params, *, name: str = "event", more_metadata: str = "") -> str:
    """SQL inserting one event per row of ``source`` (a CTE of the same statement), its values
    the named parameters ``<name>_<column>`` of ``p`` (bind them with ``service.event_params``);
    ``more_metadata`` is a jsonb expression over ``source`` merged into the metadata (values
    known only in the statement, such as the organization it picked). The event commits with the
    statement's change: one round trip instead of two on hot paths."""
    values = [p[f"{name}_{c}"] for c in COLUMNS]
    values[-1] = f"{values[-1]}::jsonb" + (f" || {more_metadata}" if more_metadata else "")
    return f"INSERT INTO audit_events ({', '.join(COLUMNS)}) SELECT {', '.join(values)} FROM {source}"


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filters:
    """The combinable filters of SPEC.md 4; ``since`` is ``from`` (inclusive), ``until`` is
    ``to`` (exclusive)."""

    types: tuple[str, ...] = ()
    user: str | None = None
    actor: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    q: str | None = None
    q_trigrams: tuple[str, ...] = ()
    """Rare trigrams of ``q`` (``service.rare_trigrams``): when given, the trigram index is
    asked for these alone and ``q`` itself is checked on the rows it finds."""


@dataclass(frozen=True, slots=True)
class Key:
    """A position in the listing order: the ``(created_at, id)`` of an event."""

    created_at: datetime
    id: str


def format_time(value: datetime) -> str:
    """RFC 3339 UTC with microseconds and ``Z``, as ``_CREATED`` renders it in SQL."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def like_literal(text: str) -> str:
    """``text`` with LIKE's escape character and wildcards escaped (default escape ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def search_condition(p: Params, q: str, q_trigrams: tuple[str, ...] = ()) -> str:
    """SQL (over alias ``e``) true for the events whose search text (:data:`SEARCH_EXPR`) holds
    ``q`` case-insensitively, through the trigram index: asked for ``q_trigrams`` alone when
    given (:class:`Filters`), else for every trigram of ``q``."""
    if q_trigrams:
        # Each trigram is a substring of q, so these conditions drop no match; the index
        # reads their short posting lists only, and strpos checks q on what they find.
        conds = [f"{SEARCH_EXPR} LIKE {p('%' + t + '%')}" for t in q_trigrams]
        return " AND ".join([*conds, f"strpos({SEARCH_EXPR}, lower({p(q)})) > 0"])
    if _TRIGRAMS_RE.search(q):
        # Written as the index's expression LIKE a pattern, so the trigram index applies to
        # every trigram of q: right when all of them are common (the planner may then walk
        # the time index instead and stop at the page's end).
        return f"{SEARCH_EXPR} LIKE lower({p('%' + like_literal(q) + '%')})"
    # Nothing a trigram index could use: scan newest first and stop at the LIMIT.
    return f"strpos({SEARCH_EXPR}, lower({p(q)})) > 0"


def _conditions(p: Params, project_id: str, f: Filters, after: Key | None,
                bound: Key | None) -> list[str]:
    conds = [f"e.project_id = {p(project_id)}"]
    if f.user is not None:
        conds.append(f"e.user_id = {p(f.user)}")
    if f.actor is not None:
        conds.append(f"e.actor_id = {p(f.actor)}")
    if f.since is not None:
        conds.append(f"e.created_at >= {p(f.since)}")
    if f.until is not None:
        conds.append(f"e.created_at < {p(f.until)}")
    if f.q is not None:
        conds.append(search_condition(p, f.q, f.q_trigrams))
    if after is not None:
        conds.append(f"(e.created_at, e.id) < ({p(after.created_at)}, {p(after.id)})")
    if bound is not None:
        conds.append(f"(e.created_at, e.id) >= ({p(bound.created_at)}, {p(bound.id)})")
    return conds


def build_query(
    columns: str, project_id: str, f: Filters, *, after: Key | None = None,
    bound: Key | None = None, limit: int | None = None, offset: int = 0,
) -> tuple[str, list[object]]:
    """The SQL and arguments selecting ``columns`` (over alias ``e``) of the project's events
    that pass ``f``, below ``after`` and at or above ``bound``, newest first.

    Several types become one ordered branch per action under a UNION ALL, which PostgreSQL merges
    (Merge Append) from the ``(project_id, action, created_at, id)`` index without sorting.
    """
    p = Params()
    common = _conditions(p, project_id, f, after, bound)
    order = "ORDER BY e.created_at DESC, e.id DESC"
    tail = order
    if offset:
        tail += f" OFFSET {p(offset)}"
    if limit is not None:
        tail += f" LIMIT {p(limit)}"
    if len(f.types) <= 1:
        conds = common + [f"e.action = {p(t)}" for t in f.types]
        return f"SELECT {columns} FROM audit_events e WHERE {' AND '.join(conds)} {tail}", p.values
    branch_limit = f" LIMIT {p(offset + limit)}" if limit is not None else ""
    branches = " UNION ALL ".join(
        f"(SELECT * FROM audit_events e WHERE {' AND '.join([*common, f'e.action = {p(t)}'])}"
        f" {order}{branch_limit})"
        for t in f.types
    )
    return f"SELECT {columns} FROM ({branches}) e {tail}", p.values


SEARCH_TRIGRAM_FREQUENCIES: Final = """
SELECT most_common_elems::text::text[] AS trigrams, most_common_elem_freqs AS frequencies
FROM pg_stats_ext_exprs
WHERE statistics_name = 'audit_events_search_trigrams' AND schemaname = current_schema()
  AND tablename = 'audit_events' AND most_common_elems IS NOT NULL"""
"""The most common trigrams of the search text and the fraction of events holding each (the
expression statistics of migration 0012, as the last ANALYZE of ``audit_events`` sampled them;
PostgreSQL appends three entries to the frequencies: the least, the greatest, and the null
frequency). No row before that ANALYZE, or for a role that does not own the table."""


async def search_trigram_frequencies(conn: asyncpg.Connection) -> dict[str, float]:
    """The listed trigrams and their frequencies (0-1); empty when there are no statistics."""
    row = await conn.fetchrow(SEARCH_TRIGRAM_FREQUENCIES)
    if row is None:
        return {}
    return dict(zip(row["trigrams"], row["frequencies"], strict=False))


ANALYZE_LOCK_KEY: Final = 0x61756473  # one process at a time analyzes the log


async def analyze_if_older(conn: asyncpg.Connection, *, max_age: timedelta) -> bool:
    """``ANALYZE audit_events`` when its last ANALYZE is older than ``max_age`` or never ran,
    and no other process is at it; whether it ran. The partitioned table's own statistics
    (the planner's estimates for the parent, and the search trigrams of migration 0012) are
    only ever made this way: autovacuum analyzes partitions, never the table above them."""
    async with conn.transaction():
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", ANALYZE_LOCK_KEY):
            return False
        fresh = await conn.fetchval(
            "SELECT last_analyze > now() - $1::interval FROM pg_stat_user_tables"
            " WHERE relid = 'audit_events'::regclass", max_age)
        if fresh:
            return False
        await conn.execute("ANALYZE audit_events")
    return True


async def custom_plans(conn: asyncpg.Connection) -> None:
    """Plan every statement of the transaction afresh: prepared statements may switch to a
    generic plan after five runs, and the right index for a filter depends on its values (how
    rare a ``q`` or a type is)."""
    await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")


async def export_settings(conn: asyncpg.Connection) -> None:
    """Planner settings for a streamed export, for its transaction only. It must walk the time
    index: with the default random_page_cost (4) the planner prefers reading the newest
    partition whole and sorting it, which at 10M events spills 40 MB to disk and sends nothing
    for 0.5-0.75 s, and its cost estimate switches JIT on (347 of 429 ms). 1.1 is the usual value
    for SSDs or cached data."""
    await custom_plans(conn)
    await conn.execute("SET LOCAL random_page_cost = 1.1")
    await conn.execute("SET LOCAL jit = off")


EVENT_TYPES: Final = """
WITH RECURSIVE actions(action) AS (
    SELECT min(action) FROM audit_events WHERE project_id = $1
    UNION ALL
    SELECT (SELECT min(e.action) FROM audit_events e
            WHERE e.project_id = $1 AND e.action > a.action)
    FROM actions a WHERE a.action IS NOT NULL
)
SELECT a.action FROM actions a
WHERE a.action IS NOT NULL AND (
    -- A scalar subquery, not EXISTS: PostgreSQL would turn EXISTS into a semi-join
    -- over every recent event; this stays one index probe per action.
    SELECT true FROM audit_events e
    WHERE e.project_id = $1 AND e.action = a.action AND e.created_at >= $2 LIMIT 1)"""
"""The distinct actions of project ``$1`` with an event since ``$2``: a loose index scan, each
step finding the next action from the ``(project_id, action, ...)`` index in one probe, then one
more probe asking whether it has a recent event; the cost follows the number of distinct
actions, not of events."""


@dataclass(frozen=True, slots=True)
class LegacySql:
    """The legacy listing's condition over alias ``e``, and the parameters it placed: each
    statement built on it places its own from ``params.copy()``."""

    where: str
    params: Params
    order: str = "ORDER BY e.created_at DESC, e.id DESC"


def legacy_query(project_id: str, *, before: datetime | None,
                 action_prefix: str | None) -> LegacySql:
    """The legacy listing's condition for ``project_id``, ``before`` and a literal
    ``action_prefix``."""
    p = Params()
    conds = [f"e.project_id = {p(project_id)}"]
    if before is not None:
        conds.append(f"e.created_at < {p(before)}")
    if action_prefix:
        conds.append(f"e.action LIKE {p(like_literal(action_prefix) + '%')}")
    return LegacySql(" AND ".join(conds), p)


# --- reading the log in commit-safe order ---------------------------------------------------------

LOG_HORIZON: Final = """(SELECT coalesce(
    (SELECT min(x) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
     WHERE NOT EXISTS (
         SELECT 1 FROM pg_stat_activity a
         WHERE a.backend_xid IS NOT NULL AND a.datname IS DISTINCT FROM current_database()
           AND a.backend_xid::text::bigint = x::text::bigint % 4294967296)),
    pg_snapshot_xmax(pg_current_snapshot())))"""
"""The log's horizon for a reader in ``(tx, id)`` order (``audit_events.tx``: the writing
transaction's id): the oldest transaction of the statement's snapshot still running that may
belong to this database, else the snapshot's ``xmax``. Every event below it is final (its
transaction ended), so a reader that stops there never passes an event whose transaction
commits later. Transactions seen running in another database are left out: they cannot write
this database's log, and a long one there must not hold this one's readers back. One that ended
since the snapshot, or whose database cannot be seen (``pg_stat_activity`` shows another
role's ``backend_xid`` only to ``pg_read_all_stats``), counts: the reader then waits, never
skips."""


# --- audit streams ------------------------------------------------------------------------------

LAG_CAP: Final = 1_000_000
"""``lag`` counts at most this many events (a stream paused for long)."""
STREAM_COLUMNS: Final = (
    "s.id, s.destination_type, s.destination_shown, s.actions, s.description, s.status, "
    "s.last_error, s.last_delivered_at, s.created_at, "
    f"""(SELECT count(*) FROM (
         SELECT 1 FROM audit_events e
         WHERE e.project_id = s.project_id AND (e.tx, e.id) > (s.tx, s.event_id)
           AND (s.actions IS NULL OR e.action = ANY (s.actions)) LIMIT {LAG_CAP}) x)::int AS lag""")


async def insert_stream(conn: asyncpg.Connection, *, stream_id: str, project_id: str,
                        destination_type: str, sealed: bytes, shown: dict[str, object],
                        actions: list[str] | None, description: str | None) -> asyncpg.Record:
    """A new stream positioned at the log's horizon now: it carries what commits from here."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""WITH s AS (
                INSERT INTO audit_streams (id, project_id, destination_type, destination_sealed,
                                           destination_shown, actions, description, tx)
                VALUES ($1, $2, $3, $4, $5, $6, $7, {LOG_HORIZON})
                RETURNING *)
            SELECT {STREAM_COLUMNS} FROM s""",
        stream_id, project_id, destination_type, sealed, shown, actions, description)
    return row


async def find_stream(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, stream_id: str,
                      *, lock: bool = False) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {STREAM_COLUMNS} FROM audit_streams s WHERE s.id = $1 AND s.project_id = $2
            {'FOR UPDATE' if lock else ''}""", stream_id, project_id)
    return row


async def update_stream(conn: asyncpg.Connection, stream_id: str,
                        changes: dict[str, object]) -> asyncpg.Record:
    """Set ``changes`` (columns of the caller's constants); resuming (``status`` ``active``)
    makes the stream due at once."""
    p = Params()
    sets = [f"{column} = {p(value)}" for column, value in changes.items()]
    if changes.get("status") == "active":
        sets.append("next_attempt_at = now()")
    row: asyncpg.Record = await conn.fetchrow(
        f"""WITH s AS (UPDATE audit_streams SET {', '.join(sets)}, updated_at = now()
                       WHERE id = {p(stream_id)} RETURNING *)
            SELECT {STREAM_COLUMNS} FROM s""", *p.values)
    return row


async def delete_stream(conn: asyncpg.Connection, project_id: str, stream_id: str) -> bool:
    found = await conn.fetchval(
        "DELETE FROM audit_streams WHERE id = $1 AND project_id = $2 RETURNING 1",
        stream_id, project_id)
    return found is not None


STREAM_CLAIM: Final = """
UPDATE audit_streams s SET locked_until = now() + $1
WHERE s.id IN (
    SELECT id FROM audit_streams
    WHERE status <> 'paused' AND next_attempt_at <= now()
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED)
RETURNING s.id, s.project_id, s.destination_type, s.destination_sealed, s.actions,
          s.tx::text AS tx, s.event_id, s.batch, s.batch_created_at,
          s.batch_last_tx::text AS batch_last_tx, s.failures"""
"""Claim up to ``$2`` due streams for ``$1`` (an interval)."""
STREAM_NEXT: Final = f"""
SELECT {JSON_COLUMNS}, e.tx::text AS tx, e.created_at AS created_at_ts FROM audit_events e
WHERE e.project_id = $1 AND e.tx < {LOG_HORIZON}
  AND (e.tx, e.id) > ($2::text::xid8, $3::text)
  AND ($4::text[] IS NULL OR e.action = ANY ($4))
ORDER BY e.tx, e.id LIMIT $5"""
"""The next events of project ``$1`` after the position (``$2`` tx as text, ``$3`` id), of the
actions ``$4`` (null: all), at most ``$5``, below the oldest running transaction."""
STREAM_BATCH_EVENTS: Final = f"""
SELECT {JSON_COLUMNS} FROM unnest($1::timestamptz[], $2::text[]) WITH ORDINALITY AS k (created_at, id, n)
JOIN audit_events e ON e.created_at = k.created_at AND e.id = k.id
ORDER BY k.n"""
"""The events of a batch sent before, in its order (those dropped since are gone)."""
STREAM_HOLD_BATCH: Final = """
UPDATE audit_streams SET batch = $2, batch_created_at = $3, batch_last_tx = $4::text::xid8
WHERE id = $1"""
STREAM_ACKNOWLEDGED: Final = """
UPDATE audit_streams SET tx = batch_last_tx, event_id = batch[array_length(batch, 1)],
       batch = NULL, batch_created_at = NULL, batch_last_tx = NULL, failures = 0,
       status = CASE WHEN status = 'failing' THEN 'active' ELSE status END,
       last_error = NULL, last_delivered_at = now()
WHERE id = $1 AND batch IS NOT NULL
RETURNING status"""
"""The destination took the batch: the position moves past it (the claim goes on unless the
stream was paused or deleted meanwhile: ``paused`` or no row)."""
STREAM_IDLE: Final = """
UPDATE audit_streams SET locked_until = NULL,
       next_attempt_at = now() + CASE WHEN last_delivered_at > now() - interval '30 seconds'
                                      THEN $2::interval ELSE $3::interval END
WHERE id = $1"""
"""Nothing new for the stream: look again after ``$2`` while it delivered in the last 30 s,
else after ``$3`` (a quiet stream costs fewer polls)."""
STREAM_FAILED: Final = """
UPDATE audit_streams SET failures = failures + 1, last_error = $2, next_attempt_at = now() + $3,
       status = CASE WHEN status = 'active' THEN 'failing' ELSE status END, locked_until = NULL
WHERE id = $1"""
