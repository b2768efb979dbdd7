"""The audit log's rules: recording events inside the caller's transaction, and reading them.

Writing (SPEC.md 2 "Audit event", DESIGN.md "audit writes"): :func:`record` inserts one event in
the caller's transaction, so an action that rolls back leaves no event and one that commits
always has one; a hot path can instead let its own statement write the event
(``repository.insert_from`` with :func:`event_params`).

Reading (SPEC.md 4 "Audit query filters", 8, 9.2-9.3), always of one project:

* :func:`list_events`: the filters, newest first, keyset-paginated on ``(created_at, id)``. Each
  page continues strictly below the last key returned, so an event that existed when the first
  page was read is listed exactly once, however many are written meanwhile. A ``q`` is matched
  as a case-insensitive substring (SPEC.md 4) through the trigram index: asked for ``q``'s rare
  trigrams alone when it has some (:func:`rare_trigrams`), for all of them otherwise. A ``q``
  without three letters or digits in a row gives the index nothing to use and is matched newest
  first until the page is full.
* :func:`open_export`: CSV (RFC 4180, the columns of ``repository.CSV_COLUMNS`` under a header
  row, a cell starting with ``=`` ``+`` ``-`` ``@`` TAB or CR prefixed with ``'``: the OWASP
  CSV-injection rule) or JSONL (one full event per line), streamed from a server-side cursor in
  chunks of about 256 KiB, so memory stays flat whatever the size. At most the query's ``limit``
  rows (100,000 by default, SPEC.md 8's cap): the continuation is decided before the first byte
  (inside one REPEATABLE READ snapshot a probe finds the key of the last row allowed and whether
  one more exists), so the caller can send it as headers; the stream is then bounded to keys at
  or above that row and, with the same snapshot, holds exactly ``limit`` rows.
* :func:`event_types`: the distinct actions of the last 30 days.
* :func:`legacy_events`: ``GET /v1/audit-events`` (SPEC.md 9.2): ``before`` and a literal
  ``action_prefix``; events sharing a timestamp are never split across pages (``before`` could
  not tell them apart): the page stops before such a group, or, when the group fills the whole
  page, holds all of it even past ``limit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import asyncpg
import orjson

from common.db import Params
from common.errors import InvalidRequest, NotFound
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import repository
from control_plane.audit.repository import Filters, Key, format_time
from control_plane.audit.schemas import (
    AuditEvent,
    DeletedStream,
    EventFilters,
    EventsQuery,
    ExportQuery,
    LegacyPage,
    LegacyQuery,
    Stream,
    StreamBody,
    StreamPatch,
)
from control_plane.audit.streams import DESTINATIONS
from control_plane.audit.streams.base import Destination
from control_plane.kms import LocalKms
from control_plane.web import outbound, webhook_signing
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, PageQuery, Position, page_by_id, page_of

LISTING: Final = "audit_events"  # the cursor's listing: JSON, CSV and JSONL share it
TYPES_WINDOW: Final = timedelta(days=30)
_FETCH_ROWS: Final = 2000
_CHUNK_BYTES: Final = 256 * 1024


# --- writing -----------------------------------------------------------------------------------


def event_values(
    actor: Actor, *, action: str, project_id: str | None = None, target_type: str | None = None,
    target_id: str | None = None, user_id: str | None = None, description: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, object]:
    """One event's values by column (a new ``evt_`` id; ``project_id`` defaults to the actor's;
    ``description`` is stored in its column and in ``metadata.description``, SPEC.md 2)."""
    meta = dict(metadata or {})
    if description is not None:
        meta.setdefault("description", description)
    return {"id": new_id("evt"), "action": action, "actor_type": actor.type,
            "actor_id": actor.id, "user_id": user_id,
            "project_id": project_id if project_id is not None else actor.project_id,
            "target_type": target_type, "target_id": target_id, "ip": actor.ip,
            "user_agent": actor.user_agent, "description": description,
            "api_key_id": actor.api_key_id, "metadata": meta}


def event_params(actor: Actor, *, name: str = "event", **event: Any) -> dict[str, object]:
    """``event_values`` as the named parameters ``repository.insert_from(..., name=name)``
    places in a statement."""
    return {f"{name}_{column}": value
            for column, value in event_values(actor, **event).items()}


LOG_HORIZON: Final = repository.LOG_HORIZON
"""SQL: how far a reader of the log in ``(tx, id)`` order may go (``repository.LOG_HORIZON``)."""
EVENT_COLUMNS: Final = repository.JSON_COLUMNS
"""The columns of an event as ``GET /v1/audit/events`` lists it (table alias ``e``), for another
domain's query that sends events elsewhere (webhooks, streams)."""

insert_from = repository.insert_from
"""SQL inserting the event of a statement of another domain, from its ``event_params``: the
event commits with the statement's change (``repository.insert_from``)."""


async def record(
    conn: asyncpg.Connection, actor: Actor, *, action: str, project_id: str | None = None,
    target_type: str | None = None, target_id: str | None = None, user_id: str | None = None,
    description: str | None = None, metadata: dict[str, Any] | None = None,
) -> str:
    """Insert one event in ``conn``'s current transaction and return its ``evt_`` id."""
    values = event_values(actor, action=action, project_id=project_id, target_type=target_type,
                          target_id=target_id, user_id=user_id, description=description,
                          metadata=metadata)
    await repository.insert(conn, values)
    return str(values["id"])


# --- reading -----------------------------------------------------------------------------------


def listing(project_id: str, secret: bytes) -> Listing:
    """The listing every read of ``project_id``'s events pages through (cursors are shared)."""
    return Listing(LISTING, project_id, secret)


RARE_TRIGRAM: Final = 0.01
"""A trigram held by fewer than this fraction of events is rare enough to find ``q`` by."""
MAX_INDEX_TRIGRAMS: Final = 3
_ASCII_TRIGRAMS: Final = re.compile(r"(?=([A-Za-z0-9]{3}))")


def rare_trigrams(q: str, frequencies: Mapping[str, float]) -> tuple[str, ...]:
    """The rarest trigrams of ``q`` (at most :data:`MAX_INDEX_TRIGRAMS`, rarest first), given
    the fraction of events holding each listed trigram; one not listed is rarer than every
    listed one. Only trigrams under :data:`RARE_TRIGRAM` count; none, or no statistics: ``()``.

    Why: the trigram index answers a LIKE pattern by reading the posting list of every trigram
    in it, and an e-mail's common ones ("gma", "com") hold most of the log; read alone, a rare
    trigram's list is short and ``q`` itself is checked on the few rows it names. Candidates are
    runs of three ASCII letters or digits in ``q`` lower-cased: each is a trigram pg_trgm keeps
    for any text containing ``q`` (it indexes every three consecutive word characters), so
    requiring it drops no match, and ASCII case-folds the same in Python and PostgreSQL."""
    if not frequencies:
        return ()
    found = {t.lower() for t in _ASCII_TRIGRAMS.findall(q)}
    ranked = sorted(found, key=lambda t: (frequencies.get(t, 0.0), t))
    return tuple(t for t in ranked if frequencies.get(t, 0.0) < RARE_TRIGRAM)[:MAX_INDEX_TRIGRAMS]


def filters(query: EventFilters) -> Filters:
    """The query's filters as the repository takes them."""
    return Filters(types=query.type or (), user=query.user, actor=query.actor,
                   since=query.since, until=query.to, q=query.q)


def with_rare_trigrams(f: Filters, frequencies: Mapping[str, float]) -> Filters:
    """``f`` with the rare trigrams of its ``q`` given the trigrams' ``frequencies``."""
    return f if f.q is None else replace(f, q_trigrams=rare_trigrams(f.q, frequencies))


async def mentions(conn: asyncpg.Connection, text: str) -> Callable[[Params], str]:
    """A builder of SQL (over alias ``e``, its values placed with the statement's ``Params``)
    true for the events whose action, actor, target or description holds ``text``
    case-insensitively: the ``q`` search's rule and index path, for another domain's statement
    (a data-subject deletion finds the events that mention an e-mail address)."""
    trigrams = rare_trigrams(text, await repository.search_trigram_frequencies(conn))
    return lambda p: repository.search_condition(p, text, trigrams)


async def _searched(conn: asyncpg.Connection, f: Filters) -> Filters:
    """``f`` with the rare trigrams of its ``q``, by the statistics of migration 0012."""
    if f.q is None:
        return f
    return with_rare_trigrams(f, await repository.search_trigram_frequencies(conn))


def cursor_key(cursor: str | None, events: Listing) -> Key | None:
    """The position after which to continue, from a cursor ``events`` issued (None: from the
    newest). Raises InvalidRequest naming ``cursor``."""
    if not cursor:
        return None
    created, event_id = events.decode(cursor, key_len=2)
    try:
        return Key(datetime.fromisoformat(created), event_id)
    except ValueError:
        raise InvalidRequest.field("cursor", "is not a cursor this listing issued") from None


async def list_events(pool: asyncpg.Pool, events: Listing,
                      query: EventsQuery) -> Page[AuditEvent]:
    """One page of the project's events that pass the query's filters.
    Raises InvalidRequest (cursor)."""
    after = cursor_key(query.cursor, events)
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        await repository.custom_plans(conn)
        sql, args = repository.build_query(repository.JSON_COLUMNS, events.project_id,
                                           await _searched(conn, filters(query)), after=after,
                                           limit=query.limit + 1)
        rows = await conn.fetch(sql, *args)
    return page_of([AuditEvent(**r) for r in rows], Position(query.limit, None), events,
                   key=lambda e: [e.created_at, e.id])


async def event_types(pool: asyncpg.Pool, project_id: str, *, now: datetime) -> list[str]:
    """The distinct actions of the project's events since ``now`` minus 30 days, sorted."""
    rows = await pool.fetch(repository.EVENT_TYPES, project_id, now - TYPES_WINDOW)
    return sorted(r["action"] for r in rows)


async def legacy_events(pool: asyncpg.Pool, project_id: str,
                        query: LegacyQuery) -> LegacyPage:
    """A page of the legacy listing (see the module docstring for the rule on ties)."""
    q = repository.legacy_query(project_id, before=query.before,
                                action_prefix=query.action_prefix)
    limit = query.limit
    select = f"SELECT {repository.JSON_COLUMNS} FROM audit_events e WHERE {q.where}"
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        await repository.custom_plans(conn)
        p = q.params.copy()
        rows = await conn.fetch(f"{select} {q.order} LIMIT {p(limit + 1)}", *p.values)
        has_more = len(rows) > limit
        page = [AuditEvent(**r) for r in rows[:limit]]
        if has_more and rows[limit]["created_at"] == page[-1].created_at:
            tie = page[-1].created_at
            kept = [e for e in page if e.created_at != tie]
            if kept:
                page = kept
            else:  # one timestamp fills the page: return its whole group
                tie_at = datetime.fromisoformat(tie)
                p = q.params.copy()
                group = await conn.fetch(
                    f"{select} AND e.created_at = {p(tie_at)} {q.order}", *p.values)
                page = [AuditEvent(**r) for r in group]
                p = q.params.copy()
                has_more = await conn.fetchval(
                    f"SELECT EXISTS (SELECT 1 FROM audit_events e WHERE {q.where}"
                    f" AND e.created_at < {p(tie_at)})", *p.values)
    return LegacyPage(page, page[-1].created_at if has_more else None, has_more)


# --- exports -----------------------------------------------------------------------------------

ExportFormat = Literal["csv", "jsonl"]
Formatter = Callable[[Sequence[asyncpg.Record]], bytes]


def _csv_writer() -> tuple[Formatter, bytes]:
    """A CSV formatter, and the header row. Every column arrives as text (or NULL).

    A row none of whose fields holds a comma, quote, CR or LF (nearly all) is joined directly;
    any other goes through the stdlib writer (such fields quoted, quotes doubled), whose output
    the direct join equals on the rows it takes.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    commas = len(repository.CSV_COLUMNS) - 1

    def quoted(row: asyncpg.Record) -> str:
        buf.seek(0)
        buf.truncate()
        writer.writerow(row)
        return buf.getvalue()

    def rows_to_csv(rows: Sequence[asyncpg.Record]) -> bytes:
        out = []
        for row in rows:
            line = ",".join([v or "" for v in row])
            if (line.count(",") == commas and '"' not in line and "\n" not in line
                    and "\r" not in line):
                out.append(line + "\r\n")
            else:
                out.append(quoted(row))
        return "".join(out).encode()

    return rows_to_csv, (",".join(repository.CSV_COLUMNS) + "\r\n").encode()


def _rows_to_jsonl(rows: Sequence[asyncpg.Record]) -> bytes:
    out = []
    dumps, fragment = orjson.dumps, orjson.Fragment
    for r in rows:
        event = dict(r)
        event["metadata"] = fragment(event["metadata"])
        out.append(dumps(event))
    out.append(b"")
    return b"\n".join(out)


@dataclass(frozen=True, slots=True)
class Export:
    """An export under way: ``next_cursor`` (None when the export is complete) and the body's
    ``chunks``, valid inside ``open_export``'s block only."""

    next_cursor: str | None
    chunks: AsyncIterator[bytes]


def export_filename(project_id: str, fmt: ExportFormat) -> str:
    """An export's file name: ``audit-events-<project>-<UTC time, ISO 8601 basic>.<fmt>``."""
    return f"audit-events-{project_id}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.{fmt}"


@contextlib.asynccontextmanager
async def open_export(pool: asyncpg.Pool, events: Listing, query: ExportQuery,
                      fmt: ExportFormat) -> AsyncIterator[Export]:
    """Open an export of the project's events that pass the query's filters, in one snapshot.
    Raises InvalidRequest (cursor) before anything is read."""
    after = cursor_key(query.cursor, events)
    cap = query.limit
    async with pool.acquire() as conn, \
            conn.transaction(isolation="repeatable_read", readonly=True):
        await repository.export_settings(conn)
        f = await _searched(conn, filters(query))
        sql, args = repository.build_query("e.created_at, e.id", events.project_id, f,
                                           after=after, offset=cap - 1, limit=2)
        edge = await conn.fetch(sql, *args)
        bound = Key(edge[0]["created_at"], edge[0]["id"]) if len(edge) == 2 else None
        next_cursor = (events.encode([format_time(bound.created_at), bound.id])
                       if bound is not None else None)
        columns = repository.CSV_SELECT if fmt == "csv" else repository.JSONL_COLUMNS
        sql, args = repository.build_query(columns, events.project_id, f, after=after,
                                           bound=bound, limit=cap)
        cursor = await conn.cursor(sql, *args)
        chunks = _chunks(cursor, fmt)
        try:
            yield Export(next_cursor, chunks)
        finally:
            await chunks.aclose()  # its FETCH in flight ends before the transaction does


async def _chunks(cursor: asyncpg.cursor.Cursor[asyncpg.Record],
                  fmt: ExportFormat) -> AsyncGenerator[bytes, None]:
    """Fetch, format and yield batch after batch. The next FETCH is sent before the current
    batch is formatted, so PostgreSQL produces rows while this process formats the last ones."""
    if fmt == "csv":
        to_bytes, header = _csv_writer()
        pending = [header]
    else:
        to_bytes, pending = _rows_to_jsonl, []
    size = sum(len(p) for p in pending)
    fetch = asyncio.ensure_future(cursor.fetch(_FETCH_ROWS))
    try:
        while rows := await fetch:
            fetch = asyncio.ensure_future(cursor.fetch(_FETCH_ROWS))
            await asyncio.sleep(0)  # the next FETCH goes out
            chunk = to_bytes(rows)
            pending.append(chunk)
            size += len(chunk)
            if size >= _CHUNK_BYTES:
                yield b"".join(pending)
                pending, size = [], 0
        if pending:
            yield b"".join(pending)
    finally:
        if not fetch.done():
            # One operation at a time on a connection: the FETCH in flight finishes before the
            # transaction ends (a client that left mid-export brings us here).
            with contextlib.suppress(Exception):
                await fetch


# --- audit streams -------------------------------------------------------------------------------

STREAMS_LISTING: Final = "audit_streams"


def stream_aad(stream_id: str) -> bytes:
    """What binds a sealed destination to its stream's row."""
    return b"audit_stream:" + stream_id.encode()


def _stream(row: asyncpg.Record, secret: str | None = None) -> Stream:
    return Stream(row["id"], dict(row["destination_shown"]),
                  list(row["actions"]) if row["actions"] is not None else None,
                  row["description"], row["status"], row["lag"], row["last_error"],
                  row["last_delivered_at"], row["created_at"], secret)


def _actions(actions: list[str] | None) -> list[str] | None:
    """The filter as stored: duplicates dropped; ``*`` (or none) is every event (null)."""
    if actions is None or "*" in actions:
        return None
    return list(dict.fromkeys(actions))


async def _check_addresses(config: dict[str, Any], destination: Destination,
                           settings: Settings) -> None:
    """Raises InvalidRequest naming each destination address the outbound rule refuses."""
    allow = settings.webhook_allow_private_urls
    problems = [(f"destination.{name}", problem) for name in destination.urls
                if config.get(name) is not None and (problem := await outbound.resolved_problem(
                    str(config[name]), allow_private=allow))]
    if destination.check is not None:
        problems += await destination.check(config, allow_private=allow)
    if problems:
        raise InvalidRequest(
            "; ".join(f"{field}: {problem}" for field, problem in problems),
            details={"fields": [{"field": f, "message": m} for f, m in problems]})


async def create_stream(conn: asyncpg.Connection, actor: Actor, *, body: StreamBody,
                        kms: LocalKms, settings: Settings) -> Stream:
    """A new stream carrying the events committed from now on (of ``body.actions``) to its
    destination; its credentials sealed by the KMS and shown as ``"***"``; a ``webhook``
    destination gets a signing secret, answered this once (``audit.stream.created``). Raises
    InvalidRequest naming a destination URL the outbound rule refuses."""
    assert actor.project_id is not None
    config = body.destination.model_dump(exclude_none=True)
    kind = DESTINATIONS[config["type"]]
    await _check_addresses(config, kind, settings)
    stream_id = new_id("strm")
    secret = webhook_signing.new_secret() if kind.signed else None
    sealed_config = {**config, **({"secret": secret} if secret else {})}
    shown = {k: ("***" if k in kind.secrets else v) for k, v in config.items()}
    actions = _actions(body.actions)
    async with conn.transaction():
        row = await repository.insert_stream(
            conn, stream_id=stream_id, project_id=actor.project_id,
            destination_type=config["type"],
            sealed=kms.seal(orjson.dumps(sealed_config), stream_aad(stream_id)), shown=shown,
            actions=actions, description=body.description)
        await record(conn, actor, action="audit.stream.created", target_type="audit_stream",
                     target_id=stream_id, description=f"Created audit stream {stream_id}",
                     metadata={"destination": shown, "actions": actions})
    return _stream(row, secret)


async def find_stream(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, stream_id: str,
                      *, lock: bool = False) -> asyncpg.Record:
    """The project's stream. Raises NotFound (another project's too)."""
    row = None
    if is_id(stream_id, "strm"):
        row = await repository.find_stream(conn, project_id, stream_id, lock=lock)
    if row is None:
        raise NotFound("No audit stream with that id in this project.")
    return row


async def describe_stream(pool: asyncpg.Pool, project_id: str, stream_id: str) -> Stream:
    """The stream with its status and lag. Raises NotFound."""
    return _stream(await find_stream(pool, project_id, stream_id))


async def list_streams(pool: asyncpg.Pool, listing: Listing, query: PageQuery) -> Page[Stream]:
    """A page of the project's streams, oldest first, each with its lag. Raises InvalidRequest
    (cursor)."""
    return await page_by_id(pool, listing, query, table="audit_streams s",
                            columns=repository.STREAM_COLUMNS, row=_stream, alias="s")


async def update_stream(conn: asyncpg.Connection, actor: Actor, *, stream_id: str,
                        body: StreamPatch) -> Stream:
    """Pause, resume, or change the filter or the note (``audit.stream.updated``). A paused
    stream keeps its position: resumed, it goes on from there. Raises NotFound."""
    assert actor.project_id is not None
    changes: dict[str, object] = {}
    fields = body.model_fields_set
    if "status" in fields:
        changes["status"] = body.status
    if "actions" in fields:
        changes["actions"] = _actions(body.actions)
    if "description" in fields:
        changes["description"] = body.description
    async with conn.transaction():
        before = await find_stream(conn, actor.project_id, stream_id, lock=True)
        if changes.get("status") == "active" and before["status"] == "failing":
            del changes["status"]  # it is not paused: it keeps trying
        row = await repository.update_stream(conn, stream_id, changes) if changes else before
        await record(conn, actor, action="audit.stream.updated", target_type="audit_stream",
                     target_id=stream_id, description=f"Updated audit stream {stream_id}",
                     metadata={"changed": sorted(fields), "status": row["status"],
                               "previous_status": before["status"],
                               "actions": row["actions"]})
    return _stream(row)


async def remove_stream(conn: asyncpg.Connection, actor: Actor, *, stream_id: str) -> DeletedStream:
    """Delete the stream (``audit.stream.deleted``): nothing more is sent. Raises NotFound."""
    assert actor.project_id is not None
    async with conn.transaction():
        await find_stream(conn, actor.project_id, stream_id, lock=True)
        await repository.delete_stream(conn, actor.project_id, stream_id)
        await record(conn, actor, action="audit.stream.deleted", target_type="audit_stream",
                     target_id=stream_id, description=f"Deleted audit stream {stream_id}")
    return DeletedStream(stream_id, True)


def open_destination(kms: LocalKms, stream_id: str, sealed: bytes) -> dict[str, Any]:
    """A stream's destination configuration, credentials (and a webhook's secret) included."""
    config: dict[str, Any] = orjson.loads(kms.open(sealed, stream_aad(stream_id)))
    return config
