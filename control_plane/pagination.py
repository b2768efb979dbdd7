"""Keyset pagination for list endpoints (DESIGN.md "lists"), with tamper-evident cursors.

Query ``limit`` (default 50, 1..1000, else ``invalid_request``) and ``cursor``; body
``{"data": [...], "next_cursor": <opaque> | null, "has_more": bool}``.

A cursor is the sort key of the last row returned, bound to the listing and the project it came
from and signed: ``base64url(payload) "." base64url(mac)``, where ``payload`` is the JSON array
``[kind, project_id, *key]`` and ``mac`` the first 16 bytes of HMAC-SHA256 over a domain tag and
``payload`` with the deployment's ``cursor_hmac`` secret. The secret lives in PostgreSQL
(``service_secrets``), created by whichever process starts first, so every process and every
restart accepts the cursors of the others. A cursor that was forged or edited, or that another
listing (``kind``: the table, or ``tuples:<store_id>``), another project or another deployment
issued, is ``invalid_request`` naming ``cursor``. Cursors never expire: they hold a position, not
a permission (the key presented with them is authenticated on every request).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import orjson

from common.errors import InvalidRequest

_LIMIT_RE: Final = re.compile(r"[0-9]{1,7}")  # ASCII digits: str.isdigit() also takes "²"
_CURSOR_RE: Final = re.compile(r"([A-Za-z0-9_-]{1,2048})\.([A-Za-z0-9_-]{22})")
_MAC_BYTES: Final = 16
_DOMAIN: Final = b"authio/cursor/v1\x00"
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 1000
CURSOR_SECRET_NAME: Final = "cursor_hmac"


@dataclass(frozen=True, slots=True)
class Page:
    """A parsed page request: ``limit`` rows after the key ``after`` (None for the first page)."""

    limit: int
    after: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class Listing:
    """What a cursor is bound to: the listing ``kind``, the caller's project and the
    deployment's signing ``secret``."""

    kind: str
    project_id: str
    secret: bytes

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self.secret, _DOMAIN + payload, hashlib.sha256).digest()[:_MAC_BYTES]

    def encode(self, key: Sequence[str]) -> str:
        """The opaque, signed cursor for the row whose sort key is ``key``."""
        payload = orjson.dumps([self.kind, self.project_id, *key])
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def decode(self, cursor: str, *, key_len: int) -> tuple[str, ...]:
        """The key inside ``cursor``. Raises InvalidRequest unless this listing issued it for
        this project with this deployment's secret, holding ``key_len`` strings."""
        m = _CURSOR_RE.fullmatch(cursor)
        if m is None:
            raise _bad_cursor()
        try:
            payload, mac = _unb64(m.group(1)), _unb64(m.group(2))
        except (binascii.Error, ValueError):
            raise _bad_cursor() from None
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise _bad_cursor()
        try:
            decoded = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise _bad_cursor() from None
        # Signed by us, so well formed; checked again all the same (a change of format, a bug).
        if (
            not isinstance(decoded, list) or len(decoded) != key_len + 2
            or decoded[0] != self.kind or decoded[1] != self.project_id
            or not all(isinstance(v, str) and "\x00" not in v for v in decoded[2:])
        ):
            raise _bad_cursor()
        return tuple(decoded[2:])


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _bad_cursor() -> InvalidRequest:
    return InvalidRequest.field("cursor", "is not a cursor this listing issued")


def parse_limit(query: Mapping[str, str], *, default: int = DEFAULT_LIMIT,
                maximum: int = MAX_LIMIT) -> int:
    """``limit`` from ``query`` (ASCII digits, 1 to ``maximum``), else ``default``.
    Raises InvalidRequest."""
    raw = query.get("limit")
    if raw is None:
        return default
    if not _LIMIT_RE.fullmatch(raw) or not 1 <= int(raw) <= maximum:
        raise InvalidRequest.field("limit", f"must be an integer from 1 to {maximum}")
    return int(raw)


def parse_page(query: Mapping[str, str], listing: Listing, *, key_len: int) -> Page:
    """Read ``limit`` and ``cursor`` from ``query``; the cursor must be one ``listing`` issued.
    Raises InvalidRequest for a bad limit or cursor."""
    limit = parse_limit(query)
    cursor = query.get("cursor")
    if not cursor:  # absent or empty: the first page
        return Page(limit, None)
    return Page(limit, listing.decode(cursor, key_len=key_len))


def page_body(
    rows: Sequence[Mapping[str, Any]], page: Page, listing: Listing, *, key: Sequence[str],
) -> dict[str, Any]:
    """The list body from up to ``limit + 1`` fetched rows (the extra row says there is more)."""
    has_more = len(rows) > page.limit
    data = list(rows[: page.limit])
    next_cursor = (
        listing.encode([str(data[-1][k]) for k in key]) if has_more and data else None
    )
    return {"data": data, "next_cursor": next_cursor, "has_more": has_more}


async def project_page_by_id(
    pool: asyncpg.Pool, query: Mapping[str, str], *, table: str, columns: str, project_id: str,
    secret: bytes, kind: str | None = None, id_column: str = "id", alias: str | None = None,
    where: str | None = None, args: Sequence[Any] = (),
) -> dict[str, Any]:
    """One page of the rows of ``table`` in ``project_id``, in ``id_column`` order (ids are
    ULIDs, so that is creation order). Raises InvalidRequest for a bad limit or cursor.

    * ``kind`` names the listing the cursor is bound to (default ``table``): give each listing
      its own (``memberships:<org_id>``), so a cursor of one is refused by the others.
    * ``table`` is the ``FROM`` clause (it may join other tables, then ``alias`` names the
      listed table: its ``project_id`` and ``id_column`` are qualified with it).
    * ``where`` is an extra condition ANDed to the project's, its parameters ``args`` numbered
      from ``$2`` (``$1`` is the project).
    * ``id_column`` is the key: the output column the cursor holds, ``id`` or ``kid``.

    ``table``, ``columns``, ``id_column``, ``alias`` and ``where`` are constants of the caller,
    never user input (values go in ``args``).
    """
    listing = Listing(kind or table, project_id, secret)
    page = parse_page(query, listing, key_len=1)
    prefix = f"{alias}." if alias else ""
    n = len(args)
    condition = f" AND ({where})" if where else ""
    rows = await pool.fetch(
        f"""SELECT {columns} FROM {table}
            WHERE {prefix}project_id = $1{condition}
              AND (${n + 2}::text IS NULL OR {prefix}{id_column} > ${n + 2})
            ORDER BY {prefix}{id_column} LIMIT ${n + 3}::int""",
        project_id, *args, page.after[0] if page.after else None, page.limit + 1,
    )
    return page_body([dict(r) for r in rows], page, listing, key=[id_column])


async def load_cursor_secret(pool: asyncpg.Pool) -> bytes:
    """The deployment's cursor-signing secret, created (32 random bytes) by the first process
    that asks; concurrent first starts agree on one value."""
    await pool.execute(
        "INSERT INTO service_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        CURSOR_SECRET_NAME, secrets.token_bytes(32),
    )
    # A separate statement: its snapshot sees a row another process committed meanwhile.
    value = await pool.fetchval("SELECT value FROM service_secrets WHERE name = $1",
                                CURSOR_SECRET_NAME)
    assert isinstance(value, bytes) and len(value) >= 32
    return value
