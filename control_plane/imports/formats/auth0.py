"""Auth0 (FORMATS.md 1a, 1c): the bulk user-export job as NDJSON or as CSV (strings OWASP-escaped
as ``"'value"``; a plain CSV without the prefix too), and the bulk-import JSON array.

A record: ``user_id`` (the CSV's Dashboard label ``Id`` too), ``email``, ``email_verified``,
``blocked``, ``name`` or ``given_name`` + ``family_name``. Rules (SPEC.md 4 rule 4, EXPECTED.md):
no email -> ``no_email``; ``blocked: true`` -> ``blocked``; ``email_verified`` not true (omitted
is false, the import schema's default, A2) -> ``unverified``. ``password_hash`` and
``custom_password_hash`` are never read (SPEC.md 4 rule 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from control_plane.imports.formats.base import (
    Candidate,
    Item,
    Reader,
    candidate,
    display_name,
    email_of,
    flag,
    id_of,
    items,
    objects,
    skip_reason,
)
from control_plane.imports.formats.reading import Sample, csv_table, header_key, json_array, json_lines

PROVIDER: Final = "auth0"
REFUSAL: Final = ("not an auth0 export: expected an Auth0 bulk export (NDJSON or CSV) or a "
                  "bulk-import JSON array")

# Keys an Auth0 user record may carry (export field names and the import schema's properties).
RECORD_KEYS: Final = frozenset({
    "user_id", "email", "email_verified", "blocked", "username", "phone_number", "phone_verified",
    "name", "given_name", "family_name", "nickname", "picture", "identities", "app_metadata",
    "user_metadata", "created_at", "updated_at", "last_login", "last_ip", "logins_count",
    "multifactor", "password_hash", "custom_password_hash", "mfa_factors",
})
# Keys that say the record is another provider's (or Auth0's password-hash dump, FORMATS.md 1b).
FOREIGN_KEYS: Final = frozenset({
    "localId", "emailVerified", "passwordHash", "_id", "Username", "Attributes", "UserStatus",
    "instance_id", "aud", "email_confirmed_at", "encrypted_password", "email_addresses",
    "primary_email_address_id", "object", "userId", "loginIds", "verifiedEmail",
})
FOREIGN_COLUMNS: Final = frozenset({
    "instance_id", "encrypted_password", "email_confirmed_at", "userstatus", "enabled", "sub",
    "primary_email_address", "verified_email_addresses",
})


def convert(index: int, raw: Any) -> Candidate:
    """One user object of any Auth0 layout (CSV rows arrive as {column: cell})."""
    record = objects(raw)
    origin_id = id_of(record["user_id"] if "user_id" in record else record.get("id"))
    email = email_of(record.get("email"))
    blocked = "blocked" if flag(record.get("blocked")) else None
    skip = skip_reason(email, verified=flag(record.get("email_verified")), disabled=blocked)
    name = display_name(record.get("name"), record.get("given_name"), record.get("family_name"))
    return candidate(PROVIDER, index, origin_id, email, name, skip)


def unescape(cell: str) -> str:
    """An OWASP-escaped CSV string without its ``'`` prefix (FORMATS.md 1a)."""
    return cell[1:] if cell.startswith("'") else cell


def read_ndjson(path: Path) -> Iterator[Item]:
    return items(json_lines(path), convert)


def read_csv_escaped(path: Path) -> Iterator[Item]:
    return items(csv_table(path, unescape), convert)


def read_csv_plain(path: Path) -> Iterator[Item]:
    return items(csv_table(path), convert)


def read_array(path: Path) -> Iterator[Item]:
    return items(json_array(path, None, "a JSON array of users"), convert)


NDJSON: Final = Reader(PROVIDER, "auth0 bulk export (NDJSON)", read_ndjson)
CSV_ESCAPED: Final = Reader(PROVIDER, "auth0 bulk export (CSV)", read_csv_escaped)
CSV_PLAIN: Final = Reader(PROVIDER, "auth0 CSV export (plain, no ' prefix)", read_csv_plain)
ARRAY: Final = Reader(PROVIDER, "auth0 bulk-import JSON array", read_array)


def _record_like(value: Any) -> bool:
    return isinstance(value, dict) and bool(RECORD_KEYS & value.keys()) and not FOREIGN_KEYS & value.keys()


def sniff(sample: Sample) -> Reader | None:
    """The Auth0 layout of a sampled file, or None."""
    if sample.kind == "lines":
        return NDJSON if _record_like(sample.first) else None
    if sample.kind == "array":
        return ARRAY if sample.first is None or _record_like(sample.first) else None
    if sample.kind == "text" and sample.rows:
        header = [header_key(c) for c in sample.rows[0]]
        if "email" not in header or not {"user_id", "id"} & set(header) or FOREIGN_COLUMNS & set(header):
            return None
        # Escaped when the first row's id or email (strings in every export) carries the prefix.
        first = dict(zip(header, sample.rows[1], strict=False)) if len(sample.rows) > 1 else {}
        ids = (first.get("user_id") or first.get("id") or "", first.get("email") or "")
        return CSV_ESCAPED if any(c.startswith("'") for c in ids) else CSV_PLAIN
    return None
