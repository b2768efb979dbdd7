"""Session bodies: the session, the sign-in envelope (SPEC.md 3), and the session routes'
requests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from common.http import OMIT_IF_NONE
from common.schemas import RequestModel
from control_plane.users.schemas import User


@dataclass(frozen=True, slots=True)
class Session:
    """A session. ``organization_id`` is the selected organization (null until one is) and
    ``role`` the user's role there; ``auth_method`` how the user signed in."""

    id: str
    user_id: str
    organization_id: str | None
    status: Literal["active", "revoked"]
    auth_method: str
    created_at: datetime
    expires_at: datetime
    last_refreshed_at: datetime | None
    revoked_at: datetime | None
    role: str | None = None


SESSION_COLUMNS: Final = ", ".join(f.name for f in dataclasses.fields(Session) if f.name != "role")


@dataclass(frozen=True, slots=True)
class Grant:
    """What a sign-in, an organization change or a refresh answers (SPEC.md 3): the session,
    its user, a new access token (the ``service_session`` cookie holds it too) and, when it
    changed, the new refresh token."""

    session: Session
    user: User
    access_token: str
    token_type: Literal["Bearer"]
    expires_in: int
    refresh_token: str | None = field(default=None, metadata={OMIT_IF_NONE: True})


@dataclass(frozen=True, slots=True)
class CurrentSession:
    """The caller's session and its user."""

    session: Session
    user: User


@dataclass(frozen=True, slots=True)
class RevokedSession:
    """The session, revoked: every access token of it is refused from now on."""

    session: Session
    revoked: bool = True


class OrgBody(RequestModel):
    """The organization to select or switch to."""

    organization_id: str


class RefreshBody(RequestModel):
    """The refresh token (``rt_...``) the last sign-in or refresh handed out."""

    refresh_token: str


@dataclass(frozen=True, slots=True)
class SignIn:
    """A completed sign-in, whatever proved it (magic link, passkey, OAuth): the session (in
    ``project_id``), its first refresh token and its user; the access token is signed apart
    (``sessions.service.grant``), once the connection is back in the pool."""

    project_id: str
    session: Session
    user: User
    refresh_token: str
