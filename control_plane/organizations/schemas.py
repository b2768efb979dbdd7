"""Organization, membership and invitation bodies."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, WithJsonSchema

from common.errors import InvalidSlug
from common.schemas import DisplayName, PatchModel, RequestModel, refusal
from control_plane.web.pagination import PageQuery
from control_plane.web.schemas import Email, Metadata

SLUG_PATTERN: Final = "^[a-z0-9]+(?:-[a-z0-9]+)*$"
MAX_SLUG_LENGTH: Final = 63
ROLE_PATTERN: Final = "^[a-z][a-z0-9_-]{0,63}$"
DEFAULT_ROLE: Final = "member"
MEMBERSHIP_STATUSES: Final = ("active", "suspended")
INVITATION_STATUSES: Final = ("pending", "accepted", "revoked", "expired")
_SLUG_RE: Final = re.compile(SLUG_PATTERN)
_ROLE_RE: Final = re.compile(ROLE_PATTERN)

MembershipStatus = Literal["active", "suspended"]
InvitationStatus = Literal["pending", "accepted", "revoked", "expired"]


def _slug(slug: str) -> str:
    if len(slug) > MAX_SLUG_LENGTH or _SLUG_RE.fullmatch(slug) is None:
        raise refusal(InvalidSlug, details={"slug": slug[:100], "rule": SLUG_PATTERN,
                                            "max_length": MAX_SLUG_LENGTH})
    return slug


Slug = Annotated[str, AfterValidator(_slug), WithJsonSchema(
    {"type": "string", "pattern": SLUG_PATTERN, "maxLength": MAX_SLUG_LENGTH})]
"""Lowercase letters and digits with single hyphens between, at most 63 characters (SPEC.md 2);
anything else is ``invalid_slug`` (422)."""


def _role(value: str) -> str:
    if _ROLE_RE.fullmatch(value) is None:
        raise ValueError("must be 1 to 64 characters: a lowercase letter, then lowercase "
                         "letters, digits, '_' or '-'")
    return value


Role = Annotated[str, AfterValidator(_role), WithJsonSchema({"type": "string",
                                                             "pattern": ROLE_PATTERN})]
"""A membership role name such as ``member``, ``admin`` or ``billing-admin``."""


def _one_of(allowed: tuple[str, ...]) -> Any:
    def check(value: str | None) -> str | None:
        if value is not None and value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return value

    return AfterValidator(check)


# --- organizations -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Organization:
    """An organization of the project; its ``slug`` is unique in the project."""

    id: str
    name: str
    slug: str
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class CreateOrganization(RequestModel):
    name: DisplayName
    slug: Slug
    metadata: Metadata | None = None


class UpdateOrganization(PatchModel):
    """Only the fields present change; ``metadata`` is replaced whole."""

    name: DisplayName | None = None
    slug: Slug | None = None
    metadata: Metadata | None = None


# --- memberships -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Membership:
    """A user's place in an organization. Only an ``active`` membership lets a session select
    the organization (SPEC.md 3)."""

    id: str
    organization_id: str
    user_id: str
    role: str
    status: MembershipStatus
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class UserMembership(Membership):
    """A membership of the user's, with what an organization picker shows."""

    organization_name: str = ""
    organization_slug: str = ""


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """A change that may end or restore what memberships grant, as
    ``service.on_membership_change`` listeners are told it, in the change's transaction.

    * ``user_id``: the member; None for every member of ``organization_id`` (the organization is
      being deleted: listeners read its memberships themselves, their rows still there).
    * ``before``: the membership's status before the change (None with ``user_id`` None).
    * ``after``: its status after the change; None when the membership is being removed (told
      before its row, and what cascades from it, is deleted).
    """

    organization_id: str
    user_id: str | None
    before: MembershipStatus | None
    after: MembershipStatus | None


class AddMembership(RequestModel):
    user_id: str
    role: Role = DEFAULT_ROLE


class UpdateMembership(PatchModel):
    role: Role | None = None
    status: MembershipStatus | None = None


class MembershipsQuery(PageQuery):
    """A listing of memberships, optionally only those with ``status``."""
    status: Annotated[str | None, _one_of(MEMBERSHIP_STATUSES), WithJsonSchema(
        {"type": "string", "enum": list(MEMBERSHIP_STATUSES)})] = None


# --- invitations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Invitation:
    """An invitation to an organization. ``status`` ``expired`` is derived: a pending
    invitation past ``expires_at``."""

    id: str
    organization_id: str
    email: str
    role: str
    status: InvitationStatus
    expires_at: datetime
    created_at: datetime
    accepted_at: datetime | None
    revoked_at: datetime | None


class CreateInvitation(RequestModel):
    email: Email
    role: Role = DEFAULT_ROLE


class InvitationsQuery(PageQuery):
    """A listing of invitations, optionally only those with ``status``."""
    status: Annotated[str | None, _one_of(INVITATION_STATUSES), WithJsonSchema(
        {"type": "string", "enum": list(INVITATION_STATUSES)})] = None
