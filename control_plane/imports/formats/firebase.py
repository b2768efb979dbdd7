"""Firebase Authentication, ``firebase auth:export`` (FORMATS.md 2): the JSON document
``{"users": [...]}`` and the header-less CSV of 28 columns (older firebase-tools) or 52 columns
(firebase-tools >= 15.19), each line ending with an extra comma.

A record: ``localId``, ``email``, ``emailVerified``, ``disabled``, ``displayName`` (CSV columns 0,
1, 2, 26, 5). Rules (SPEC.md 4 rule 4, EXPECTED.md): no email -> ``no_email``; ``disabled: true``
-> ``disabled``; ``emailVerified`` not true (absent is false, A2) -> ``unverified``.
``passwordHash`` and ``salt`` (CSV columns 3, 4) are never read (SPEC.md 4 rule 2).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
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
from control_plane.imports.formats.reading import Sample, csv_rows, json_array

PROVIDER: Final = "firebase"
REFUSAL: Final = ("not a firebase export: expected a `firebase auth:export` file: JSON "
                  '{"users": [...]} or a header-less CSV of 28 or 52 columns')

LOCAL_ID, EMAIL, EMAIL_VERIFIED, DISPLAY_NAME, DISABLED = 0, 1, 2, 5, 26
BOOLEAN_CELLS: Final = frozenset({"true", "false", ""})


def convert(index: int, raw: Any) -> Candidate:
    """One user object of the JSON export."""
    user = objects(raw)
    email = email_of(user.get("email"))
    disabled = "disabled" if flag(user.get("disabled")) else None
    skip = skip_reason(email, verified=flag(user.get("emailVerified")), disabled=disabled)
    return candidate(PROVIDER, index, id_of(user.get("localId")), email,
                     display_name(user.get("displayName")), skip)


def read_json(path: Path) -> Iterator[Item]:
    return items(json_array(path, "users",
                            'a firebase auth:export JSON document: no "users" array'), convert)


def _fits(cells: list[str], columns: int) -> bool:
    """The row has ``columns`` cells, plus the empty one after the trailing comma."""
    return len(cells) == columns or (len(cells) == columns + 1 and not cells[-1].strip())


def _row(columns: int) -> Callable[[int, Any], Candidate]:
    def convert_row(index: int, cells: Any) -> Candidate:
        if isinstance(cells, csv.Error):
            raise ValueError(f"not CSV: {cells}")
        if not _fits(cells, columns):
            raise ValueError(f"{len(cells)} fields where this export has {columns} columns and a trailing comma")
        if cells[EMAIL_VERIFIED].strip() not in BOOLEAN_CELLS or cells[DISABLED].strip() not in BOOLEAN_CELLS:
            raise ValueError("emailVerified (column 3) or disabled (column 27) is not true/false")
        email = email_of(cells[EMAIL])
        disabled = "disabled" if flag(cells[DISABLED]) else None
        skip = skip_reason(email, verified=flag(cells[EMAIL_VERIFIED]), disabled=disabled)
        return candidate(PROVIDER, index, id_of(cells[LOCAL_ID]), email, display_name(cells[DISPLAY_NAME]), skip)
    return convert_row


def _reader(columns: int) -> Reader:
    def read_csv(path: Path) -> Iterator[Item]:
        rows = ((i, f"line {line}", cells) for i, (line, cells) in enumerate(csv_rows(path)))
        return items(rows, _row(columns))
    return Reader(PROVIDER, f"firebase auth:export CSV ({columns} columns)", read_csv)


JSON: Final = Reader(PROVIDER, "firebase auth:export JSON", read_json)
CSV_LEGACY: Final = _reader(28)
CSV_CURRENT: Final = _reader(52)


def sniff(sample: Sample) -> Reader | None:
    """The firebase layout of a sampled file, or None."""
    if sample.kind == "object":
        first = sample.first
        user_like = first is None or (isinstance(first, dict) and "localId" in first)
        return JSON if sample.key == "users" and user_like else None
    if sample.kind != "text" or not sample.rows:
        return None
    first = sample.rows[0]
    for reader, columns in ((CSV_LEGACY, 28), (CSV_CURRENT, 52)):
        if (_fits(first, columns) and first[EMAIL_VERIFIED].strip() in ("true", "false")
                and first[DISABLED].strip() in BOOLEAN_CELLS):
            return reader
    return None
