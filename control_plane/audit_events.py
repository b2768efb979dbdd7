"""The audit log's read side (SPEC.md 2 "Audit event", 4 "Audit query filters", 8, 9.2-9.3).

Every endpoint needs scope ``audit:read`` and only ever reads the calling key's project. An event
is ``id``, ``created_at`` (RFC 3339 UTC, always with microseconds and ``Z``), ``action``,
``actor_type``, ``actor_id``, ``user_id``, ``project_id``, ``target_type``, ``target_id``, ``ip``,
``user_agent``, ``description`` (the column, else ``metadata.description``) and ``metadata``.

``GET /v1/audit/events``
    Filters, combinable: ``type`` (comma-separated action names, exact), ``user`` (user_id),
    ``actor`` (actor_id), ``from`` (inclusive) and ``to`` (exclusive) as ISO 8601 timestamps (no
    offset means UTC), ``q`` (case-insensitive substring of action, actor_id, target_id or the
    metadata description). Newest first, keyset-paginated on ``(created_at, id)``: ``limit``
    (1..1000, default 50) and ``cursor``. Body ``{"data": [event...], "next_cursor", "has_more",
    "request_id"}``. Each page continues strictly below the last key returned, so an event that
    existed when the first page was read is listed exactly once, however many are written
    meanwhile. A repeated, empty or unknown query parameter is ``invalid_request``. Each filter
    has its index (migration 0002); a ``q`` without three letters or digits in a row gives a
    trigram index nothing to use and is matched newest first until the page is full.

``GET /v1/audit/events.csv`` and ``GET /v1/audit/events.jsonl``
    The same filters and ``cursor`` (a listing's ``next_cursor`` works, and vice versa), plus
    ``limit`` (1..100000, default 100000: SPEC.md 8's export cap). CSV is RFC 4180 (CRLF, quotes
    doubled, fields holding a comma, quote, CR or LF quoted) with the columns of ``CSV_COLUMNS``
    under a header row; a cell starting with ``=``, ``+``, ``-``, ``@``, TAB or CR gets a leading
    ``'`` (the OWASP CSV-injection rule). JSONL is one full event (with ``metadata``) per line,
    each line ending in ``\\n``. Both are streamed from a server-side cursor in chunks of about
    256 KiB, so memory stays flat whatever the size.

    The cap: headers go out before the body, so the continuation is decided first. Inside one
    REPEATABLE READ snapshot a probe (``ORDER BY ... OFFSET cap-1 LIMIT 2``, walking the same index
    as the export itself) finds the key of the cap-th row and whether one more exists. If so the
    response carries ``Service-Next-Cursor: <cursor>`` and ``Link: <same URL with that cursor>;
    rel="next"`` and the stream is bounded to keys at or above that row; with the same snapshot
    the body then holds exactly ``cap`` rows. No header means the export is complete. A trailer or
    a final marker line was ruled out: CSV has no place for one and few clients read trailers.

``GET /v1/audit/events/types``
    ``{"data": [action...], "request_id"}``: the distinct actions of the project's events of the
    last 30 days, sorted (SPEC.md 9.3).

``GET /v1/audit-events`` (legacy, SPEC.md 9.2, kept indefinitely)
    ``before`` (ISO 8601; only events strictly older), ``action_prefix`` (literal prefix of the
    action: ``%`` and ``_`` are not wildcards), ``limit`` (1..1000, default 50); newest first.
    Body ``{"data": [event...], "next_before": <created_at of the last event> | null, "has_more",
    "request_id"}``; pass ``next_before`` back as ``before``. Events that share a timestamp are
    never split across pages (``before`` could not tell them apart): the page stops before such a
    group, or, when the group fills the whole page, holds all of it even past ``limit``. Empty
    ``before`` or ``action_prefix`` are ignored, for old clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
import orjson
from aiohttp import web
from multidict import MultiMapping

from common.appkeys import PG_POOL
from common.errors import InvalidRequest
from common.http import json_response, request_id
from control_plane.appkeys import CURSOR_SECRET
from control_plane.pagination import Listing, Page, page_body, parse_limit
from control_plane.principal import authenticate

log = logging.getLogger("authio.audit")

SCOPE: Final = "audit:read"
KIND: Final = "audit_events"  # the cursor's listing: JSON, CSV and JSONL share it
EXPORT_CAP: Final = 100_000  # SPEC.md 8
TYPES_WINDOW: Final = timedelta(days=30)
CSV_COLUMNS: Final = ("id", "created_at", "action", "actor_type", "actor_id", "user_id",
                      "project_id", "target_type", "target_id", "ip", "user_agent", "description")
# The expression of the trigram index ``audit_events_search`` (migration 0002), to the character:
# the planner only uses an expression index for the identical expression.
SEARCH_EXPR: Final = (
    "lower(action || E'\\x1f' || coalesce(actor_id, '') || E'\\x1f' || coalesce(target_id, '')"
    " || E'\\x1f' || coalesce(metadata ->> 'description', ''))"
)

_FILTERS: Final = ("type", "user", "actor", "from", "to", "q")
_MAX_TYPES: Final = 50
_MAX_VALUE: Final = 256
_MAX_Q: Final = 200
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")
_TRIGRAMS_RE: Final = re.compile(r"[^\W_]{3}")  # a run of 3 letters or digits: a usable trigram
# "2026-01-31T12:00:00 01:00": a '+' sent unencoded in a query string arrives as a space.
_SPACE_OFFSET_RE: Final = re.compile(r"(T[0-9:.,]+) ([0-9]{2}(?::?[0-9]{2})?)$")
_FETCH_ROWS: Final = 2000
_FORMULA_LEADS: Final = "=+-@\t\r"
_CHUNK_BYTES: Final = 256 * 1024

_CREATED: Final = """to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_DESCRIPTION: Final = "coalesce(e.description, e.metadata ->> 'description')"
_EVENT_COLUMNS: Final = (
    f"e.id, {_CREATED} AS created_at, e.action, e.actor_type, e.actor_id, e.user_id, e.project_id,"
    f" e.target_type, e.target_id, e.ip, e.user_agent, {_DESCRIPTION} AS description"
)
_JSON_COLUMNS: Final = _EVENT_COLUMNS + ", e.metadata"
_JSONL_COLUMNS: Final = _EVENT_COLUMNS + ", e.metadata::text AS metadata"


def _neutralized(expr: str) -> str:
    """SQL for ``expr`` with the OWASP CSV-injection rule applied: a leading ``'`` when it starts
    with ``=`` ``+`` ``-`` ``@`` TAB or CR (``ascii`` gives the code of the first character)."""
    codes = ", ".join(str(ord(c)) for c in _FORMULA_LEADS)
    return f"CASE WHEN ascii({expr}) IN ({codes}) THEN '''' || {expr} ELSE {expr} END"


_CSV_COLUMNS: Final = ", ".join(
    f"{_CREATED}" if name == "created_at"
    else _neutralized(_DESCRIPTION if name == "description" else f"e.{name}")
    for name in CSV_COLUMNS
)


# --- parameters --------------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class Key:
    """A position in the listing order: the ``(created_at, id)`` of an event."""

    created_at: datetime
    id: str


def format_time(value: datetime) -> str:
    """RFC 3339 UTC with microseconds and ``Z``, as ``_CREATED`` renders it in SQL."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(name: str, raw: str) -> datetime:
    """An ISO 8601 timestamp (no offset: UTC) as an aware UTC datetime.
    Raises InvalidRequest naming ``name``."""
    text = _SPACE_OFFSET_RE.sub(r"\1+\2", raw) if len(raw) <= 64 else ""
    try:
        value = datetime.fromisoformat(text)
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    except (ValueError, OverflowError):
        raise InvalidRequest.field(
            name, "must be an ISO 8601 timestamp such as 2026-01-31T12:00:00Z"
        ) from None


def _single(query: MultiMapping[str], allowed: Sequence[str]) -> dict[str, str]:
    """The query as a plain dict; raises InvalidRequest for an unknown or repeated parameter."""
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        fields = [{"field": name, "message": "unknown query parameter"} for name in unknown]
        raise InvalidRequest(f"Unknown query parameter {unknown[0]!r}; allowed: {', '.join(allowed)}.",
                             details={"fields": fields})
    out: dict[str, str] = {}
    for name in query:
        values = query.getall(name)
        if len(values) > 1:
            raise InvalidRequest.field(name, "must be given at most once")
        out[name] = values[0]
    return out


def _text(params: dict[str, str], name: str, max_len: int = _MAX_VALUE) -> str | None:
    value = params.get(name)
    if value is None:
        return None
    if not value:
        raise InvalidRequest.field(name, "must not be empty")
    if len(value) > max_len:
        raise InvalidRequest.field(name, f"must be at most {max_len} characters")
    if _CONTROL_RE.search(value):
        raise InvalidRequest.field(name, "must not contain control characters")
    return value


def parse_filters(params: dict[str, str]) -> Filters:
    """The filters of ``params`` (already checked for unknown and repeated names)."""
    types: tuple[str, ...] = ()
    raw_type = _text(params, "type", max_len=_MAX_TYPES * (_MAX_VALUE + 1))
    if raw_type is not None:
        names = list(dict.fromkeys(t.strip() for t in raw_type.split(",") if t.strip()))
        if not names:
            raise InvalidRequest.field("type", "must name at least one action")
        if len(names) > _MAX_TYPES or any(len(t) > _MAX_VALUE for t in names):
            raise InvalidRequest.field(
                "type", f"at most {_MAX_TYPES} actions of at most {_MAX_VALUE} characters each")
        types = tuple(names)
    since = parse_time("from", v) if (v := _text(params, "from")) is not None else None
    until = parse_time("to", v) if (v := _text(params, "to")) is not None else None
    if since is not None and until is not None and until < since:
        raise InvalidRequest.field("to", "must not be earlier than from")
    return Filters(types=types, user=_text(params, "user"), actor=_text(params, "actor"),
                   since=since, until=until, q=_text(params, "q", max_len=_MAX_Q))


def _listing(request: web.Request, project_id: str) -> Listing:
    return Listing(KIND, project_id, request.app[CURSOR_SECRET])


def parse_cursor(params: dict[str, str], listing: Listing) -> Key | None:
    """The position after which to continue, from ``cursor``. Raises InvalidRequest."""
    cursor = params.get("cursor")
    if not cursor:
        return None
    created, event_id = listing.decode(cursor, key_len=2)
    try:
        return Key(datetime.fromisoformat(created), event_id)
    except ValueError:
        raise InvalidRequest.field("cursor", "is not a cursor this listing issued") from None


# --- SQL ---------------------------------------------------------------------------------------


@dataclass
class _Args:
    """Positional query arguments: ``args(value)`` appends one and returns its ``$n``."""

    values: list[object] = field(default_factory=list)

    def __call__(self, value: object) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


def _like_literal(text: str) -> str:
    """``text`` with LIKE's escape character and wildcards escaped (default escape ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _conditions(args: _Args, project_id: str, f: Filters, after: Key | None,
                bound: Key | None) -> list[str]:
    conds = [f"e.project_id = {args(project_id)}"]
    if f.user is not None:
        conds.append(f"e.user_id = {args(f.user)}")
    if f.actor is not None:
        conds.append(f"e.actor_id = {args(f.actor)}")
    if f.since is not None:
        conds.append(f"e.created_at >= {args(f.since)}")
    if f.until is not None:
        conds.append(f"e.created_at < {args(f.until)}")
    if f.q is not None:
        if _TRIGRAMS_RE.search(f.q):
            # Written as the index's expression LIKE a pattern, so the trigram index applies.
            # Every trigram of the pattern is looked up: a rare e-mail whose domain trigrams are
            # common costs 0.3-0.7 s at 10M events. Giving the index only the longest run fixes
            # that (11-18 ms) but turns a phrase of common words into a recheck of millions of
            # rows (seconds); choosing well needs trigram frequencies pg_trgm does not keep.
            conds.append(f"{SEARCH_EXPR} LIKE lower({args('%' + _like_literal(f.q) + '%')})")
        else:
            # Nothing a trigram index could use: scan newest first and stop at the LIMIT.
            conds.append(f"strpos({SEARCH_EXPR}, lower({args(f.q)})) > 0")
    if after is not None:
        conds.append(f"(e.created_at, e.id) < ({args(after.created_at)}, {args(after.id)})")
    if bound is not None:
        conds.append(f"(e.created_at, e.id) >= ({args(bound.created_at)}, {args(bound.id)})")
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
    args = _Args()
    common = _conditions(args, project_id, f, after, bound)
    order = "ORDER BY e.created_at DESC, e.id DESC"
    tail = order
    if offset:
        tail += f" OFFSET {args(offset)}"
    if limit is not None:
        tail += f" LIMIT {args(limit)}"
    if len(f.types) <= 1:
        conds = common + [f"e.action = {args(t)}" for t in f.types]
        return f"SELECT {columns} FROM audit_events e WHERE {' AND '.join(conds)} {tail}", args.values
    branch_limit = f" LIMIT {args(offset + limit)}" if limit is not None else ""
    branches = " UNION ALL ".join(
        f"(SELECT * FROM audit_events e WHERE {' AND '.join([*common, f'e.action = {args(t)}'])}"
        f" {order}{branch_limit})"
        for t in f.types
    )
    return f"SELECT {columns} FROM ({branches}) e {tail}", args.values


async def _custom_plans(conn: asyncpg.Connection) -> None:
    # Prepared statements may switch to a generic plan after five runs; the right index for a
    # filter depends on its values (how rare a ``q`` or a type is), so plan every run afresh.
    await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")


# --- rules -------------------------------------------------------------------------------------


async def list_events(pool: asyncpg.Pool, listing: Listing, f: Filters, page: Page,
                      after: Key | None) -> dict[str, Any]:
    """One page of the listing (``page.limit`` events below ``after``)."""
    sql, args = build_query(_JSON_COLUMNS, listing.project_id, f, after=after,
                            limit=page.limit + 1)
    async with pool.acquire() as conn, conn.transaction(readonly=True):
        await _custom_plans(conn)
        rows = await conn.fetch(sql, *args)
    return page_body([dict(r) for r in rows], page, listing, key=["created_at", "id"])


async def event_types(pool: asyncpg.Pool, project_id: str, *, now: datetime) -> list[str]:
    """The distinct actions of the project's events since ``now`` minus 30 days, sorted.

    A loose index scan: each step finds the next action of the project from the
    ``(project_id, action, ...)`` index in one probe, then one more probe asks whether it has a
    recent event; the cost follows the number of distinct actions, not of events.
    """
    rows = await pool.fetch(
        """WITH RECURSIVE actions(action) AS (
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
               WHERE e.project_id = $1 AND e.action = a.action AND e.created_at >= $2 LIMIT 1)""",
        project_id, now - TYPES_WINDOW,
    )
    return sorted(r["action"] for r in rows)


async def legacy_events(pool: asyncpg.Pool, project_id: str, *, before: datetime | None,
                        action_prefix: str | None, limit: int) -> dict[str, Any]:
    """A page of the legacy listing (see the module docstring for the shape)."""
    args = _Args()
    conds = [f"e.project_id = {args(project_id)}"]
    if before is not None:
        conds.append(f"e.created_at < {args(before)}")
    if action_prefix:
        conds.append(f"e.action LIKE {args(_like_literal(action_prefix) + '%')}")
    where = " AND ".join(conds)
    base = list(args.values)
    at = f"${len(base) + 1}"  # the limit below, or the timestamp of a tie group
    order = "ORDER BY e.created_at DESC, e.id DESC"
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        await _custom_plans(conn)
        rows = await conn.fetch(
            f"SELECT {_JSON_COLUMNS} FROM audit_events e WHERE {where} {order} LIMIT {at}",
            *base, limit + 1,
        )
        has_more = len(rows) > limit
        page = [dict(r) for r in rows[:limit]]
        if has_more and rows[limit]["created_at"] == page[-1]["created_at"]:
            tie = page[-1]["created_at"]
            kept = [r for r in page if r["created_at"] != tie]
            if kept:
                page = kept
            else:  # one timestamp fills the page: return its whole group
                tie_at = datetime.fromisoformat(tie)
                group = await conn.fetch(
                    f"SELECT {_JSON_COLUMNS} FROM audit_events e WHERE {where}"
                    f" AND e.created_at = {at} {order}", *base, tie_at,
                )
                page = [dict(r) for r in group]
                has_more = await conn.fetchval(
                    f"SELECT EXISTS (SELECT 1 FROM audit_events e WHERE {where}"
                    f" AND e.created_at < {at})", *base, tie_at,
                )
    return {"data": page, "next_before": page[-1]["created_at"] if has_more else None,
            "has_more": has_more}


# --- export ------------------------------------------------------------------------------------


Formatter = Callable[[Sequence[asyncpg.Record]], bytes]


def _csv_writer() -> tuple[Formatter, bytes]:
    """A CSV formatter, and the header row. Every column arrives as text (or NULL).

    A row none of whose fields holds a comma, quote, CR or LF (nearly all) is joined directly;
    any other goes through the stdlib writer (such fields quoted, quotes doubled), whose output
    the direct join equals on the rows it takes.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    commas = len(CSV_COLUMNS) - 1

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

    return rows_to_csv, (",".join(CSV_COLUMNS) + "\r\n").encode()


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
class _Format:
    extension: str
    content_type: str
    columns: str


_CSV: Final = _Format("csv", "text/csv", _CSV_COLUMNS)
_JSONL: Final = _Format("jsonl", "application/x-ndjson", _JSONL_COLUMNS)


async def _export(request: web.Request, fmt: _Format) -> web.StreamResponse:
    principal = await authenticate(request, SCOPE)
    params = _single(request.query, (*_FILTERS, "cursor", "limit"))
    f = parse_filters(params)
    listing = _listing(request, principal.project_id)
    after = parse_cursor(params, listing)
    cap = parse_limit(params, default=EXPORT_CAP, maximum=EXPORT_CAP)
    now = datetime.now(UTC)
    response = web.StreamResponse(headers={
        "X-Request-Id": request_id(request),
        "Cache-Control": "no-store",
        "Content-Disposition": (f'attachment; filename="audit-events-{principal.project_id}-'
                                f'{now:%Y%m%dT%H%M%SZ}.{fmt.extension}"'),
    })
    response.content_type = fmt.content_type
    if fmt is _CSV:
        response.charset = "utf-8"
    try:
        async with request.app[PG_POOL].acquire() as conn, \
                conn.transaction(isolation="repeatable_read", readonly=True):
            await _custom_plans(conn)
            # A streamed export must walk the time index: with the default random_page_cost (4)
            # the planner prefers reading the newest partition whole and sorting it, which at
            # 10M events spills 40 MB to disk and sends nothing for 0.5-0.75 s, and its cost
            # estimate switches JIT on (347 of 429 ms). 1.1 is the usual value for SSDs or
            # cached data; both settings end with this transaction.
            await conn.execute("SET LOCAL random_page_cost = 1.1")
            await conn.execute("SET LOCAL jit = off")
            sql, args = build_query("e.created_at, e.id", principal.project_id, f, after=after,
                                    offset=cap - 1, limit=2)
            edge = await conn.fetch(sql, *args)
            bound = Key(edge[0]["created_at"], edge[0]["id"]) if len(edge) == 2 else None
            if bound is not None:
                next_cursor = listing.encode([format_time(bound.created_at), bound.id])
                response.headers["Service-Next-Cursor"] = next_cursor
                response.headers["Link"] = (
                    f'<{request.rel_url.update_query(cursor=next_cursor)}>; rel="next"')
            sql, args = build_query(fmt.columns, principal.project_id, f, after=after,
                                    bound=bound, limit=cap)
            cursor = await conn.cursor(sql, *args)
            await response.prepare(request)
            await _stream(response, cursor, fmt)
    except Exception as exc:
        if not response.prepared:
            raise  # nothing sent yet: the envelope middleware answers
        # The status line is out. A client that left needs nothing; otherwise all that is left
        # is to cut the transfer short, so the client sees an incomplete body, not a whole file.
        if isinstance(exc, ConnectionResetError):
            log.info("audit export: the client went away", extra={"request_id": request_id(request)})
        else:
            log.exception("audit export failed mid-stream", extra={"request_id": request_id(request)})
            if request.transport is not None:
                request.transport.abort()
        return response
    await response.write_eof()
    return response


async def _stream(response: web.StreamResponse, cursor: asyncpg.cursor.Cursor[asyncpg.Record],
                  fmt: _Format) -> None:
    """Fetch, format and write batch after batch. The next FETCH is sent before the current
    batch is formatted, so PostgreSQL produces rows while this process formats the last ones."""
    if fmt is _CSV:
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
                await response.write(b"".join(pending))
                pending, size = [], 0
        if pending:
            await response.write(b"".join(pending))
    finally:
        if not fetch.done():
            # One operation at a time on a connection: the FETCH in flight finishes before the
            # transaction ends (a client that left mid-export brings us here).
            with contextlib.suppress(Exception):
                await fetch


# --- handlers ----------------------------------------------------------------------------------


async def get_events(request: web.Request) -> web.Response:
    principal = await authenticate(request, SCOPE)
    params = _single(request.query, (*_FILTERS, "cursor", "limit"))
    f = parse_filters(params)
    listing = _listing(request, principal.project_id)
    page = Page(parse_limit(params), None)
    after = parse_cursor(params, listing)
    body = await list_events(request.app[PG_POOL], listing, f, page, after)
    return json_response(request, body)


async def get_events_csv(request: web.Request) -> web.StreamResponse:
    return await _export(request, _CSV)


async def get_events_jsonl(request: web.Request) -> web.StreamResponse:
    return await _export(request, _JSONL)


async def get_event_types(request: web.Request) -> web.Response:
    principal = await authenticate(request, SCOPE)
    _single(request.query, ())
    types = await event_types(request.app[PG_POOL], principal.project_id, now=datetime.now(UTC))
    return json_response(request, {"data": types})


async def get_legacy_events(request: web.Request) -> web.Response:
    principal = await authenticate(request, SCOPE)
    params = _single(request.query, ("before", "action_prefix", "limit"))
    before = parse_time("before", params["before"]) if params.get("before") else None
    prefix = params.get("action_prefix") or None
    if prefix is not None and (len(prefix) > _MAX_VALUE or _CONTROL_RE.search(prefix)):
        raise InvalidRequest.field(
            "action_prefix", f"must be at most {_MAX_VALUE} characters, no control characters")
    body = await legacy_events(request.app[PG_POOL], principal.project_id, before=before,
                               action_prefix=prefix, limit=parse_limit(params))
    return json_response(request, body)

