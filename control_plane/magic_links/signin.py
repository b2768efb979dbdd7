"""Redeeming a magic link: the sign-in (SPEC.md 3).

:func:`redeem` consumes the token and signs its owner in, in one transaction: the user (created
on a first sign-in, the destination marked verified), an invitation's membership, the session,
and ``auth.signin_attempt``. The common case takes a lookup and one statement with no explicit
transaction (:func:`_fast_sign_in`); anything unusual (an invitation, a refused or raced link)
goes through the general path, which decides and explains.
"""

from __future__ import annotations

from typing import Any, Final

import asyncpg

from common.auth import token_digest
from common.errors import ServiceError, TokenConsumed, TokenExpired, TokenInvalidOrExpired
from common.ids import new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.magic_links import repository
from control_plane.organizations import service as organizations
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import SignIn
from control_plane.web.actor import Actor

_FAILURES: Final = {"consumed": TokenConsumed, "expired": TokenExpired}



async def redeem(conn: asyncpg.Connection, actor: Actor, *, token: str, named_project: str | None,
                 device: dict[str, Any], settings: Settings, iat: int) -> SignIn:
    """Consume ``token`` (of ``named_project`` when the request named one) and sign its owner
    in; ``actor`` is the anonymous caller, ``device`` what it says of itself (recorded with the
    attempt). A refused token records a failed attempt (when its project is known) and raises
    TokenConsumed, TokenExpired or TokenInvalidOrExpired (410), or InvitationNotPending (409)
    for an invitation revoked or expired since; a link refused after it was used up stays used
    up."""
    actor = actor.as_user(None)
    attempt = {"method": "magic_link", "device": device, "ip": actor.ip,
               "user_agent": actor.user_agent}
    digest = token_digest(token)
    fast = await _fast_sign_in(conn, actor, digest, named_project, attempt, settings, iat)
    if fast is not None:
        return fast
    failure: ServiceError | None = None
    async with conn.transaction():
        await conn.execute(repository.LOCK_USER, digest)
        row = await conn.fetchrow(repository.CONSUME, digest, named_project)
        if row is None:
            known = await conn.fetchrow(repository.STATE, digest)
            if known is None or (named_project and known["project_id"] != named_project):
                raise TokenInvalidOrExpired()  # no project of ours to record it in
            failure = _FAILURES[known["state"]]()
            await _refused(conn, actor, attempt, known, failure)
        elif row["user_id"] is not None and row["user_id"] != row["found_user_id"]:
            # The user's address changed since the link was sent: it no longer proves control.
            failure = TokenInvalidOrExpired()
            await _refused(conn, actor, attempt, row, failure)
        elif row["purpose"] == "invitation":
            try:
                async with conn.transaction():  # a savepoint: a refusal keeps the token used up
                    return await _sign_in(conn, actor, row, attempt, settings, iat)
            except ServiceError as err:
                failure = err
                await _refused(conn, actor, attempt, row, failure)
        else:
            return await _sign_in(conn, actor, row, attempt, settings, iat)
    assert failure is not None
    raise failure


async def _fast_sign_in(
    conn: asyncpg.Connection, actor: Actor, digest: bytes, named_project: str | None,
    attempt: dict[str, Any], settings: Settings, iat: int,
) -> SignIn | None:
    """The common sign-in in two round trips and no explicit transaction: a lookup, then one
    statement that uses the link up only if it is still usable and signs in (creating the user on
    a first sign-in). None whenever anything is unusual: the general path then decides."""
    token = await conn.fetchrow(repository.LOOKUP, digest, named_project)
    if token is None or (token["user_id"] is not None and token["user_id"] != token["found_user_id"]):
        return None
    project_id, channel, destination = token["project_id"], token["channel"], token["destination"]
    user_id = token["found_user_id"] or new_id("user")
    actor = actor.as_user(user_id, project_id=project_id)
    head_values: dict[str, object] = {"token_hash": digest}
    if token["found_user_id"] is not None:
        head = repository.known_user_head
    else:
        head = repository.new_user_head
        head_values.update(
            email=destination if channel == "email" else None,
            phone_number=destination if channel == "sms" else None,
            **audit.event_params(
                actor, name="user_event", action="user.created", target_type="user",
                target_id=user_id, user_id=user_id,
                description=f"Created user on first sign-in by {channel}",
                metadata={"source": "magic_link", "channel": channel}),
        )
    session_id = new_id("sess")
    started = await sessions.start_session(
        conn, settings, session_id=session_id, project_id=project_id, user_id=user_id,
        auth_method="magic_link", actor=actor, iat=iat,
        event=_signed_in(actor, attempt, token, session_id), verified=channel, head=head,
        gate=", t", head_values=head_values,
    )
    if started is None:
        return None
    session, refresh_token, user = started
    return SignIn(project_id, session, user, refresh_token)


def _signed_in(actor: Actor, attempt: dict[str, Any], token: asyncpg.Record,
               session_id: str) -> dict[str, object]:
    """The parameters of a successful ``auth.signin_attempt`` (``actor`` is the user)."""
    return audit.event_params(
        actor, action="auth.signin_attempt", project_id=token["project_id"],
        target_type="session", target_id=session_id, user_id=actor.id,
        description="Signed in by magic link",
        metadata={**attempt, "outcome": "success", "channel": token["channel"],
                  "purpose": token["purpose"], "session_id": session_id},
    )


async def _refused(conn: asyncpg.Connection, actor: Actor, attempt: dict[str, Any],
                   token: asyncpg.Record, failure: ServiceError) -> None:
    """``auth.signin_attempt`` with outcome ``failure`` for a refused link."""
    await audit.record(
        conn, actor.as_user(token["user_id"]), action="auth.signin_attempt",
        project_id=token["project_id"], target_type="user", target_id=token["user_id"],
        user_id=token["user_id"], description=f"Magic-link sign-in refused: {failure.code}",
        metadata={**attempt, "outcome": "failure", "reason": failure.code,
                  "channel": token["channel"], "purpose": token["purpose"]},
    )


async def _create_user(conn: asyncpg.Connection, actor: Actor, project_id: str, channel: str,
                       destination: str) -> str:
    """The id of the user a first sign-in by ``destination`` creates (verified: the link proved
    it), with ``user.created`` in the same statement. Another request may be creating the same
    user at this moment (a second link, POST /v1/users): the unique index decides, and the
    loser takes the winner's row."""
    user_id = new_id("user")
    sql, params = repository.CREATE_USER
    values: dict[str, object] = {
        "user_id": user_id, "project_id": project_id,
        "email": destination if channel == "email" else None, "email_verified": channel == "email",
        "phone_number": destination if channel == "sms" else None, "phone_verified": channel == "sms",
        **audit.event_params(
            actor.as_user(user_id, project_id=project_id), name="user_event",
            action="user.created", target_type="user", target_id=user_id, user_id=user_id,
            description=f"Created user on first sign-in by {channel}",
            metadata={"source": "magic_link", "channel": channel}),
    }
    created = await conn.fetchval(sql, *params.bind(values))
    if created is not None:
        return str(created)
    existing = await repository.user_id_by_destination(conn, project_id, channel, destination)
    assert existing is not None
    return existing


async def _sign_in(conn: asyncpg.Connection, actor: Actor, token: asyncpg.Record,
                   attempt: dict[str, Any], settings: Settings, iat: int) -> SignIn:
    project_id, channel = token["project_id"], token["channel"]
    user_id = token["found_user_id"] or await _create_user(conn, actor, project_id, channel,
                                                           token["destination"])
    actor = actor.as_user(user_id, project_id=project_id)
    organization_id = None
    if token["purpose"] == "invitation":
        membership = await organizations.accept_invitation(
            conn, actor, invitation_id=token["invitation_id"], user_id=user_id)
        organization_id = membership.organization_id
    session_id = new_id("sess")
    started = await sessions.start_session(
        conn, settings, session_id=session_id, project_id=project_id, user_id=user_id,
        auth_method="magic_link", actor=actor, iat=iat,
        event=_signed_in(actor, attempt, token, session_id), organization_id=organization_id,
        verified=channel,
    )
    assert started is not None  # the default head raises instead
    session, refresh_token, user = started
    return SignIn(project_id, session, user, refresh_token)
