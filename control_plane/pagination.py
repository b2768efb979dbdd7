"""Keyset pagination for list endpoints (DESIGN.md "lists").

Query ``limit`` (default 50, 1..1000, else ``invalid_request``) and ``cursor``; body
``{"data": [...], "next_cursor": <opaque> | null, "has_more": bool}``. A cursor is the sort key of
the last row returned, base64url-encoded JSON tagged with the listing it belongs to, so a cursor
from another listing or a garbled one is ``invalid_request``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import orjson

from common.errors import InvalidRequest

_LIMIT_RE: Final = re.compile(r"[0-9]{1,7}")  # ASCII digits: str.isdigit() also takes "²"
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class Page:
    """A parsed page request: ``limit`` rows after the key ``after`` (None for the first page)."""

    limit: int
    after: tuple[str, ...] | None


def parse_page(query: Mapping[str, str], *, kind: str, key_len: int) -> Page:
    """Read ``limit`` and ``cursor`` from ``query``; ``kind`` names the listing the cursor must
    belong to. Raises InvalidRequest for a bad limit or cursor."""
    raw_limit = query.get("limit")
    limit = DEFAULT_LIMIT
    if raw_limit is not None:
        if not _LIMIT_RE.fullmatch(raw_limit) or not 1 <= int(raw_limit) <= MAX_LIMIT:
            raise InvalidRequest.field("limit", f"must be an integer from 1 to {MAX_LIMIT}")
        limit = int(raw_limit)
    cursor = query.get("cursor")
    if not cursor:
        return Page(limit, None)
    try:
        decoded = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise InvalidRequest.field("cursor", "is not a cursor this listing issued") from None
    if (
        not isinstance(decoded, list) or len(decoded) != key_len + 1 or decoded[0] != kind
        or not all(isinstance(v, str) and "\x00" not in v for v in decoded[1:])
    ):
        raise InvalidRequest.field("cursor", "is not a cursor this listing issued")
    return Page(limit, tuple(decoded[1:]))


def encode_cursor(kind: str, key: Sequence[Any]) -> str:
    """The opaque cursor for the row whose sort key is ``key``."""
    return base64.urlsafe_b64encode(orjson.dumps([kind, *key])).decode().rstrip("=")


def page_body(
    rows: Sequence[Mapping[str, Any]], page: Page, *, kind: str, key: Sequence[str],
) -> dict[str, Any]:
    """The list body from up to ``limit + 1`` fetched rows (the extra row says there is more)."""
    has_more = len(rows) > page.limit
    data = list(rows[: page.limit])
    next_cursor = encode_cursor(kind, [data[-1][k] for k in key]) if has_more and data else None
    return {"data": data, "next_cursor": next_cursor, "has_more": has_more}


async def project_page_by_id(
    pool: asyncpg.Pool, query: Mapping[str, str], *, table: str, columns: str, project_id: str,
) -> dict[str, Any]:
    """One page of ``table``'s rows of ``project_id`` in id order (ids are ULIDs, so that is
    creation order); the cursor is bound to ``table``. Raises InvalidRequest for a bad limit or
    cursor. ``table`` and ``columns`` are constants of the caller, never user input."""
    page = parse_page(query, kind=table, key_len=1)
    rows = await pool.fetch(
        f"""SELECT {columns} FROM {table} WHERE project_id = $1 AND ($2::text IS NULL OR id > $2)
            ORDER BY id LIMIT $3""",
        project_id, page.after[0] if page.after else None, page.limit + 1,
    )
    return page_body([dict(r) for r in rows], page, kind=table, key=["id"])
