"""One parser per origin provider: the user-export files of Auth0, Firebase, Cognito, Supabase
and Clerk (the standard importer) and Descope (the multi-tenant importer), read into Candidates
(SPEC.md 4 "Import tool"; the formats and their sources: tests/data/imports/FORMATS.md; the skip
rules, their precedence and the decided ambiguities: tests/data/imports/EXPECTED.md).

``detect(provider, path)`` picks the provider's format from the content (gzip-transparent, a UTF-8
BOM dropped, never the file name); ``Format.records(path)`` streams Candidates in file order
(NDJSON and CSV record by record; JSON documents are read whole); ``Deduper`` adds the one rule
that needs the whole file. Pure: no I/O but reading the file, no database.

A record that cannot be understood at all raises ``BadRecord`` (a ValueError with ``index``)
from the iterator's ``__next__``; the same iterator then goes on with the next record, so a run
that catches it around ``next()`` counts it ``errored`` and continues (a ``for`` loop stops).
Any other exception (a JSON document that is not JSON, a file that stops being UTF-8 or gzip
midway) ends the iteration.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

from control_plane.imports.formats import auth0, clerk, cognito, descope, firebase, supabase
from control_plane.imports.formats.base import (
    BadRecord,
    Candidate,
    Format,
    Reader,
    Tenant,
    UnknownFormat,
)
from control_plane.imports.formats.reading import Sample, sample

__all__ = ["PROVIDERS", "BadRecord", "Candidate", "Deduper", "Format", "Tenant", "UnknownFormat",
           "detect", "tenants"]

PROVIDERS: Final = ("auth0", "firebase", "cognito", "supabase", "clerk")  # descope: multi-tenant

_SNIFFERS: Final[dict[str, tuple[str, Callable[[Sample], Reader | None]]]] = {
    module.PROVIDER: (module.REFUSAL, module.sniff)
    for module in (auth0, firebase, cognito, supabase, clerk, descope)
}


def detect(provider: str, path: Path) -> Format:
    """The format of ``provider`` that ``path``'s content is in. UnknownFormat, whose message
    names the formats expected, for another provider's file, an empty file, text in no format,
    a file that is not UTF-8 or not readable gzip, and a provider with no formats; a missing or
    unreadable path raises its OSError."""
    if provider not in _SNIFFERS:
        known = ", ".join(_SNIFFERS)
        raise UnknownFormat(f"no import formats for provider {provider!r}: known are {known}")
    refusal, sniff = _SNIFFERS[provider]
    try:
        seen = sample(path)
    except UnicodeDecodeError as error:
        raise UnknownFormat(f"{refusal} (the file is not UTF-8 text: {error.reason})") from error
    except (OSError, EOFError, zlib.error) as error:
        if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError):
            raise
        raise UnknownFormat(f"{refusal} (the file is not readable: {error})") from error
    if seen.kind == "empty":
        raise UnknownFormat(f"{refusal} (the file is empty)")
    found = sniff(seen)
    if found is None:
        raise UnknownFormat(refusal)
    return found


def tenants(path: Path) -> list[Tenant]:
    """The tenants of a descope export, in file order (SPEC.md 4 rule 6, EXPECTED.md A13)."""
    detect("descope", path)
    return descope.tenants(path)


class Deduper:
    """Rule A1: among eligible candidates, the first occurrence of a lower-cased e-mail wins;
    later ones are 'duplicate'. One per file and run (EXPECTED.md rule 5)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def reason(self, candidate: Candidate) -> str | None:
        """``candidate.skip`` if set; else "duplicate" if its e-mail was seen; else records the
        e-mail and returns None (the candidate is to be created)."""
        if candidate.skip is not None:
            return candidate.skip
        if candidate.email is None:
            return "no_email"
        key = candidate.email.lower()
        if key in self._seen:
            return "duplicate"
        self._seen.add(key)
        return None
