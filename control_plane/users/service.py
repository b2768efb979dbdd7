"""User rules (SPEC.md 2 "User", 4 rule 5).

* :func:`create_user` is idempotent on (project, email compared case-insensitively): a new user
  gets, in the same transaction, exactly one enrollment magic link queued and ``user.created``;
  an existing user is returned and nothing else happens. Concurrent calls for one email create
  one user (the unique index decides).
* :func:`update_user` changes the fields present and records ``user.updated`` with the names of
  the fields that changed (never their values); a changed email or phone number is unverified
  unless ``email_verified`` comes with it.
* :func:`remove_user` deletes the user (memberships, sessions and tokens cascade), revokes its
  live sessions at the edge, leaves its risk decisions without its id, and records
  ``user.deleted``. What other domains derive from the user is told first, in the same
  transaction (:func:`on_removal`: organizations, and through them the SCIM group tuples).

A user of another project, an unknown id and a malformed id are all ``user_not_found``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import asyncpg

from common.errors import EmailInUse, InvalidRequest, PhoneInUse, UserNotFound
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.magic_links import service as magic_links
from control_plane.risk import service as risk
from control_plane.sessions import service as sessions
from control_plane.users import repository
from control_plane.users.repository import EMAIL_CONSTRAINT, PHONE_CONSTRAINT
from control_plane.users.schemas import CreatedUser, CreateUser, UpdateUser, User, UsersQuery
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, page_by_id


async def find_by_email(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        email: str) -> User | None:
    """The project's user with ``email`` (normalized; compared case-insensitively), or None."""
    return await repository.find_by_email(conn, project_id, email)


def unique_violation(exc: asyncpg.UniqueViolationError) -> Exception:
    """EmailInUse or PhoneInUse for a violation of the users' unique indexes, else ``exc``."""
    if exc.constraint_name == EMAIL_CONSTRAINT:
        return EmailInUse()
    if exc.constraint_name == PHONE_CONSTRAINT:
        return PhoneInUse()
    error: Exception = exc
    return error


async def find_user(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, user_id: str, *,
                    for_update: bool = False) -> User:
    """The project's user ``user_id``, its row locked for the caller's transaction with
    ``for_update``. Raises UserNotFound when the id is malformed, unknown or another project's."""
    user = await repository.find(conn, user_id, project_id=project_id,
                                 for_update=for_update) if is_id(user_id, "user") else None
    if user is None:
        raise UserNotFound()
    return user


create_from = repository.create_from
"""SQL: the CTEs creating a user as :func:`create_user` does (``repository.create_from``), for
another domain's statement that goes on from the new user's row ``u``."""


def create_params(actor: Actor, *, user_id: str, body: CreateUser, kms: LocalKms,
                  settings: Settings, project_name: str) -> dict[str, object]:
    """The named parameters of :data:`create_from` for the new user ``user_id`` of the actor's
    project: its row, its enrollment link and message, and its ``user.created``."""
    project_id = actor.project_id
    assert project_id is not None
    return {
        "id": user_id, "project_id": project_id, "email": body.email,
        "email_verified": body.email_verified, "phone_number": body.phone_number,
        "name": body.name, "metadata": body.metadata or {},
        **magic_links.enrollment_params(kms, settings, project_id=project_id,
                                        project_name=project_name, email=body.email),
        **audit.event_params(
            actor, name="user_event", action="user.created", target_type="user",
            target_id=user_id, user_id=user_id, description=f"Created user {body.email}",
            metadata={"user_email": body.email, "email_verified": body.email_verified}),
    }


async def create_user(
    conn: asyncpg.Connection, actor: Actor, *, body: CreateUser, kms: LocalKms, settings: Settings,
    outbox: asyncio.Event, project_name: str | None = None,
) -> CreatedUser:
    """Create the user unless one with that email exists in the actor's project; ``created``
    says whether this call did; ``outbox`` (this process's outbox worker's wake-up) is set once
    the enrollment message committed. Raises PhoneInUse (409).

    One round trip, new user or existing: the user, its enrollment link, message and event in
    one statement, atomic without a transaction of its own, which answers the existing user
    instead when there is one. The message names the project, whose name comes with the
    caller's API key (a project's name never changes), or as ``project_name`` from a caller
    that is not a key (SCIM). What an import is made of."""
    project_id = actor.project_id
    assert project_id is not None
    if project_name is None:  # a route for API keys (another caller names the project itself)
        assert actor.api_key is not None
        project_name = actor.api_key.project_name
    for _ in range(3):  # a concurrent creation of the email committed meanwhile: look again
        user_id = new_id("user")
        values = create_params(actor, user_id=user_id, body=body, kms=kms, settings=settings,
                               project_name=project_name)
        try:
            outcome = await repository.create(conn, values)
        except asyncpg.UniqueViolationError as exc:
            raise unique_violation(exc) from None
        if outcome is not None:
            user, created = outcome
            if created:
                outbox.set()
            return CreatedUser.of(user, created=created)
    raise InvalidRequest("The user was deleted while being created; retry the request.")


async def update_user(conn: asyncpg.Connection, actor: Actor, *, user_id: str,
                      body: UpdateUser) -> User:
    """Apply the fields present in ``body`` and return the user; a call that changes nothing
    records nothing. Raises UserNotFound, EmailInUse, PhoneInUse, InvalidRequest (the last
    contact cannot be removed)."""
    project_id = actor.project_id
    assert project_id is not None
    async with conn.transaction():
        user = await find_user(conn, project_id, user_id, for_update=True)
        changes = update_changes(user, body)
        if not changes:
            return user
        try:
            updated = await repository.update(conn, project_id, user_id, changes)
        except asyncpg.UniqueViolationError as exc:
            raise unique_violation(exc) from None
        except asyncpg.CheckViolationError:
            raise InvalidRequest.field(
                "phone_number", "cannot be cleared: the user has no email address") from None
        await audit.record(conn, actor, **_updated_event(user_id, changes))
    return updated


def update_changes(user: User, body: UpdateUser) -> dict[str, Any]:
    """What :func:`update_user` changes of ``user`` (as locked by the caller) for ``body``: the
    columns and their new values (none: nothing to do)."""
    fields = body.model_fields_set
    wanted: dict[str, Any] = {}
    if "name" in fields:
        wanted["name"] = body.name
    if body.email is not None and body.email != user.email:
        wanted["email"] = body.email
        if (user.email or "").lower() != body.email.lower():
            wanted["email_verified"] = False
    if "email_verified" in fields:
        wanted["email_verified"] = body.email_verified
    if "phone_number" in fields and body.phone_number != user.phone_number:
        wanted["phone_number"] = body.phone_number
        wanted["phone_verified"] = False
    if "metadata" in fields:
        wanted["metadata"] = body.metadata
    return {k: v for k, v in wanted.items() if getattr(user, k) != v}


def _updated_event(user_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    names = sorted(changes)
    return {"action": "user.updated", "target_type": "user", "target_id": user_id,
            "user_id": user_id, "description": f"Updated user {user_id} ({', '.join(names)})",
            "metadata": {"changed": names}}


update_from = repository.update_from
"""SQL: the CTEs applying :func:`update_changes` to a user the caller locked, with its
``user.updated`` (``repository.update_from``), for another domain's statement."""


def update_params(actor: Actor, *, user_id: str, changes: dict[str, Any]) -> dict[str, object]:
    """The named parameters of :data:`update_from` for ``changes`` (``update_changes``') of the
    actor's project's user ``user_id``; with ``changes``' names the statement's shape."""
    return {**{f"user_set_{k}": v for k, v in changes.items()},
            "user_id": user_id, "user_project_id": actor.project_id,
            **audit.event_params(actor, name="user_update_event",
                                 **_updated_event(user_id, changes))}


RemovalListener = Callable[[asyncpg.Connection, Actor, str], Awaitable[None]]
"""``listener(conn, actor, user_id)``: the user is being deleted (its rows are still there)."""
_REMOVAL_LISTENERS: Final[list[RemovalListener]] = []


def on_removal(listener: RemovalListener) -> None:
    """Call ``listener`` in the transaction of every :func:`remove_user`, with the user's row
    locked and before anything of the user is deleted, so that a domain this one cannot import
    (``organizations`` imports ``users``) undoes what it derived from the user in the same
    transaction. Registered once, at app setup; registering it again changes nothing."""
    if listener not in _REMOVAL_LISTENERS:
        _REMOVAL_LISTENERS.append(listener)


async def remove_user(conn: asyncpg.Connection, actor: Actor, *, user_id: str) -> None:
    """Hard-delete the user with ``user.deleted``; its live sessions are revoked in the same
    transaction, their revocations recorded for the announcer (``sessions``). Raises
    UserNotFound."""
    project_id = actor.project_id
    assert project_id is not None
    async with conn.transaction():
        user = await find_user(conn, project_id, user_id, for_update=True)
        for listener in _REMOVAL_LISTENERS:
            await listener(conn, actor, user_id)
        revoked = await sessions.revoke_user_sessions(conn, user_id=user_id,
                                                      reason="user_deleted")
        await risk.forget_user(conn, project_id=project_id, user_id=user_id)
        await repository.delete(conn, user_id)
        await audit.record(
            conn, actor, action="user.deleted", target_type="user", target_id=user_id,
            user_id=user_id, description=f"Deleted user {user_id}",
            metadata={"user_email": user.email, "sessions_revoked": revoked},
        )


async def list_users(pool: asyncpg.Pool, users: Listing, query: UsersQuery) -> Page[User]:
    """A page of the project's users in creation order, only the one with ``query.email`` when
    given. Raises InvalidRequest (cursor)."""
    email = query.email
    return await page_by_id(
        pool, users, query, table="users", columns=repository.COLUMNS, row=repository.user,
        where=(lambda p: f"lower(email) = lower({p(email)})") if email is not None else None,
    )


async def count_users(pool: asyncpg.Pool, project_id: str) -> int:
    """The project's number of users."""
    return await repository.count(pool, project_id)
