"""Session rules: the state table of SPEC.md 3.

* :func:`start_session`: a sign-in (any method) ends here, in one statement: the session, its
  first refresh token, the user's ``last_sign_in_at`` and the audit event. A user with exactly
  one active membership gets that organization selected.
* :func:`change_organization`: ``select-org`` once per session (``org_already_selected``
  otherwise, unless it is the same organization); ``switch-org`` to another organization with
  an active membership (``session.org_switched``; ``no_org_selected`` before a first
  selection); ``not_a_member`` without an active membership.
* :func:`refresh`: refresh token rotation. A rotated token presented again revokes the whole
  session (reuse detection, as the OAuth 2.0 Security BCP, RFC 9700 4.14.2, recommends), except
  a token the client presented less than ``SERVICE_REFRESH_REUSE_GRACE_SECONDS`` ago with no
  newer one presented since, so that a lost response or racing requests do not log the user
  out. A membership that is no longer active drops the organization context.
* :func:`revoke_current`: revokes the session (every organization context: the session id is
  what every token carries) and announces it to verifiers (``revocation``).

Failures are ``no_session`` (401) with ``details.reason``: ``missing``, ``token_invalid``,
``token_expired``, ``session_revoked``, ``session_expired``, ``unknown_refresh_token``,
``refresh_token_reused``.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

import asyncpg

from common.access_tokens import AccessClaims
from common.auth import token_digest
from common.errors import (
    BlockedByRiskPolicy,
    NoOrgSelected,
    NoSession,
    NotAMember,
    OrgAlreadySelected,
    ServiceError,
    StepUpRequired,
)
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.risk import service as risk
from control_plane.sessions import repository
from control_plane.sessions.repository import Head, user_update
from control_plane.sessions.revocation import (
    record_key_revocation,
    revoke_session,
    revoke_user_sessions,
)
from control_plane.sessions.schemas import CurrentSession, Grant, RevokedSession, Session
from control_plane.sessions.tokens import TokenService
from control_plane.users.schemas import User
from control_plane.web.actor import Actor

__all__ = ["CurrentSession", "Grant", "Head", "Refused", "change_organization", "current_session",
           "ensure_active", "grant", "record_key_revocation", "refresh", "revoke_current",
           "revoke_user_sessions", "start_session", "user_update"]

REFRESH_PREFIX: Final = "rt_"


def new_refresh_token() -> tuple[str, bytes]:
    """(plaintext, stored SHA-256 digest) of a new opaque refresh token."""
    token = REFRESH_PREFIX + secrets.token_urlsafe(32)
    return token, token_digest(token)


# --- signing in --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refused:
    """A sign-in the risk engine refused: its statement committed the decision, the events and,
    for a challenge, the step-up challenge; the caller raises ``error`` (StepUpRequired or
    BlockedByRiskPolicy) once its transaction has committed."""

    error: ServiceError


def _with_risk(event: Mapping[str, object], a: risk.Assessment, *, step_up: bool = False,
               refused: bool = False) -> dict[str, object]:
    """The caller's ``auth.signin_attempt`` with the decision (SPEC.md 6: score, decision,
    reasons) and the device as the risk engine knows it (its label and fingerprint beside what
    the client sent). ``refused``: the event was written for a success and the risk engine
    challenged or blocked the sign-in: outcome ``challenged`` or ``blocked``, about the
    decision, no session. ``step_up``: the event (``auth.step_up_satisfied``) names the
    challenged decision already: only the device is added."""
    metadata = dict(event["event_metadata"])  # type: ignore[call-overload]
    changed: dict[str, object] = {}
    if not step_up:
        metadata.update(a.attempt_metadata())
    if a.device is not None:
        metadata["device"] = {**dict(metadata.get("device") or {}), "label": a.device.label,
                              "fingerprint": a.device.fingerprint}
    if refused:
        outcome = "challenged" if a.decision == "challenge" else "blocked"
        description = f"Sign-in {outcome} by the risk engine (score {a.score})"
        metadata.pop("session_id", None)
        metadata.update(outcome=outcome, description=description)
        changed = {"event_description": description, "event_target_type": "risk_decision",
                   "event_target_id": a.decision_id}
    return {**event, "event_metadata": metadata, **changed}


async def start_session(
    conn: asyncpg.Connection, settings: Settings, *, session_id: str, project_id: str,
    user_id: str, auth_method: str, actor: Actor, iat: int, event: Mapping[str, object],
    risk_engine: risk.RiskEngine, hints: Mapping[str, Any] | None = None, new_user: bool = False,
    step_up: bool = False, risk_known: asyncpg.Record | None = None,
    organization_id: str | None = None,
    verified: Literal["email", "sms"] | None = None, head: Head = user_update, gate: str = "",
    head_values: Mapping[str, object] | None = None,
) -> tuple[Session, str, User] | Refused | None:
    """Score the sign-in of ``user_id`` with the risk engine, then sign the user in, in one
    statement (``repository.sign_in_statement``): the session ``session_id``
    (``new_id("sess")``), its first refresh token, the user's ``last_sign_in_at`` (and the
    ``verified`` channel marked verified), the audit ``event`` (``audit.event_params`` of
    ``auth.signin_attempt``; the organization picked and the decision are merged into its
    metadata), the risk decision with ``auth.risk_evaluated``, and what the sign-in teaches
    the risk engine (device, network, country, location). Returns (the session, its refresh
    token, the user).

    The risk engine (``risk_engine.assess``) sees the request's address and user agent
    (``actor``) and the client ``hints``; ``new_user``: the user is created by this sign-in (no
    history); ``risk_known``: the row the caller's own lookup read through
    ``risk.history_join`` (the risk engine then reads nothing). A ``challenge`` or ``block``
    runs ``repository.refusal_statement`` instead (the head still uses up its proof; the
    decision, the events and a challenge's step-up challenge are written, no session) and
    returns :class:`Refused`, whose error the caller raises once its transaction committed.
    ``step_up``: this sign-in ends a step-up (its head used the challenge up): not scored
    again, only its facts remembered.

    The organization is ``organization_id`` when given (an accepted invitation) and the
    membership there is active, else the one organization of a user with exactly one active
    membership (SPEC.md 3), else none.

    ``head`` replaces the CTE ``u`` that yields the user's row: a caller may create the user
    there, or make the sign-in conditional on CTEs of its own, named in ``gate`` (``", t"``: the
    session is inserted only if ``u`` and ``t`` yield rows; otherwise nothing is written and
    None is returned), its parameters in ``head_values``. With the default head, a user deleted
    meanwhile raises NoSession.
    """
    attempt = risk.SignInAttempt(project_id=project_id, user_id=user_id, new_user=new_user,
                                 ip=actor.ip, user_agent=actor.user_agent, hints=dict(hints or {}))
    assessment = (risk_engine.observe(attempt) if step_up
                  else await risk_engine.assess(conn, attempt, known=risk_known))
    common: dict[str, object] = {
        "project_id": project_id, "user_id": user_id, "organization_id": organization_id,
        "verified_email": verified == "email", "verified_sms": verified == "sms",
        **(head_values or {}),
    }
    if assessment.decision != "allow":
        return await _refuse(conn, settings, actor, assessment, event, common, head, gate,
                             method=auth_method)
    refresh_token, digest = new_refresh_token()
    statement = repository.sign_in_statement(head, gate)
    values: dict[str, object] = {
        **common, "session_id": session_id, "auth_method": auth_method, "ip": actor.ip,
        "user_agent": actor.user_agent, "signing_in": True,
        "session_ttl": timedelta(seconds=settings.session_ttl_seconds),
        "access_expires": iat + settings.access_token_ttl_seconds, "refresh_hash": digest,
        **_with_risk(event, assessment, step_up=step_up),
        **risk.allowed_values(assessment, actor, project_id=project_id, method=auth_method),
    }
    row = await conn.fetchrow(statement.sql, *statement.params.bind_from(values))
    if row is None:
        if head is not user_update:
            return None
        raise NoSession("The user no longer exists.", details={"reason": "session_revoked"})
    return repository.session_of(row, row["role"]), refresh_token, repository.user_of(row, "user_")


async def _refuse(conn: asyncpg.Connection, settings: Settings, actor: Actor,
                  a: risk.Assessment, event: Mapping[str, object], common: dict[str, object],
                  head: Head, gate: str, *, method: str) -> Refused | None:
    """Record a sign-in by ``method`` the risk engine challenged or blocked
    (``repository.refusal_statement``) and answer the error to raise; None when the head's gate
    failed (nothing written)."""
    project_id = str(common["project_id"])
    challenge_id = new_id("chal")
    ttl = timedelta(seconds=settings.step_up_ttl_seconds)
    statement = repository.refusal_statement(head, gate)
    values: dict[str, object] = {
        **common, "signing_in": False, **_with_risk(event, a, refused=True),
        **risk.refused_values(a, actor, project_id=project_id, method=method,
                              challenge_id=challenge_id, ttl=ttl),
    }
    row = await conn.fetchrow(statement.sql, *statement.params.bind_from(values))
    if row is None:
        if head is not user_update:
            return None
        raise NoSession("The user no longer exists.", details={"reason": "session_revoked"})
    if a.decision == "block":
        return Refused(BlockedByRiskPolicy(details={"decision_id": a.decision_id}))
    methods = [m for m, possible in (("passkey", row["passkey_possible"]),
                                     ("magic_link", row["link_possible"])) if possible]
    return Refused(StepUpRequired(details={
        "challenge_id": challenge_id, "decision_id": a.decision_id, "methods": methods,
        "expires_in": settings.step_up_ttl_seconds}))


async def grant(tokens: TokenService, settings: Settings, *, project_id: str, session: Session,
                user: User, iat: int, refresh_token: str | None) -> Grant:
    """Sign the access token for ``session`` and assemble the answer."""
    access = await tokens.issue(
        project_id=project_id, user_id=session.user_id, session_id=session.id,
        org_id=session.organization_id, role=session.role, iat=iat,
    )
    return Grant(session, user, access, "Bearer", settings.access_token_ttl_seconds,
                 refresh_token)


# --- the current session -----------------------------------------------------------------------


async def current_session(conn: asyncpg.Connection, claims: AccessClaims, *,
                          for_update: bool = False) -> Session:
    """The session of verified access-token ``claims`` (of the project ``claims.pid``), while
    active; ``for_update`` locks its row. Raises NoSession."""
    row = await repository.find_session(conn, claims.sid, for_update=for_update)
    if row is None or row["project_id"] != claims.pid or row["user_id"] != claims.sub:
        raise NoSession("The session no longer exists.", details={"reason": "session_revoked"})
    if row["status"] != "active":
        raise NoSession("The session was revoked.", details={"reason": "session_revoked"})
    if row["expired"]:
        raise NoSession("The session expired.", details={"reason": "session_expired"})
    return repository.session_of(row, None)


async def ensure_active(conn: asyncpg.Connection, claims: AccessClaims) -> None:
    """Raises NoSession unless the session of ``claims`` is still active (the check
    ``control_plane.web.auth.Session`` runs before reading a body)."""
    await current_session(conn, claims)


async def _user(conn: asyncpg.Connection, user_id: str) -> User:
    user = await repository.find_user(conn, user_id)
    if user is None:
        raise NoSession("The user no longer exists.", details={"reason": "session_revoked"})
    return user


async def describe(conn: asyncpg.Connection, claims: AccessClaims) -> CurrentSession:
    """The caller's session, with its role, and its user. Raises NoSession."""
    session = await current_session(conn, claims)
    user = await _user(conn, session.user_id)
    if session.organization_id:
        role = await repository.active_role(conn, session.user_id, session.organization_id)
        session = dataclasses.replace(session, role=role)
    return CurrentSession(session, user)


async def change_organization(
    pool: asyncpg.Pool, actor: Actor, *, claims: AccessClaims, organization_id: str,
    switch: bool, tokens: TokenService, settings: Settings, iat: int,
) -> Grant:
    """Select (``switch`` False) or switch to ``organization_id`` for the caller's session and
    answer a new access token carrying it, signed once the connection is back in the pool (a
    signing key may have to be loaded through the pool). Raises NoSession, NoOrgSelected,
    OrgAlreadySelected, NotAMember."""
    async with pool.acquire() as conn, conn.transaction():
        session = await current_session(conn, claims, for_update=True)
        project_id = claims.pid
        previous = session.organization_id
        if switch and previous is None:
            raise NoOrgSelected()
        if not switch and previous is not None and previous != organization_id:
            raise OrgAlreadySelected(details={"organization_id": previous})
        role = None
        if is_id(organization_id, "org"):
            role = await repository.active_role(conn, session.user_id, organization_id,
                                                project_id=project_id)
        if role is None:
            raise NotAMember(details={"organization_id": organization_id})
        row = await repository.select_organization(
            conn, session.id, organization_id, iat + settings.access_token_ttl_seconds)
        if switch and previous != organization_id:
            await audit.record(
                conn, actor, action="session.org_switched", target_type="session",
                target_id=session.id, user_id=session.user_id,
                description=f"Switched organization from {previous} to {organization_id}",
                metadata={"from_organization_id": previous,
                          "to_organization_id": organization_id, "role": role},
            )
        user = await _user(conn, session.user_id)
    return await grant(tokens, settings, project_id=project_id,
                       session=repository.session_of(row, role), user=user, iat=iat,
                       refresh_token=None)


def successor_of(token: str, kms: LocalKms) -> tuple[str, bytes]:
    """(plaintext, digest) of the refresh token that replaces ``token``: ``rt_`` and the
    base64url HMAC-SHA256 of ``token`` under the KMS key for refresh successors, as random-looking
    as a new token to anyone without the KEK. Derived rather than drawn, so a second presentation
    of ``token`` within the grace finds the same successor without storing anything but digests."""
    mac = kms.mac(b"refresh_successor", token.encode())
    successor = REFRESH_PREFIX + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    return successor, token_digest(successor)


async def refresh(pool: asyncpg.Pool, actor: Actor, *, token: str, tokens: TokenService,
                  kms: LocalKms, settings: Settings, iat: int) -> Grant:
    """Rotate the refresh ``token`` and answer a new access token (signed once the connection is
    back in the pool: a signing key may have to be loaded through the pool).

    The rotation is one statement (``repository.REFRESH``): it locks the session, then reads
    the token's state. A current token rotates every current generation of the session and
    remembers its successor, which is derived from it (``successor_of``). A rotated token is forgiven only if the client
    presented it before, less than the grace period ago, and no newer generation has been
    presented since (a retry after a lost answer, two tabs refreshing at once); a forgiven token
    is answered with the same successor while that one is still current, so every presentation
    ends with one pair (as Auth0's and Okta's reuse interval do), else with a new generation. A
    token that was superseded without ever being presented, or one older than a presented
    successor, means two parties hold the session's tokens: the session is revoked
    (``session.revoked``, committed with its revocation for the announcer) and NoSession
    raised. Raises NoSession for an unknown token or an inactive session too.
    """
    digest = token_digest(token)
    new_token, new_digest = successor_of(token, kms)
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            repository.REFRESH, digest, new_digest,
            timedelta(seconds=settings.refresh_reuse_grace_seconds),
            iat + settings.access_token_ttl_seconds,
        )
        assert row is not None
        outcome, sess = row["outcome"], row["sess"]
        if outcome == "unknown":
            raise NoSession("Unknown refresh token.", details={"reason": "unknown_refresh_token"})
        if outcome == "revoked":
            raise NoSession("The session was revoked.", details={"reason": "session_revoked"})
        if outcome == "expired":
            raise NoSession("The session expired.", details={"reason": "session_expired"})
        if outcome == "reused":
            user_actor = actor.as_user(sess["user_id"], project_id=sess["project_id"])
            async with conn.transaction():
                if await revoke_session(conn, sess["id"], reason="refresh_token_reused") is None:
                    # revoked meanwhile by another request
                    raise NoSession("The session was revoked.",
                                    details={"reason": "session_revoked"})
                await audit.record(
                    conn, user_actor, action="session.revoked", target_type="session",
                    target_id=sess["id"], user_id=sess["user_id"],
                    description="Revoked the session: a rotated refresh token was presented again",
                    metadata={"reason": "refresh_token_reused", "generation": row["generation"],
                              "latest_generation": row["latest"]},
                )
            raise NoSession("This refresh token was already used; the session has been revoked.",
                            details={"reason": "refresh_token_reused"})
    assert outcome in ("rotated", "replayed")  # either way, the successor derived above
    role = row["role"]  # None: the membership ended since, the org context was dropped
    return await grant(tokens, settings, project_id=sess["project_id"],
                       session=repository.session_of(sess, role), user=repository.user_of(row),
                       iat=iat, refresh_token=new_token)


async def revoke_current(conn: asyncpg.Connection, actor: Actor, *,
                         claims: AccessClaims) -> RevokedSession:
    """Revoke the caller's session (``session.revoked``), committed with its revocation, which
    the announcer puts on Redis (never waited for here). Raises NoSession."""
    async with conn.transaction():
        session = await current_session(conn, claims, for_update=True)
        revoked = await revoke_session(conn, session.id, reason="revoked")
        assert revoked is not None  # locked and active above
        await audit.record(
            conn, actor, action="session.revoked", target_type="session", target_id=session.id,
            user_id=session.user_id, description="Revoked the session",
            metadata={"reason": "revoked", "organization_id": session.organization_id},
        )
    return RevokedSession(revoked)

