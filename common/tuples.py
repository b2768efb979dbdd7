"""Validation of relationship-tuple strings, shared by the control plane (writes) and the
engine (check requests).

Formats (SPEC.md section 2, "Authorization tuple"):

* object: ``type:id``
* relation: a relation name
* user: ``type:id`` (a subject) or ``type:id#relation`` (a userset)

Rules, close to OpenFGA's but stricter where a character would make the tuple notation
``object#relation@user`` ambiguous or a log line unreadable:

* type: ASCII letters, digits, ``_ . -``; starts with a letter, digit or ``_``; 1-64 chars.
* id: 1-256 chars of Unicode letters and digits, ``_``, and ``. - | / = + ~ % @``; so no
  whitespace, control characters, ``:``, ``#`` or ``*``. ``@`` is allowed, as in OpenFGA, so
  that e-mail addresses can be ids (``user:anne@example.com``).
* relation: ASCII letters, digits, ``_ -``; starts with a letter or ``_``; 1-64 chars.
* whole object at most 320 chars; whole user at most 385 (an object plus ``#relation``).
* wildcards (``type:*``) are not supported (SPEC.md section 4, endpoint rule 4: direct and
  userset rules only) and are rejected with their own message.

So ``'#'`` appears in no type or id and ``'@'`` in no type or relation, which keeps the tuple
notation ``object#relation@user`` (resolution paths, logs) unambiguous even with ``'@'`` in
both ids: the object is everything before the first ``'#'``, the relation runs from there to
the next ``'@'``, and the user is the rest (it may hold ``'@'`` and a ``'#relation'``)::

    obj, _, rest = step.partition("#")
    relation, _, user = rest.partition("@")

Splitting at the first ``'@'`` instead would cut ``doc:a@b#viewer@user:c@d`` wrongly.

Every function is pure and uses precompiled regular expressions: the happy path is one
``fullmatch`` per string; the slower diagnosis runs only to word the error. The acceptance
rule of each part is written once (``_object_ok``, ``_relation_ok``, ``_user_ok``) and shared
by the validators and :func:`is_valid_tuple`, the engine's per-check fast path. Both remember
the parts that passed (a set probe instead of a match for a repeated string; ``MEMO_SIZE``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Final, TypeGuard

from pydantic import AfterValidator, WithJsonSchema

from common.schemas import RequestModel

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_OBJECT_LENGTH",
    "MAX_USER_LENGTH",
    "MEMO_SIZE",
    "ObjectName",
    "RelationName",
    "TupleFormatError",
    "TupleKey",
    "UserName",
    "is_valid_tuple",
    "validate_object",
    "validate_relation",
    "validate_tuple",
    "validate_user",
]

MAX_NAME_LENGTH: Final = 64
"""Longest type or relation name."""
MAX_ID_LENGTH: Final = 256
"""Longest object or user id (the part after ``type:``)."""
MAX_OBJECT_LENGTH: Final = 320
"""Longest ``type:id``."""
MAX_USER_LENGTH: Final = MAX_OBJECT_LENGTH + 1 + MAX_NAME_LENGTH
"""Longest ``type:id#relation``."""

_TYPE: Final = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}"
_ID_CHAR: Final = r"[\w.|/=+~%@\-]"
_ID: Final = _ID_CHAR + r"{1,256}"
_RELATION: Final = r"[A-Za-z_][A-Za-z0-9_\-]{0,63}"

OBJECT_RE: Final = re.compile(f"{_TYPE}:{_ID}")
"""``type:id`` (use ``fullmatch``; lengths are checked separately)."""
RELATION_RE: Final = re.compile(_RELATION)
"""A relation name (use ``fullmatch``)."""
USER_RE: Final = re.compile(f"{_TYPE}:{_ID}(?:#{_RELATION})?")
"""``type:id`` or ``type:id#relation`` (use ``fullmatch``; lengths are checked separately)."""

_match_object: Final = OBJECT_RE.fullmatch
_match_relation: Final = RELATION_RE.fullmatch
_match_user: Final = USER_RE.fullmatch

_TYPE_RE: Final = re.compile(_TYPE)
_ID_CHAR_RE: Final = re.compile(_ID_CHAR)
_BAD_SPACE_RE: Final = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")

_NAME_RULE: Final = "letters, digits and '_' (also '.' and '-' for types), at most 64 characters"


class TupleFormatError(ValueError):
    """A tuple string is malformed; ``field`` names the part (object, relation or user)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# --- the acceptance rule, once per part ---------------------------------------------------------


def _object_ok(value: object) -> TypeGuard[str]:
    return type(value) is str and len(value) <= MAX_OBJECT_LENGTH and _match_object(value) is not None


def _relation_ok(value: object) -> TypeGuard[str]:
    return type(value) is str and _match_relation(value) is not None  # the pattern caps the length


def _user_ok(value: object) -> TypeGuard[str]:
    return type(value) is str and len(value) <= MAX_USER_LENGTH and _match_user(value) is not None


MEMO_SIZE: Final = 1 << 14
"""Most strings each memo of :func:`is_valid_tuple` keeps (one memo per part); a full memo is
emptied. At that size one memo holds at most about 1.5 MB (the set and the strings it keeps
alive, 385 characters at the most, 20-40 usually)."""

_passed_objects: set[str] = set()
_passed_relations: set[str] = set()
_passed_users: set[str] = set()


def _passes(value: object, rule: Callable[[object], bool], passed: set[str]) -> bool:
    """``rule(value)``, remembering a string that passed in ``passed``."""
    if type(value) is str and value in passed:
        return True
    if not rule(value):
        return False
    if len(passed) >= MEMO_SIZE:
        passed.clear()
    passed.add(value)  # type: ignore[arg-type]  # (every rule accepts strings only)
    return True


def is_valid_tuple(object: object, relation: object, user: object) -> bool:
    """Whether all three parts are valid: exactly what :func:`validate_tuple` accepts, without
    an exception or a message (the hot path's check; use the validators to word an error).

    Each part that passes is remembered, here and by the validators (one memo per part, at most
    :data:`MEMO_SIZE` strings, emptied when full), so a repeated object, relation or user costs
    one set probe instead of a regular-expression match: 0.38 against 0.76 us per check on the benchmark's checks, whose
    objects and users repeat as those of real traffic do. The probe hashes the string, which
    the engine's index lookup of the same user then reuses. A part is only ever remembered for
    its own role (a valid user such as ``group:1#member`` is no valid object)."""
    if (type(object) is str and type(relation) is str and type(user) is str
            and object in _passed_objects and relation in _passed_relations
            and user in _passed_users):
        return True
    return (_passes(object, _object_ok, _passed_objects)
            and _passes(relation, _relation_ok, _passed_relations)
            and _passes(user, _user_ok, _passed_users))


def validate_object(value: object) -> str:
    """Return ``value`` if it is a valid ``type:id`` object, else raise TupleFormatError."""
    if _passes(value, _object_ok, _passed_objects):
        return value  # type: ignore[return-value]  # (_object_ok: a str)
    raise TupleFormatError("object", _diagnose_object("object", value))


def validate_relation(value: object) -> str:
    """Return ``value`` if it is a valid relation name, else raise TupleFormatError."""
    if _passes(value, _relation_ok, _passed_relations):
        return value  # type: ignore[return-value]  # (_relation_ok: a str)
    raise TupleFormatError("relation", _diagnose_relation("relation", value))


def validate_user(value: object) -> str:
    """Return ``value`` if it is ``type:id`` or ``type:id#relation``, else raise
    TupleFormatError."""
    if _passes(value, _user_ok, _passed_users):
        return value  # type: ignore[return-value]  # (_user_ok: a str)
    raise TupleFormatError("user", _diagnose_user(value))


def validate_tuple(object: object, relation: object, user: object) -> None:
    """Validate all three parts of a tuple; raise TupleFormatError for the first bad one."""
    validate_object(object)
    validate_relation(relation)
    validate_user(user)


# --- diagnosis: only runs when the fast check failed ------------------------------------------


def _diagnose_common(what: str, value: object) -> str | None:
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if not value:
        return f"{what} is empty"
    bad = _BAD_SPACE_RE.search(value)
    if bad:
        return f"{what} {value!r} contains whitespace or a control character at {bad.start()}"
    return None


def _diagnose_object(what: str, value: object) -> str:
    problem = _diagnose_common(what, value)
    if problem is not None:
        return problem
    assert isinstance(value, str)
    if "#" in value:
        return (f"{what} {value!r} must not contain '#'; usersets ('type:id#relation') "
                "are only allowed as the user")
    return _diagnose_typed_id(what, value)


def _diagnose_typed_id(what: str, value: str) -> str:
    """Why ``value`` (no '#', no whitespace) is not a valid ``type:id``."""
    if ":" not in value:
        return f"{what} {value!r} is missing ':'; expected 'type:id'"
    if value.count(":") > 1:
        return f"{what} {value!r} has more than one ':'; expected 'type:id'"
    type_, _, id_ = value.partition(":")
    if not type_:
        return f"{what} {value!r} has an empty type before ':'"
    if not id_:
        return f"{what} {value!r} has an empty id after ':'"
    if "*" in id_:
        return f"{what} {value!r}: wildcards ('type:*') are not supported"
    if "@" in type_:
        return f"{what} type {type_!r} must not contain '@'"
    if len(type_) > MAX_NAME_LENGTH:
        return (f"{what} type is {len(type_)} characters long; at most {MAX_NAME_LENGTH} "
                "are allowed")
    if not _TYPE_RE.fullmatch(type_):
        return (f"{what} type {type_!r} is invalid: use {_NAME_RULE}, "
                "starting with a letter, digit or '_'")
    if len(id_) > MAX_ID_LENGTH:
        return f"{what} id is {len(id_)} characters long; at most {MAX_ID_LENGTH} are allowed"
    for ch in id_:
        if not _ID_CHAR_RE.fullmatch(ch):
            return (f"{what} id {id_!r} contains {ch!r}; ids may use letters, digits and "
                    "'_ . - | / = + ~ % @'")
    if len(value) > MAX_OBJECT_LENGTH:
        return f"{what} is {len(value)} characters long; at most {MAX_OBJECT_LENGTH} are allowed"
    return f"{what} {value!r} is not a valid 'type:id'"  # pragma: no cover - defensive


def _diagnose_relation(what: str, value: object) -> str:
    problem = _diagnose_common(what, value)
    if problem is not None:
        return problem
    assert isinstance(value, str)
    if len(value) > MAX_NAME_LENGTH:
        return f"{what} is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed"
    for sep in ("#", ":", "@"):
        if sep in value:
            return f"{what} {value!r} must not contain {sep!r}; it is a bare relation name"
    return (f"{what} {value!r} is invalid: use letters, digits, '_' and '-', starting with a "
            "letter or '_'")


def _diagnose_user(value: object) -> str:
    problem = _diagnose_common("user", value)
    if problem is not None:
        return problem
    assert isinstance(value, str)
    if value.count("#") > 1:
        return f"user {value!r} has more than one '#'; expected 'type:id' or 'type:id#relation'"
    base, hash_, relation = value.partition("#")
    if hash_ and not base:
        return f"user {value!r} has nothing before '#'; expected 'type:id#relation'"
    if hash_:
        if not relation:
            return f"user {value!r} has an empty relation after '#'"
        if not RELATION_RE.fullmatch(relation):
            return _diagnose_relation("user relation", relation)
    if len(value) > MAX_USER_LENGTH:
        return f"user is {len(value)} characters long; at most {MAX_USER_LENGTH} are allowed"
    return _diagnose_typed_id("user", base)


# --- as request-model types (control plane writes, engine checks) -----------------------------

OBJECT_SCHEMA: Final = {"type": "string", "description": "type:id",
                        "pattern": f"^{_TYPE}:{_ID}$", "maxLength": MAX_OBJECT_LENGTH}
RELATION_SCHEMA: Final = {"type": "string", "description": "a relation name",
                          "pattern": f"^{_RELATION}$"}
USER_SCHEMA: Final = {"type": "string", "description": "type:id, or type:id#relation (a userset)",
                      "pattern": f"^{_TYPE}:{_ID}(?:#{_RELATION})?$", "maxLength": MAX_USER_LENGTH}
"""The JSON Schemas of the three parts: the validators' own patterns (``\\w`` is Unicode, as in
Python) and lengths."""

ObjectName = Annotated[str, AfterValidator(validate_object), WithJsonSchema(OBJECT_SCHEMA)]
RelationName = Annotated[str, AfterValidator(validate_relation), WithJsonSchema(RELATION_SCHEMA)]
UserName = Annotated[str, AfterValidator(validate_user), WithJsonSchema(USER_SCHEMA)]


class TupleKey(RequestModel):
    """A relationship tuple ``object#relation@user`` (SPEC.md 2)."""

    object: ObjectName
    relation: RelationName
    user: UserName

    def key(self) -> tuple[str, str, str]:
        return (self.object, self.relation, self.user)
