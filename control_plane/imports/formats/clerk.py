"""Clerk (FORMATS.md 5): the Dashboard "Export users" CSV (``id, first_name, last_name,
primary_email_address, verified_email_addresses, ...``; several addresses in a cell separated by
``|``) and the Backend API ``GET /v1/users`` JSON array of User objects.

Rules (SPEC.md 4 rule 4, EXPECTED.md, A6): no primary email -> ``no_email``; ``banned`` ->
``banned``, ``locked`` -> ``locked`` (API only: the CSV cannot say, so such users pass, A6); the
primary address not verified (CSV: not listed in ``verified_email_addresses``; API: its
``verification.status`` is not ``verified``) -> ``unverified``. ``password_digest``,
``password_hasher`` and ``totp_secret`` are never read (SPEC.md 4 rule 2).
"""

from __future__ import annotations

import re
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
from control_plane.imports.formats.reading import Sample, csv_table, header_key, json_array

PROVIDER: Final = "clerk"
REFUSAL: Final = ("not a clerk export: expected the Dashboard 'Export users' CSV or a Backend API "
                  "GET /v1/users JSON array")

REQUIRED_COLUMNS: Final = frozenset({"id", "primary_email_address"})
_SEPARATORS = re.compile(r"[|,]")


def convert_row(index: int, raw: Any) -> Candidate:
    """One Dashboard CSV row: verified <=> the primary address is listed as verified."""
    row: dict[str, str] = objects(raw)
    email = email_of(row.get("primary_email_address"))
    listed = {a.strip().lower() for a in _SEPARATORS.split(row.get("verified_email_addresses") or "")}
    verified = email is not None and email.lower() in listed
    name = display_name(None, row.get("first_name"), row.get("last_name"))
    return candidate(PROVIDER, index, id_of(row.get("id")), email, name, skip_reason(email, verified=verified))


def _primary(user: dict[str, Any]) -> Any:
    """The primary EmailAddress object (the first one when none is named primary), or None."""
    addresses = user.get("email_addresses") or []
    if not isinstance(addresses, list):
        raise ValueError("email_addresses is not a list")
    addresses = [a for a in addresses if isinstance(a, dict)]
    primary_id = user.get("primary_email_address_id")
    for address in addresses:
        if primary_id is not None and address.get("id") == primary_id:
            return address
    return addresses[0] if addresses and primary_id is None else None


def convert(index: int, raw: Any) -> Candidate:
    """One Backend API User object."""
    user = objects(raw)
    primary = _primary(user)
    email = email_of(primary.get("email_address")) if primary else None
    verification = primary.get("verification") if primary else None
    verified = isinstance(verification, dict) and verification.get("status") == "verified"
    disabled = "banned" if flag(user.get("banned")) else "locked" if flag(user.get("locked")) else None
    name = display_name(None, user.get("first_name"), user.get("last_name"))
    return candidate(PROVIDER, index, id_of(user.get("id")), email, name,
                     skip_reason(email, verified=verified, disabled=disabled))


def read_csv(path: Path) -> Iterator[Item]:
    return items(csv_table(path), convert_row)


def read_json(path: Path) -> Iterator[Item]:
    return items(json_array(path, None, "a JSON array of Clerk users"), convert)


CSV: Final = Reader(PROVIDER, "clerk Dashboard CSV", read_csv)
JSON: Final = Reader(PROVIDER, "clerk Backend API JSON", read_json)


def sniff(sample: Sample) -> Reader | None:
    """The clerk layout of a sampled file, or None."""
    if sample.kind == "array":
        first = sample.first
        user_like = isinstance(first, dict) and (first.get("object") == "user"
                                                  or isinstance(first.get("email_addresses"), list))
        return JSON if first is None or user_like else None
    if sample.kind == "text" and sample.rows:
        return CSV if REQUIRED_COLUMNS <= {header_key(c) for c in sample.rows[0]} else None
    return None
