"""AWS Cognito user pools (FORMATS.md 3): ``aws cognito-idp list-users`` output
``{"Users": [UserType...]}`` (timestamps as epoch seconds or ISO-8601, never read), and the CSV of
a ListUsers exporter whose header names attributes and UserType fields (``Username``, ``sub``,
``email``, ``email_verified``, ``Enabled`` as ``True``/``False``, ``UserStatus``, ...).

Rules (SPEC.md 4 rule 4, EXPECTED.md, A3, A4): no ``email`` attribute -> ``no_email``;
``Enabled: false`` -> ``disabled``; ``UserStatus`` not CONFIRMED or EXTERNAL_PROVIDER ->
``status``; the ``email_verified`` attribute not ``"true"`` -> ``unverified`` (federated users
included). A file without an ``Enabled`` or ``UserStatus`` value says nothing about it, and that
rule does not apply to the record. Cognito never exports password material.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
    text_of,
)
from control_plane.imports.formats.reading import Sample, csv_table, header_key, json_array

PROVIDER: Final = "cognito"
REFUSAL: Final = ('not a cognito export: expected `aws cognito-idp list-users` JSON {"Users": [...]} '
                  "or a CSV whose header names attributes and UserType fields (Username or sub, "
                  "email, email_verified, Enabled, UserStatus)")

ELIGIBLE_STATUSES: Final = frozenset({"CONFIRMED", "EXTERNAL_PROVIDER"})
FALSE_WORDS: Final = frozenset({"false", "f", "0"})
USER_TYPE_COLUMNS: Final = frozenset({"userstatus", "enabled", "sub", "usercreatedate", "userlastmodifieddate"})
FOREIGN_COLUMNS: Final = frozenset({"user_id", "instance_id", "primary_email_address", "localid"})


def _explicitly_false(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in FALSE_WORDS)


def decide(index: int, origin_id: str | None, attributes: Mapping[str, Any], enabled: Any,
           status: Any) -> Candidate:
    """A candidate from a user's attributes, its Enabled flag and its UserStatus."""
    email = email_of(attributes.get("email"))
    disabled = "disabled" if _explicitly_false(enabled) else None
    state = text_of(status)
    skip = skip_reason(email, verified=flag(attributes.get("email_verified")), disabled=disabled,
                       status=state is not None and state.upper() not in ELIGIBLE_STATUSES)
    name = display_name(attributes.get("name"), attributes.get("given_name"), attributes.get("family_name"))
    return candidate(PROVIDER, index, origin_id, email, name, skip)


def convert(index: int, raw: Any) -> Candidate:
    """One UserType object: ``Attributes`` is a list of {Name, Value} with string values."""
    user = objects(raw)
    listed = user.get("Attributes", user.get("UserAttributes")) or []
    if not isinstance(listed, list):
        raise ValueError("Attributes is not a list")
    attributes = {a["Name"]: a.get("Value") for a in listed if isinstance(a, dict) and isinstance(a.get("Name"), str)}
    origin_id = id_of(user.get("Username")) or id_of(attributes.get("sub"))
    return decide(index, origin_id, attributes, user.get("Enabled"), user.get("UserStatus"))


def convert_row(index: int, raw: Any) -> Candidate:
    """One exporter row: {lower-cased column: cell}; attribute names are lower case already."""
    row: dict[str, str] = objects(raw)
    origin_id = id_of(row.get("username")) or id_of(row.get("sub"))
    return decide(index, origin_id, row, row.get("enabled"), row.get("userstatus"))


def read_json(path: Path) -> Iterator[Item]:
    return items(json_array(path, "Users", 'a list-users JSON document: no "Users" array'),
                 convert)


def read_csv(path: Path) -> Iterator[Item]:
    return items(csv_table(path), convert_row)


JSON: Final = Reader(PROVIDER, "cognito list-users JSON", read_json)
CSV: Final = Reader(PROVIDER, "cognito ListUsers exporter CSV", read_csv)


def sniff(sample: Sample) -> Reader | None:
    """The cognito layout of a sampled file, or None."""
    if sample.kind == "object":
        first = sample.first
        if sample.key == "Users" and (first is None or (isinstance(first, dict) and "Username" in first)):
            return JSON
        return None
    if sample.kind == "text" and sample.rows:
        header = {header_key(c) for c in sample.rows[0]}
        if "email" in header and header & USER_TYPE_COLUMNS and not header & FOREIGN_COLUMNS:
            return CSV
    return None
