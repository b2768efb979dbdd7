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
from control_plane.risk import service as risk
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import SignIn
from control_plane.web.actor import Actor

_FAILURES: Final = {"consumed": TokenConsumed, "expired": TokenExpired}



async def redeem(conn: asyncpg.Connection, actor: Actor, *, token: str, named_project: str | None,
                 device: dict[str, Any], settings: Settings, iat: int,
                 risk_engine: risk.RiskEngine) -> SignIn:
    """Consume ``token`` (of ``named_project`` when the request named one) and sign its owner
    in; ``actor`` is the anonymous caller, ``device`` what it says of itself (recorded with the
    attempt and scored by the risk engine). A refused token records a failed attempt (when its
    project is known) and raises TokenConsumed, TokenExpired or TokenInvalidOrExpired (410), or
    InvitationNotPending (409) for an invitation revoked or expired since; a link refused after
    it was used up stays used up. A sign-in the risk engine refuses raises StepUpRequired or
    BlockedByRiskPolicy once its decision is recorded (the link is used up). A step-up link
    (``purpose`` ``step_up``) satisfies its challenge and starts the challenged sign-in's
    session; a challenge no longer pending refuses it (UnknownOrExpiredChallenge)."""
    actor = actor.as_user(None)
    attempt = {"method": "magic_link", "device": device, "ip": actor.ip,
               "user_agent": actor.user_agent}
    digest = token_digest(token)
    fast = await _fast_sign_in(conn, actor, digest, named_project, attempt, settings, iat,
                               risk_engine)
    if isinstance(fast, SignIn):
        return fast
    if fast is not None:
        raise fast.error  # committed: the fast path is one statement
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
        elif row["purpose"] in ("invitation", "step_up"):
            try:
                async with conn.transaction():  # a savepoint: a refusal keeps the token used up
                    signed_in = await (_step_up if row["purpose"] == "step_up" else _sign_in)(
                        conn, actor, row, attempt, settings, iat, risk_engine)
                    if isinstance(signed_in, SignIn):
                        return signed_in
                    failure = signed_in.error  # the risk engine's refusal, recorded
            except ServiceError as err:
                failure = err
                await _refused(conn, actor, attempt, row, failure)
        else:
            signed_in = await _sign_in(conn, actor, row, attempt, settings, iat, risk_engine)
            if isinstance(signed_in, SignIn):
                return signed_in
            failure = signed_in.error
    assert failure is not None
    raise failure


async def _fast_sign_in(
    conn: asyncpg.Connection, actor: Actor, digest: bytes, named_project: str | None,
    attempt: dict[str, Any], settings: Settings, iat: int, risk_engine: risk.RiskEngine,
) -> SignIn | sessions.Refused | None:
    """The common sign-in in a few round trips and no explicit transaction: a lookup, the risk
    engine's read, then one statement that uses the link up only if it is still usable and
    signs in (creating the user on a first sign-in), or records the risk engine's refusal
    (returned: committed). None whenever anything is unusual: the general path then decides."""
    lookup = repository.LOOKUPS[risk_engine.on]
    values: dict[str, object] = {"token_hash": digest, "named_project": named_project}
    if risk_engine.on:
        values.update(risk_engine.history_values(actor.ip, actor.user_agent, attempt["device"]))
    token = await conn.fetchrow(lookup.sql, *lookup.params.bind(values))
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
        event=_signed_in(actor, attempt, token, session_id), risk_engine=risk_engine,
        hints=attempt["device"], new_user=token["found_user_id"] is None,
        risk_known=token if risk_engine.on else None,
        verified=channel, head=head, gate=", t", head_values=head_values,
    )
    if started is None or isinstance(started, sessions.Refused):
        return started
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
                   attempt: dict[str, Any], settings: Settings, iat: int,
                   risk_engine: risk.RiskEngine) -> SignIn | sessions.Refused:
    project_id, channel = token["project_id"], token["channel"]
    new_user = token["found_user_id"] is None
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
        event=_signed_in(actor, attempt, token, session_id), risk_engine=risk_engine,
        hints=attempt["device"], new_user=new_user, organization_id=organization_id,
        verified=channel,
    )
    assert started is not None  # the default head raises instead
    if isinstance(started, sessions.Refused):
        return started
    session, refresh_token, user = started
    return SignIn(project_id, session, user, refresh_token)


async def _step_up(conn: asyncpg.Connection, actor: Actor, token: asyncpg.Record,
                   attempt: dict[str, Any], settings: Settings, iat: int,
                   risk_engine: risk.RiskEngine) -> SignIn | sessions.Refused:
    """A step-up link, used up: its challenge satisfied (``auth.step_up_satisfied``) and the
    challenged sign-in's session started, in this transaction. Raises
    UnknownOrExpiredChallenge when the challenge is no longer pending (used, failed, expired),
    TokenInvalidOrExpired when it was raced to meanwhile."""
    project_id, user_id = token["project_id"], token["user_id"]
    challenge = await risk.find_challenge(conn, project_id, token["step_up_id"])
    actor = actor.as_user(user_id, project_id=project_id)
    session_id = new_id("sess")
    event = audit.event_params(
        actor, action="auth.step_up_satisfied", project_id=project_id,
        target_type="step_up_challenge", target_id=challenge.id, user_id=user_id,
        description=f"Step-up satisfied by a link sent by {token['channel']}",
        metadata={**attempt, "method": "step_up_magic_link", "outcome": "success",
                  "channel": token["channel"], "challenge_id": challenge.id,
                  "decision_id": challenge.decision_id, "primary_method": challenge.method,
                  "session_id": session_id})
    started = await sessions.start_session(
        conn, settings, session_id=session_id, project_id=project_id, user_id=user_id,
        auth_method=challenge.method, actor=actor, iat=iat, event=event,
        risk_engine=risk_engine, hints=attempt["device"], step_up=True,
        organization_id=challenge.organization_id, verified=token["channel"],
        head=repository.step_up_head, gate=", su",
        head_values={"su_id": challenge.id, "su_method": "magic_link"},
    )
    if started is None or isinstance(started, sessions.Refused):
        raise TokenInvalidOrExpired("The step-up was used or expired meanwhile; sign in again.")
    session, refresh_token, user = started
    return SignIn(project_id, session, user, refresh_token)
