"""Store and tuple bodies, and the ``Idempotency-Key`` of a write."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, model_validator

from common.errors import InvalidRequest
from common.schemas import DisplayName, RequestModel
from common.tuples import (
    OBJECT_SCHEMA,
    RELATION_SCHEMA,
    USER_SCHEMA,
    TupleFormatError,
    TupleKey,
    validate_object,
    validate_relation,
    validate_user,
)
from control_plane.web.pagination import PageQuery

MAX_TUPLES_PER_WRITE: Final = 1000
IDEMPOTENCY_KEY: Final = "Idempotency-Key"
IDEMPOTENCY_KEY_PATTERN: Final = "^[!-~]{1,255}$"
"""1 to 255 printable ASCII characters without spaces (a UUID will do)."""
_KEY_RE: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)


def idempotency_key(value: str | None) -> str | None:
    """The ``Idempotency-Key`` header of a write: 1 to 255 printable ASCII characters without
    spaces (a UUID will do), or None when absent. Raises InvalidRequest naming the header."""
    if value is None:
        return None
    if _KEY_RE.fullmatch(value) is None:
        raise InvalidRequest.field(
            IDEMPOTENCY_KEY, "must be 1 to 255 printable ASCII characters without spaces")
    return value


@dataclass(frozen=True, slots=True)
class Store:
    """A store: one project's tuples, at a revision that grows by one per effective write."""

    id: str
    name: str
    revision: int
    created_at: datetime
    updated_at: datetime


class CreateStore(RequestModel):
    name: DisplayName


def _at_least_one_tuple(schema: dict[str, Any]) -> None:
    """What the document can say of "1 to 1,000 tuples in all": at least one tuple in one of the
    lists, at most 1,000 in each, none twice in one list (the sum and a tuple in both lists are
    left to the description)."""
    schema["anyOf"] = [{"required": [name], "properties": {name: {"minItems": 1}}}
                       for name in ("writes", "deletes")]


class WriteBody(RequestModel):
    """Tuples to write and to delete, 1 to 1,000 in all, applied atomically; no tuple twice
    (neither in one list nor in both)."""

    model_config = ConfigDict(json_schema_extra=_at_least_one_tuple)

    writes: list[TupleKey] = Field(default_factory=list, json_schema_extra={
        "maxItems": MAX_TUPLES_PER_WRITE, "uniqueItems": True})
    deletes: list[TupleKey] = Field(default_factory=list, json_schema_extra={
        "maxItems": MAX_TUPLES_PER_WRITE, "uniqueItems": True})

    @model_validator(mode="after")
    def _bounds(self) -> WriteBody:
        total = len(self.writes) + len(self.deletes)
        if not 1 <= total <= MAX_TUPLES_PER_WRITE:
            raise ValueError(
                f"writes and deletes must hold 1 to {MAX_TUPLES_PER_WRITE} tuples in all, got {total}"
            )
        return self

    def digest(self) -> bytes:
        """SHA-256 of what the write does, whatever the order of its tuples: a key reused for
        another write is told apart from a retry of the same one."""
        parts = sorted([f"w\x1f{t.object}\x1f{t.relation}\x1f{t.user}" for t in self.writes]
                       + [f"d\x1f{t.object}\x1f{t.relation}\x1f{t.user}" for t in self.deletes])
        return hashlib.sha256("\x1e".join(parts).encode("utf-8", "surrogatepass")).digest()

    def check_unique(self) -> None:
        """Raises InvalidRequest naming the first tuple that repeats an earlier one (in
        ``writes`` or ``deletes``, or across them: a call may not both write and delete a
        tuple)."""
        seen: dict[tuple[str, str, str], str] = {}
        for name, items in (("writes", self.writes), ("deletes", self.deletes)):
            for i, t in enumerate(items):
                where = f"{name}.{i}"
                if t.key() in seen:
                    raise InvalidRequest.field(where, f"repeats {seen[t.key()]}")
                seen[t.key()] = where


@dataclass(frozen=True, slots=True)
class Written:
    """What a write did: tuples written and deleted (those already so are no-ops), and the
    store's revision after it (unchanged when nothing changed)."""

    written: int
    deleted: int
    revision: int


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What forgetting a subject did in one store (``service.forget_subject_in``): the
    ``revision`` that deleted its tuples, how many tuples it ``deleted``, how many rows of the
    change log below it were ``redacted``, and ``times``, the distinct ``created_at`` of the
    redacted rows' revisions and of ``revision`` (each revision's ``authz.tuples.written`` event
    has its time: one transaction)."""

    store_id: str
    revision: int
    deleted: int
    redacted: int
    times: list[datetime]


@dataclass(frozen=True, slots=True)
class StoredTuple:
    """A tuple of the store, with the revision that wrote it."""

    object: str
    relation: str
    user: str
    revision: int
    created_at: datetime


def _filter(validate: Any) -> Any:
    def check(value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return str(validate(value))
        except TupleFormatError as exc:
            raise ValueError(str(exc)) from None

    return AfterValidator(check)


class TuplesQuery(PageQuery):
    """A page of the store's tuples ordered by (object, relation, user), filtered by exact
    ``object``, ``relation`` and ``user`` when given."""

    object: Annotated[str | None, _filter(validate_object), WithJsonSchema(OBJECT_SCHEMA)] = None
    relation: Annotated[str | None, _filter(validate_relation),
                        WithJsonSchema(RELATION_SCHEMA)] = None
    user: Annotated[str | None, _filter(validate_user), WithJsonSchema(USER_SCHEMA)] = None
