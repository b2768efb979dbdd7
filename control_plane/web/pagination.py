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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Generic, TypeVar

import asyncpg
import orjson
from pydantic import BeforeValidator, Field, WithJsonSchema

from common.db import Params
from common.errors import InvalidRequest
from common.schemas import QueryModel

T = TypeVar("T")

_LIMIT_RE: Final = re.compile(r"[0-9]{1,7}")  # ASCII digits: str.isdigit() also takes "²"
_CURSOR_RE: Final = re.compile(r"([A-Za-z0-9_-]{1,2048})\.([A-Za-z0-9_-]{22})")
_MAC_BYTES: Final = 16
_DOMAIN: Final = b"authio/cursor/v1\x00"
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 1000
CURSOR_SECRET_NAME: Final = "cursor_hmac"


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


def _limit_check(maximum: int) -> BeforeValidator:
    def check(raw: object) -> int:
        if not isinstance(raw, str) or not _LIMIT_RE.fullmatch(raw) or not 1 <= int(raw) <= maximum:
            raise ValueError(f"must be an integer from 1 to {maximum}")
        return int(raw)

    return BeforeValidator(check)


def _limit_schema(maximum: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "integer", "minimum": 1, "maximum": maximum,
                           "description": f"Page size: 1 to {maximum}."})


Limit = Annotated[int, _limit_check(MAX_LIMIT), _limit_schema(MAX_LIMIT)]
"""The ``limit`` query parameter of a listing: ASCII digits, 1 to 1000."""


def limit_type(maximum: int) -> Any:
    """A ``limit`` query parameter type of its own ``maximum`` (exports, the mailbox); annotate
    with it as ``limit: limit_type(N) = N  # type: ignore[valid-type]``."""
    return Annotated[int, _limit_check(maximum), _limit_schema(maximum)]


def _cursor(raw: object) -> str | None:
    return raw if isinstance(raw, str) and raw else None  # empty: the first page


Cursor = Annotated[str | None, BeforeValidator(_cursor), Field(
    description="The next_cursor of the previous page; absent or empty for the first page.")]


class PageQuery(QueryModel):
    """The query of a listing: ``limit`` (default 50) and ``cursor``."""

    limit: Limit = DEFAULT_LIMIT
    cursor: Cursor = None


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page starts: ``limit`` rows after the key ``after`` (None: the first page)."""

    limit: int
    after: tuple[str, ...] | None


def position(query: PageQuery, listing: Listing, *, key_len: int) -> Position:
    """The position ``query`` asks for; its cursor must be one ``listing`` issued.
    Raises InvalidRequest naming ``cursor``."""
    after = listing.decode(query.cursor, key_len=key_len) if query.cursor else None
    return Position(query.limit, after)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """A page of a listing (DESIGN.md "lists"): ``data``, then ``next_cursor`` (to pass back as
    ``cursor``; null on the last page) and ``has_more``."""

    data: list[T]
    next_cursor: str | None
    has_more: bool


def page_of(rows: Sequence[Any], at: Position, listing: Listing, *,
            key: Callable[[Any], Sequence[str]]) -> Page[Any]:
    """The page from up to ``limit + 1`` fetched ``rows`` (the extra row says there is more);
    ``key`` gives a row's sort key, which the next cursor holds."""
    has_more = len(rows) > at.limit
    data = list(rows[: at.limit])
    next_cursor = listing.encode(key(data[-1])) if has_more and data else None
    return Page(data, next_cursor, has_more)


async def page_by_id(
    conn: asyncpg.Connection | asyncpg.Pool, listing: Listing, query: PageQuery, *, table: str,
    columns: str, row: Callable[[asyncpg.Record], T], id_column: str = "id",
    alias: str | None = None, where: Callable[[Params], str] | None = None,
) -> Page[T]:
    """One page of the rows of ``table`` in ``listing.project_id``, in ``id_column`` order (ids
    are ULIDs, so that is creation order), each made into ``row(record)``. Raises InvalidRequest
    for a cursor ``listing`` did not issue.

    * ``listing.kind`` binds the cursor: give each listing its own (``memberships:<org_id>``),
      so a cursor of one is refused by the others.
    * ``table`` is the ``FROM`` clause (it may join other tables, then ``alias`` names the
      listed table: its ``project_id`` and ``id_column`` are qualified with it).
    * ``where`` gives an extra condition ANDed to the project's, its values placed with the
      statement's ``Params`` (``lambda p: f"organization_id = {p(org_id)}"``).
    * ``id_column`` is the key: the output column the cursor holds, ``id`` or ``kid``.

    ``table``, ``columns``, ``id_column`` and ``alias`` are constants of the caller, never user
    input.
    """
    at = position(query, listing, key_len=1)
    prefix = f"{alias}." if alias else ""
    p = Params()
    conds = [f"{prefix}project_id = {p(listing.project_id)}"]
    if where is not None:
        conds.append(f"({where(p)})")
    if at.after is not None:
        conds.append(f"{prefix}{id_column} > {p(at.after[0])}")
    rows = await conn.fetch(
        f"""SELECT {columns} FROM {table} WHERE {' AND '.join(conds)}
            ORDER BY {prefix}{id_column} LIMIT {p(at.limit + 1)}::int""",
        *p.values,
    )
    return page_of([row(r) for r in rows], at, listing,
                   key=lambda item: [str(getattr(item, id_column))])


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


def listing_condition(p: Params, equal: Mapping[str, object | None], *,
                      overdue: bool | None = None, overdue_when: str = "FALSE") -> str:
    """A listing's filters for ``page_by_id``'s ``where`` (``TRUE`` for none): each column of
    ``equal`` (the caller's constant names, never input) equal to its value where one is given;
    with ``overdue``, only the rows for which ``overdue_when`` (a condition of the caller's, such
    as compliance's ``DSR_OVERDUE``) holds, or fails."""
    conds = ["TRUE", *(f"{column} = {p(value)}" for column, value in equal.items()
                       if value is not None)]
    if overdue is not None:
        conds.append(f"{'' if overdue else 'NOT '}{overdue_when}")
    return " AND ".join(conds)
