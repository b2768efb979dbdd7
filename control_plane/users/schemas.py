"""User bodies: the user as the API shows it, creation, update, and the listing's query."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

from common.schemas import PatchModel, RequestModel, name_pattern, printable
from control_plane.web.pagination import PageQuery
from control_plane.web.schemas import Email, Metadata, PhoneNumber

TOTAL_COUNT_HEADER: Final = "Service-Total-Count"


@dataclass(frozen=True, slots=True)
class User:
    """A user of the project. ``email`` and ``phone_number`` are its contacts (at least one);
    ``*_verified`` say whether a magic link proved them."""

    id: str
    email: str | None
    email_verified: bool
    phone_number: str | None
    phone_verified: bool
    name: str
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    last_sign_in_at: datetime | None


USER_FIELDS: Final = tuple(f.name for f in dataclasses.fields(User))
"""The user's fields, which are also its columns in ``users``."""

UserName = Annotated[
    str, StringConstraints(strip_whitespace=True, max_length=200), AfterValidator(printable),
    WithJsonSchema({"type": "string", "pattern": name_pattern(200, required=False),
                    "description": "0 to 200 characters after trimming whitespace, none of them "
                                   "a control character."}),
]
"""A user's display name: 0 to 200 characters after trimming, no control characters."""


class CreateUser(RequestModel):
    """A new user; an existing one with the same email (compared case-insensitively) is
    returned instead, unchanged."""

    email: Email
    name: UserName = ""
    email_verified: bool = False
    phone_number: PhoneNumber | None = None
    metadata: Metadata | None = None


class UpdateUser(PatchModel):
    """Only the fields present change; ``phone_number: null`` clears the number, ``metadata``
    is replaced whole."""

    nullable_fields = frozenset({"phone_number"})

    name: UserName | None = None
    email: Email | None = None
    email_verified: bool | None = None
    phone_number: PhoneNumber | None = None
    metadata: Metadata | None = None


class UsersQuery(PageQuery):
    """The users listing: ``email`` filters exactly and case-insensitively."""

    email: Annotated[Email | None, Field(description="Only the user with this email.")] = None


@dataclass(frozen=True, slots=True)
class CreatedUser(User):
    """A user as ``POST /v1/users`` answers: ``created`` says whether this call made it."""

    created: bool = True

    @classmethod
    def of(cls, user: User, *, created: bool) -> CreatedUser:
        return cls(**{f: getattr(user, f) for f in USER_FIELDS}, created=created)
