"""Recovery rules (issue 23; events ``recovery.request.created``, ``.approved``, ``.denied``).

* :func:`file_request`: a pending request for a user of the project, to a new destination (an
  e-mail address or an E.164 number) no other user of the project holds. A user has at most
  one pending request.
* :func:`approve`: in one transaction, the destination becomes the user's contact of its channel
  (unverified: the recovery link verifies it when used; ``user.updated`` as for any change),
  every session of the user is revoked (at the edge too), a one-time recovery link lasting
  :data:`LINK_TTL` is queued to the destination, and the request is ``approved``. Anyone
  holding the old address or a session is shut out; only the new destination gets in.
* :func:`deny`: the request is ``denied``; nothing else changes.

A decided request is never decided again (RecoveryRequestNotPending); another project's, an
unknown or a malformed id is RecoveryRequestNotFound. Requests go with their user.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import asyncpg

from common.errors import (
    EmailInUse,
    InvalidRequest,
    PhoneInUse,
    RecoveryRequestNotFound,
    RecoveryRequestNotPending,
    RecoveryRequestPending,
)
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.magic_links import service as magic_links
from control_plane.recovery import repository
from control_plane.recovery.schemas import RecoveryBody, RecoveryQuery, RecoveryRequest
from control_plane.sessions import service as sessions
from control_plane.users import service as users
from control_plane.users.schemas import UpdateUser
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, listing_condition, page_by_id

LISTING: Final = "recovery_requests"
LINK_TTL: Final = timedelta(hours=24)
"""How long an approved request's link works."""


def _request(row: asyncpg.Record) -> RecoveryRequest:
    return RecoveryRequest(**row)


def _destination(body: RecoveryBody) -> tuple[str, str]:
    """``(channel, destination)`` of the body; exactly one of them is named."""
    if (body.email is None) == (body.phone_number is None):
        raise InvalidRequest("Name exactly one new destination: email or phone_number.", details={
            "fields": [{"field": "email", "message": "exactly one of email and phone_number"}]})
    return ("email", body.email) if body.email is not None else ("sms", str(body.phone_number))


async def _taken(conn: asyncpg.Connection, project_id: str, user_id: str, channel: str,
                 destination: str) -> None:
    """Raise EmailInUse or PhoneInUse when another user of the project holds ``destination``."""
    other = await magic_links.user_of_destination(conn, project_id, channel, destination)
    if other is not None and other != user_id:
        raise EmailInUse() if channel == "email" else PhoneInUse()


async def file_request(conn: asyncpg.Connection, actor: Actor,
                       body: RecoveryBody) -> RecoveryRequest:
    """A pending request (``recovery.request.created``). Raises UserNotFound, InvalidRequest,
    EmailInUse, PhoneInUse, RecoveryRequestPending (details ``recovery_id``)."""
    project_id = actor.project_id
    assert project_id is not None
    channel, destination = _destination(body)
    async with conn.transaction():
        await users.find_user(conn, project_id, body.user_id, for_update=True)
        await _taken(conn, project_id, body.user_id, channel, destination)
        pending = await repository.pending_of(conn, body.user_id)
        if pending is not None:
            raise RecoveryRequestPending(details={"recovery_id": pending})
        row = await repository.insert(
            conn, request_id=new_id("rcv"), project_id=project_id, user_id=body.user_id,
            channel=channel, destination=destination, reason=body.reason)
        await audit.record(
            conn, actor, action="recovery.request.created", target_type="recovery_request",
            target_id=row["id"], user_id=body.user_id,
            description=f"Recovery of user {body.user_id} requested by {channel}",
            metadata={"channel": channel, "destination": destination})
    return _request(row)


async def find_request(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                       recovery_id: str, *, lock: bool = False) -> RecoveryRequest:
    """The request. Raises RecoveryRequestNotFound."""
    row = await repository.find(conn, project_id, recovery_id, lock=lock) \
        if is_id(recovery_id, "rcv") else None
    if row is None:
        raise RecoveryRequestNotFound()
    return _request(row)


async def list_requests(pool: asyncpg.Pool, listing: Listing,
                        query: RecoveryQuery) -> Page[RecoveryRequest]:
    """A page of the project's requests, oldest first. Raises InvalidRequest (cursor)."""
    return await page_by_id(
        pool, listing, query, table="recovery_requests", columns=repository.COLUMNS, row=_request,
        where=lambda p: listing_condition(p, {"status": query.status, "user_id": query.user_id}))


async def _pending(conn: asyncpg.Connection, actor: Actor, recovery_id: str) -> RecoveryRequest:
    """The request, locked, after its user (the order every change of a user takes). Raises
    RecoveryRequestNotFound, RecoveryRequestNotPending."""
    project_id = actor.project_id
    assert project_id is not None
    request = await find_request(conn, project_id, recovery_id)
    await users.find_user(conn, project_id, request.user_id, for_update=True)
    request = await find_request(conn, project_id, recovery_id, lock=True)
    if request.status != "pending":
        raise RecoveryRequestNotPending(details={"status": request.status})
    return request


async def approve(conn: asyncpg.Connection, actor: Actor, *, recovery_id: str, note: str | None,
                  kms: LocalKms, settings: Settings) -> RecoveryRequest:
    """Approve the request (module docstring; ``recovery.request.approved`` with the sessions
    revoked). Raises RecoveryRequestNotFound, RecoveryRequestNotPending, EmailInUse, PhoneInUse
    (another user took the destination since)."""
    project_id = actor.project_id
    assert project_id is not None
    async with conn.transaction():
        request = await _pending(conn, actor, recovery_id)
        user_id, channel, destination = request.user_id, request.channel, request.destination
        await _taken(conn, project_id, user_id, channel, destination)
        contact = {"email": destination} if channel == "email" else {"phone_number": destination}
        await users.update_user(conn, actor, user_id=user_id,
                                body=UpdateUser.model_validate(contact))
        revoked = await sessions.revoke_user_sessions(conn, user_id=user_id, reason="recovery")
        message_id = await magic_links.issue_link(
            conn, kms, settings, project_id=project_id, purpose="recovery", channel=channel,
            destination=destination, ttl_seconds=int(LINK_TTL.total_seconds()), user_id=user_id)
        row = await repository.decide(conn, recovery_id, status="approved", note=note,
                                      decided_by=actor.id, message_id=message_id)
        await audit.record(
            conn, actor, action="recovery.request.approved", target_type="recovery_request",
            target_id=recovery_id, user_id=user_id,
            description=f"Recovery of user {user_id} approved; link sent by {channel}",
            metadata={"channel": channel, "destination": destination,
                      "sessions_revoked": revoked, "message_id": message_id})
    return _request(row)


async def deny(conn: asyncpg.Connection, actor: Actor, *, recovery_id: str,
               note: str | None) -> RecoveryRequest:
    """Deny the request (``recovery.request.denied``). Raises RecoveryRequestNotFound,
    RecoveryRequestNotPending."""
    async with conn.transaction():
        request = await _pending(conn, actor, recovery_id)
        row = await repository.decide(conn, recovery_id, status="denied", note=note,
                                      decided_by=actor.id, message_id=None)
        await audit.record(
            conn, actor, action="recovery.request.denied", target_type="recovery_request",
            target_id=recovery_id, user_id=request.user_id,
            description=f"Recovery of user {request.user_id} denied",
            metadata={"channel": request.channel})
    return _request(row)
