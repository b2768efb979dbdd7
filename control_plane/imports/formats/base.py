"""The shapes every origin parser returns (Candidate, Tenant, Format and its errors) and the
value rules they share: flags, e-mails, names, and the skip-rule precedence
(tests/data/imports/EXPECTED.md "Rules applied", ambiguity A4). The file readers are in
``reading``.

Provider modules import from here and never from the package itself, so the package can import
them without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

NAME_MAX: Final = 200


@dataclass(frozen=True, slots=True)
class Candidate:
    """One record of an export, as the import run needs it (SPEC.md 4 "Import tool").

    ``skip`` is None for an eligible record, else one of ``no_email``, ``blocked``, ``disabled``,
    ``banned``, ``locked``, ``deleted``, ``status``, ``unverified``; ``duplicate`` is decided by
    ``Deduper`` over the whole file. ``metadata`` is ``{"import": {"provider", "id"}}`` (plus
    ``custom`` for descope, rule 6) and never holds password material (rule 2).
    """

    index: int
    origin_id: str | None
    email: str | None
    name: str
    skip: str | None
    metadata: dict[str, Any]
    memberships: tuple[tuple[str, str], ...] = ()
    oauth_providers: tuple[str, ...] = ()
    totp_enrolled: bool = False


@dataclass(frozen=True, slots=True)
class Tenant:
    """A descope tenant: one organization of the multi-tenant importer (SPEC.md 4 rule 6)."""

    id: str
    name: str
    self_provisioning_domains: tuple[str, ...]


class UnknownFormat(ValueError):
    """The file is in none of the provider's formats; the message names what was expected."""


class BadRecord(ValueError):
    """One record that cannot be understood at all. ``index`` is its 0-based position (the
    cursor's unit); the message names it with the 1-based line or element for humans. Raised by
    the iterator of ``Format.records``, which goes on with the next record when asked again."""

    def __init__(self, index: int, where: str, why: str) -> None:
        super().__init__(f"record {index} ({where}): {why}")
        self.index = index


class Format(Protocol):
    """One file layout of one origin provider."""

    provider: str
    name: str

    def records(self, path: Path) -> Iterator[Candidate]:
        """The file's records in order, ``index`` 0, 1, ...; a malformed one raises BadRecord."""
        ...


Item = Candidate | BadRecord


class Records(Iterator[Candidate]):
    """An iterator over a parser's items that raises each BadRecord from ``__next__`` and stays
    usable after it (a generator would be finished), so a run can count it and go on."""

    def __init__(self, items: Iterator[Item]) -> None:
        self._items = items

    def __iter__(self) -> Records:
        return self

    def __next__(self) -> Candidate:
        item = next(self._items)
        if isinstance(item, BadRecord):
            raise item
        return item


@dataclass(slots=True)
class Reader:
    """A Format: the provider, a human name of the layout, and the parser that reads it."""

    provider: str
    name: str
    parse: Callable[[Path], Iterator[Item]] = field(repr=False)

    def records(self, path: Path) -> Iterator[Candidate]:
        return Records(self.parse(path))


# --- values ---------------------------------------------------------------------------------

TRUE_WORDS: Final = frozenset({"true", "t", "1"})


def flag(value: Any) -> bool:
    """True for JSON ``true`` and the text forms ``true``/``True``/``t``/``1``; else False
    (absent, ``null``, ``false``, ``f``, ``False``, "")."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return value is True or (type(value) is int and value == 1)


def email_of(value: Any) -> str | None:
    """The e-mail as written, surrounding whitespace stripped; None when absent, null or ""."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"the email is not a string: {value!r}")
    return value.strip() or None


def id_of(value: Any) -> str | None:
    """An origin id: stripped text, or a number as text; None when absent, null or ""."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return text_of(value)


def text_of(value: Any) -> str | None:
    """A lenient string: stripped text, or None for absent, null, "" and non-strings."""
    return (value.strip() or None) if isinstance(value, str) else None


def display_name(full: Any, *parts: Any) -> str:
    """``full`` when it is non-empty text, else the non-empty ``parts`` joined by spaces; at
    most NAME_MAX characters."""
    name = text_of(full) or " ".join(p for p in map(text_of, parts) if p)
    return name[:NAME_MAX]


def skip_reason(email: str | None, *, verified: bool, disabled: str | None = None,
                status: bool = False) -> str | None:
    """The reason a record is skipped, by precedence no_email > disabled class (``disabled``
    names it) > status > unverified (EXPECTED.md, A4); None when eligible."""
    if email is None:
        return "no_email"
    if disabled:
        return disabled
    if status:
        return "status"
    if not verified:
        return "unverified"
    return None


def candidate(provider: str, index: int, origin_id: str | None, email: str | None, name: str,
              skip: str | None) -> Candidate:
    """A single-provider candidate whose metadata says where it came from and nothing else."""
    return Candidate(index=index, origin_id=origin_id, email=email, name=name, skip=skip,
                     metadata={"import": {"provider": provider, "id": origin_id}})


def items(records: Iterable[tuple[int, str, Any]], convert: Callable[[int, Any], Candidate]
          ) -> Iterator[Item]:
    """``convert`` each (index, where, raw record); a record it cannot understand, or the
    ValueError a reader put in its place, becomes a BadRecord there."""
    for index, where, raw in records:
        try:
            yield convert(index, checked(raw))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            yield BadRecord(index, where, str(error) or type(error).__name__)


def objects(raw: Any, why: str = "not a JSON object") -> dict[str, Any]:
    """``raw`` when it is a JSON object, else ValueError."""
    if not isinstance(raw, dict):
        raise ValueError(f"{why}: {str(raw)[:60]!r}")
    return raw


def checked(raw: Any) -> Any:
    """``raw``, or raise it when it is the ValueError a reader put in a record's place."""
    if isinstance(raw, ValueError):
        raise raw
    return raw
