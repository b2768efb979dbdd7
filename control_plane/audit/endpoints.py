"""The audit log's routes (scope ``audit:read``; a key only ever reads its own project's events).

``GET /v1/audit/events`` lists, ``.csv`` and ``.jsonl`` export, ``/types`` names the recent
actions, and the legacy ``GET /v1/audit-events`` keeps working (SPEC.md 9.2).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Final

from aiohttp import web

from common.errors import InvalidRequest, NotFound
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.audit import service
from control_plane.audit.schemas import (
    AuditEvent,
    DeletedStream,
    EventsQuery,
    EventTypes,
    ExportQuery,
    LegacyPage,
    LegacyQuery,
    Stream,
    StreamBody,
    StreamPatch,
    TypesQuery,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page, PageQuery
from control_plane.web.streaming import stream_body, streamed_response

log = logging.getLogger("authio.audit")

routes = RouteTable("audit", "The audit log: every consequential change, by whom, from where.")
AUDIT_READ: Final = auth.ApiKey("audit:read")
_CONTINUATION: Final = {
    "Service-Next-Cursor": "Present when more events remain past the cap: pass it as cursor.",
    "Link": 'The same URL with that cursor, rel="next".',
    "Content-Disposition": "attachment; filename=audit-events-<project>-<time>.<ext>",
}


def _listing(call: Call) -> Listing:
    return service.listing(call.project_id, call.app[CURSOR_SECRET])


@endpoint(routes, "GET", "/v1/audit/events", auth=AUDIT_READ,
          replies=[Reply(200, "A page of events, newest first.", Page[AuditEvent])])
async def get_audit_events(call: Call, query: EventsQuery) -> web.Response:
    """List the project's audit events.

    Filters combine: ``type`` (comma-separated actions), ``user``, ``actor``, ``from``
    (inclusive) and ``to`` (exclusive) ISO 8601 times, and ``q`` (a case-insensitive substring
    of the action, actor id, target id or description). Newest first, keyset-paginated; paging
    while events are written never repeats or skips one."""
    page = await service.list_events(call.pool, _listing(call), query)
    return call.reply(page)


async def _export(call: Call, query: ExportQuery, fmt: service.ExportFormat,
                  content_type: str) -> web.StreamResponse:
    request = call.request
    response = streamed_response(request, content_type,
                                 filename=service.export_filename(call.project_id, fmt))
    async with service.open_export(call.pool, _listing(call), query, fmt) as export:
        if export.next_cursor is not None:
            response.headers["Service-Next-Cursor"] = export.next_cursor
            response.headers["Link"] = (
                f'<{request.rel_url.update_query(cursor=export.next_cursor)}>; rel="next"')
        return await stream_body(request, response, export.chunks, what="audit export",
                                 logger=log)


@endpoint(routes, "GET", "/v1/audit/events.csv", auth=AUDIT_READ, allow_head=False,
          replies=[Reply(200, "RFC 4180 CSV with a header row.", content_type="text/csv",
                         headers=_CONTINUATION)])
async def get_audit_events_csv(call: Call, query: ExportQuery) -> web.StreamResponse:
    """Export the project's audit events as CSV.

    The listing's filters and cursor; at most ``limit`` rows (default and cap 100,000). A cell
    starting with ``=`` ``+`` ``-`` ``@`` TAB or CR is prefixed with ``'`` (OWASP CSV
    injection)."""
    return await _export(call, query, "csv", "text/csv")


@endpoint(routes, "GET", "/v1/audit/events.jsonl", auth=AUDIT_READ, allow_head=False,
          replies=[Reply(200, "One full event (with metadata) per line.",
                         content_type="application/x-ndjson", headers=_CONTINUATION)])
async def get_audit_events_jsonl(call: Call, query: ExportQuery) -> web.StreamResponse:
    """Export the project's audit events as JSON lines.

    The listing's filters and cursor; at most ``limit`` rows (default and cap 100,000)."""
    return await _export(call, query, "jsonl", "application/x-ndjson")


@endpoint(routes, "GET", "/v1/audit/events/types", auth=AUDIT_READ,
          replies=[Reply(200, "The actions, sorted.", EventTypes)])
async def get_audit_event_types(call: Call, query: TypesQuery) -> web.Response:
    """List the distinct actions of the project's events of the last 30 days."""
    types = await service.event_types(call.pool, call.project_id,
                                      now=datetime.now(UTC))
    return call.reply(EventTypes(types))


@endpoint(routes, "GET", "/v1/audit-events", auth=AUDIT_READ,
          replies=[Reply(200, "A page of events, newest first.", LegacyPage)])
async def get_legacy_audit_events(call: Call, query: LegacyQuery) -> web.Response:
    """List audit events the legacy way (SPEC.md 9.2).

    ``before`` (only events strictly older), ``action_prefix`` (a literal prefix of the action)
    and ``limit``; pass ``next_before`` back as ``before``. Events sharing a timestamp are never
    split across pages."""
    page = await service.legacy_events(call.pool, call.project_id, query)
    return call.reply(page)


# --- audit streams -------------------------------------------------------------------------------

STREAMS_WRITE: Final = auth.ApiKey("webhooks:write")
_STREAM: Final = "/v1/audit/streams/{stream_id}"


@endpoint(routes, "POST", "/v1/audit/streams", auth=STREAMS_WRITE, errors=[InvalidRequest],
          replies=[Reply(201, "The stream (a webhook destination's secret shown this once).",
                         Stream)])
async def post_audit_stream(call: Call, body: StreamBody) -> web.Response:
    """Stream the project's audit log to a destination: ``webhook`` (signed JSON batches),
    ``datadog`` (the logs intake) or ``splunk_hec`` (the HTTP Event Collector).

    Every event committed from now on (of ``actions``, when given) is sent in the log's order,
    in batches; the stream's position moves only once the destination acknowledged a batch."""
    async with call.connection() as conn:
        created = await service.create_stream(conn, call.actor, body=body, kms=call.app[KMS],
                                              settings=call.settings)
    return call.reply(created, status=201)


@endpoint(routes, "GET", "/v1/audit/streams", auth=AUDIT_READ, errors=[InvalidRequest],
          replies=[Reply(200, "A page of streams, oldest first.", Page[Stream])])
async def get_audit_streams(call: Call, query: PageQuery) -> web.Response:
    """List the project's audit streams with their status, lag and last error."""
    listing = Listing(service.STREAMS_LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_streams(call.pool, listing, query))


@endpoint(routes, "GET", _STREAM, auth=AUDIT_READ, errors=[NotFound],
          replies=[Reply(200, "The stream.", Stream)])
async def get_audit_stream(call: Call) -> web.Response:
    """Show one stream: its destination (credentials as ``***``), status, lag, last error."""
    return call.reply(await service.describe_stream(call.pool, call.project_id,
                                                    call.path("stream_id")))


@endpoint(routes, "PATCH", _STREAM, auth=STREAMS_WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "The stream as changed.", Stream)])
async def patch_audit_stream(call: Call, body: StreamPatch) -> web.Response:
    """Pause (``status`` ``paused``) or resume (``active``) a stream, or change its ``actions``
    or ``description``. A paused stream resumes where it stopped: nothing is lost."""
    async with call.connection() as conn:
        changed = await service.update_stream(conn, call.actor, stream_id=call.path("stream_id"),
                                              body=body)
    return call.reply(changed)


@endpoint(routes, "DELETE", _STREAM, auth=STREAMS_WRITE, errors=[NotFound],
          replies=[Reply(200, "Deleted: nothing more is sent.", DeletedStream)])
async def delete_audit_stream(call: Call) -> web.Response:
    """Delete a stream."""
    async with call.connection() as conn:
        deleted = await service.remove_stream(conn, call.actor, stream_id=call.path("stream_id"))
    return call.reply(deleted)
