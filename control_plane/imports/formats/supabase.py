"""Supabase, the ``auth.users`` table (FORMATS.md 4): as CSV with a header row (``\\copy ... csv
header``: NULL empty, booleans ``t``/``f``, timestamps ``2024-01-15 10:30:00.123456+00``), as the
JSON array of ``json_agg`` (ISO timestamps, real booleans), or as the Admin API's
``{"users": [...]}``. Columns are found by name, so any subset in any order will do when it has
``id``, ``email`` and ``email_confirmed_at``.

Rules (SPEC.md 4 rule 4, EXPECTED.md, A4, A5): no email -> ``no_email``; ``deleted_at`` set ->
``deleted`` (the email of a soft-deleted row is an obfuscated hash); ``banned_until`` later than
now -> ``banned`` (GoTrue ``IsBanned``: a ban ending exactly now is over); ``email_confirmed_at``
NULL -> ``unverified``. ``encrypted_password`` is never read (SPEC.md 4 rule 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from control_plane.imports.formats.base import (
    Candidate,
    Item,
    Reader,
    candidate,
    display_name,
    email_of,
    id_of,
    items,
    objects,
    skip_reason,
    text_of,
)
from control_plane.imports.formats.reading import Sample, csv_table, header_key, json_array

PROVIDER: Final = "supabase"
REFUSAL: Final = ("not a supabase export: expected the auth.users table as CSV with a header row "
                  "(psql \\copy ... csv header) or as a JSON array (json_agg), or the Admin API's "
                  '{"users": [...]}')

REQUIRED_COLUMNS: Final = frozenset({"id", "email", "email_confirmed_at"})
FAR_FUTURE: Final = datetime.max.replace(tzinfo=UTC)
FAR_PAST: Final = datetime.min.replace(tzinfo=UTC)
_BIG_YEAR = re.compile(r"\d{5,}-")


def timestamp(value: Any) -> datetime | None:
    """A Postgres ``timestamptz`` as text (``2126-10-28 05:32:37.418+00``, ISO with ``T``,
    ``infinity``, years past 9999) in UTC; None for NULL. Unparseable text is a ValueError."""
    text = text_of(value)
    if text is None:
        return None
    lowered = text.lower()
    if lowered == "infinity" or _BIG_YEAR.match(text):
        return FAR_FUTURE
    if lowered == "-infinity" or lowered.endswith(" bc"):
        return FAR_PAST
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise ValueError(f"not a timestamp: {text!r}") from error
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _profile(value: Any) -> Mapping[str, Any]:
    """``raw_user_meta_data`` (an object in JSON, jsonb text in CSV); {} when unreadable."""
    if isinstance(value, str) and value.strip():
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def decide(index: int, row: Mapping[str, Any], now: datetime) -> Candidate:
    """One user row, column name -> value (CSV cells or JSON values)."""
    email = email_of(row.get("email"))
    banned_until = timestamp(row.get("banned_until"))
    disabled = None
    if timestamp(row.get("deleted_at")) is not None:
        disabled = "deleted"
    elif banned_until is not None and banned_until > now:
        disabled = "banned"
    verified = timestamp(row.get("email_confirmed_at")) is not None
    profile = _profile(row.get("raw_user_meta_data", row.get("user_metadata")))
    name = display_name(profile.get("full_name") or profile.get("name"))
    return candidate(PROVIDER, index, id_of(row.get("id")), email, name,
                     skip_reason(email, verified=verified, disabled=disabled))


def _now(now: datetime | None) -> datetime:
    return datetime.now(UTC) if now is None else now


def read_csv(path: Path, now: datetime | None = None) -> Iterator[Item]:
    """The CSV's rows; ``now`` (default: the current time) decides which bans are still on."""
    moment = _now(now)
    return items(csv_table(path), lambda index, raw: decide(index, objects(raw), moment))


def _read_users(key: str | None, what: str) -> Callable[..., Iterator[Item]]:
    def read(path: Path, now: datetime | None = None) -> Iterator[Item]:
        moment = _now(now)
        return items(json_array(path, key, what),
                     lambda index, raw: decide(index, objects(raw), moment))
    return read


read_json = _read_users(None, "a JSON array of auth.users rows")
read_admin = _read_users("users", 'an Admin API {"users": [...]} document')

CSV: Final = Reader(PROVIDER, "supabase auth.users CSV", read_csv)
JSON: Final = Reader(PROVIDER, "supabase auth.users JSON (json_agg)", read_json)
ADMIN: Final = Reader(PROVIDER, "supabase Admin API users JSON", read_admin)


def _user_like(value: Any) -> bool:
    return isinstance(value, dict) and "id" in value and "email_confirmed_at" in value


def sniff(sample: Sample) -> Reader | None:
    """The supabase layout of a sampled file, or None."""
    if sample.kind == "array":
        return JSON if sample.first is None or _user_like(sample.first) else None
    if sample.kind == "object":
        return ADMIN if sample.key == "users" and _user_like(sample.first) else None
    if sample.kind == "text" and sample.rows:
        return CSV if REQUIRED_COLUMNS <= {header_key(c) for c in sample.rows[0]} else None
    return None
