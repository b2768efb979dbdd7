"""Passkey rules (WebAuthn): a project's relying party, registration for a signed-in user, login,
and a user's passkeys. Every verification is py_webauthn's (``webauthn``); nothing of WebAuthn
is done here by hand.

Challenges are stored server side (``webauthn_challenges``) for
``SERVICE_WEBAUTHN_CHALLENGE_TTL_SECONDS`` and found by the value in the response's
``clientDataJSON``. A verify spends its challenge first, whatever happens next (single use); an
unknown, spent or expired challenge, or one of the other ceremony, project or user, is
UnknownOrExpiredChallenge (400). A login challenge may also be of no project yet
(:func:`open_authentication_options`, for a relying party several projects share: the operator
console's); only :func:`sign_in` with ``open_challenge`` takes it, in the project its caller
found from the credential's user handle (:func:`user_handle`). A response that does not
verify (signature, origin, RP id, user verification when required, type, an unknown, deleted or
other project's credential, a counter that went backwards on a credential that counts: a
clone) is VerificationFailed (400).

A login is a sign-in like a magic link's (``sessions.start_session``, method ``passkey``): the
credential's counter update, the session and ``auth.signin_attempt`` commit in one statement.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any, Final, NoReturn

import asyncpg
from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import base64url_to_bytes, options_to_json_dict, parse_client_data_json
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    AuthenticatorTransport,
    CredentialDeviceType,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from common.errors import (
    InvalidRequest,
    NotFound,
    ServiceError,
    UnknownOrExpiredChallenge,
    UserNotFound,
    VerificationFailed,
)
from common.ids import new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.passkeys import repository
from control_plane.passkeys.schemas import (
    AuthenticationResponseBody,
    Passkey,
    RegistrationResponseBody,
    WebAuthnConfig,
    WebAuthnSettings,
)
from control_plane.risk import service as risk
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import SignIn
from control_plane.web.actor import Actor

DEFAULT_NAME: Final = "Passkey"
CHALLENGE_BYTES: Final = 32
TIMEOUT_MS: Final = 300_000
"""The ``timeout`` hint of both ceremonies' options, in milliseconds."""
REGISTRATION: Final = "registration"
AUTHENTICATION: Final = "authentication"
_TRANSPORTS: Final = frozenset(t.value for t in AuthenticatorTransport)



# --- the relying party --------------------------------------------------------------------------


async def configure(conn: asyncpg.Connection, actor: Actor, *,
                    config: WebAuthnConfig | None) -> dict[str, Any] | None:
    """Set the actor's project's relying party to ``config`` (None: passkeys off; the
    credentials stay, unusable until it is set again), in ``conn``'s transaction. Returns what
    changed (``{"from", "to"}``, each the settings or None), or None when nothing did. The
    caller records it in its ``project.updated``."""
    project_id = actor.project_id
    assert project_id is not None
    before = await repository.settings_of(conn, project_id)
    after = None if config is None else WebAuthnSettings(
        config.rp_id, config.rp_name, config.origins, config.user_verification)
    if before == after:
        return None
    if after is None:
        await repository.delete_settings(conn, project_id)
    else:
        await repository.put_settings(conn, project_id, after)
    return {"from": _settings_dict(before), "to": _settings_dict(after)}


def _settings_dict(s: WebAuthnSettings | None) -> dict[str, Any] | None:
    return None if s is None else {"rp_id": s.rp_id, "rp_name": s.rp_name, "origins": s.origins,
                                   "user_verification": s.user_verification}


async def relying_party(conn: asyncpg.Connection | asyncpg.Pool,
                        project_id: str) -> WebAuthnSettings | None:
    """The project's relying party, None while passkeys are not configured."""
    return await repository.settings_of(conn, project_id)


async def _required(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> WebAuthnSettings:
    rp = await repository.settings_of(conn, project_id)
    if rp is None:
        raise _not_configured()
    return rp


def _not_configured() -> InvalidRequest:
    return InvalidRequest.field(
        "webauthn", "passkeys are not configured for this project: set its relying party with "
                    "PATCH /v1/projects/me {\"webauthn\": {\"rp_id\", \"rp_name\", \"origins\"}}")


def _descriptors(rows: list[asyncpg.Record]) -> list[PublicKeyCredentialDescriptor]:
    return [PublicKeyCredentialDescriptor(
        id=bytes(r["credential_id"]),
        transports=[AuthenticatorTransport(t) for t in r["transports"] if t in _TRANSPORTS] or None,
    ) for r in rows]


def _uv(value: str) -> UserVerificationRequirement:
    return UserVerificationRequirement(value)


async def _store_challenge(conn: asyncpg.Connection, settings: Settings, challenge: bytes, *,
                           project_id: str, ceremony: str, user_id: str | None, name: str | None,
                           user_verification: str) -> None:
    await repository.insert_challenge(
        conn, digest=hashlib.sha256(challenge).digest(), project_id=project_id,
        ceremony=ceremony, user_id=user_id, name=name, user_verification=user_verification,
        ttl=timedelta(seconds=settings.webauthn_challenge_ttl_seconds))


def _bytes(text: str) -> bytes | None:
    """base64url ``text`` decoded, None when it is not base64url."""
    try:
        return base64url_to_bytes(text)
    except ValueError:  # binascii.Error
        return None


def _challenge_of(client_data_json: str) -> bytes:
    """The challenge a response's ``clientDataJSON`` (base64url) carries. Raises
    UnknownOrExpiredChallenge when there is none to read."""
    try:
        return parse_client_data_json(base64url_to_bytes(client_data_json)).challenge
    except (WebAuthnException, ValueError, KeyError, TypeError):
        raise UnknownOrExpiredChallenge(
            "clientDataJSON holds no challenge this service issued.") from None


# --- registration -------------------------------------------------------------------------------


async def registration_options(conn: asyncpg.Connection, actor: Actor, *, name: str | None,
                               settings: Settings,
                               account: str | None = None) -> dict[str, Any]:
    """Creation options (``PublicKeyCredentialCreationOptionsJSON``, as a dict) for the
    signed-in ``actor`` (a user) to register a passkey named ``name``: a discoverable credential
    (resident key required, so usernameless login finds it), no attestation, the user's
    passkeys excluded, and the challenge stored. The user handle is the user's id (UTF-8),
    which is no personal data. ``account``: what the authenticator's account chooser shows
    after the user's name (``Olga (Acme operators)``), for relying parties that several
    projects share. Raises InvalidRequest naming ``webauthn`` when the project has no relying
    party, UserNotFound when the user is gone."""
    project_id, user_id = actor.project_id, actor.id
    assert project_id is not None and user_id is not None
    rp = await _required(conn, project_id)
    user = await repository.user_names(conn, project_id, user_id)
    if user is None:
        raise UserNotFound()
    label = user["email"] or user["phone_number"] or user_id
    options = generate_registration_options(
        rp_id=rp.rp_id, rp_name=rp.rp_name, user_id=user_id.encode(), user_name=label,
        user_display_name=(user["name"] or label) + (f" ({account})" if account else ""),
        timeout=TIMEOUT_MS,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.REQUIRED, require_resident_key=True,
            user_verification=_uv(rp.user_verification)),
        exclude_credentials=_descriptors(await repository.credentials_of(conn, project_id, user_id)),
    )
    await _store_challenge(conn, settings, options.challenge, project_id=project_id,
                           ceremony=REGISTRATION, user_id=user_id, name=name,
                           user_verification=rp.user_verification)
    return dict(options_to_json_dict(options))


async def register(conn: asyncpg.Connection, actor: Actor, *,
                   credential: RegistrationResponseBody) -> Passkey:
    """Verify ``credential`` (a registration response) against the challenge it carries, which
    must be the actor's own registration challenge, and store the passkey with
    ``passkey.created`` in one transaction.

    Raises UnknownOrExpiredChallenge, VerificationFailed (the response does not verify, or the
    project already has that credential), InvalidRequest naming ``webauthn`` when the project no
    longer has a relying party."""
    project_id, user_id = actor.project_id, actor.id
    assert project_id is not None and user_id is not None
    challenge = _challenge_of(credential.response.clientDataJSON)
    spent = await conn.fetchrow(repository.SPEND_CHALLENGE, hashlib.sha256(challenge).digest())
    if (spent is None or spent["expired"] or spent["ceremony"] != REGISTRATION
            or spent["project_id"] != project_id or spent["user_id"] != user_id):
        raise UnknownOrExpiredChallenge()
    rp = await _required(conn, project_id)
    try:
        verified = verify_registration_response(
            credential=credential.model_dump(), expected_challenge=challenge,
            expected_rp_id=rp.rp_id, expected_origin=rp.origins,
            require_user_verification=spent["user_verification"] == "required")
    except Exception as exc:  # py_webauthn's refusal, or a parser's on a malformed response
        raise VerificationFailed(f"The registration response does not verify: {exc}") from None
    passkey_id = new_id("pk")
    transports = sorted({t for t in credential.response.transports or () if t in _TRANSPORTS})
    async with conn.transaction():
        passkey = await repository.insert_passkey(conn, {
            "id": passkey_id, "project_id": project_id, "user_id": user_id,
            "credential_id": verified.credential_id, "public_key": verified.credential_public_key,
            "sign_count": verified.sign_count, "transports": transports,
            "aaguid": verified.aaguid,
            "backup_eligible": verified.credential_device_type == CredentialDeviceType.MULTI_DEVICE,
            "backup_state": verified.credential_backed_up,
            "name": spent["name"] or DEFAULT_NAME,
        })
        if passkey is None:
            raise VerificationFailed("This credential is already registered.")
        await audit.record(
            conn, actor, action="passkey.created", target_type="passkey", target_id=passkey_id,
            user_id=user_id, description=f"Registered passkey {passkey.name!r}",
            metadata={"passkey_id": passkey_id, "name": passkey.name, "aaguid": passkey.aaguid,
                      "backup_eligible": passkey.backup_eligible,
                      "user_verified": verified.user_verified})
    return passkey


# --- login --------------------------------------------------------------------------------------


async def authentication_options(conn: asyncpg.Connection, actor: Actor, *, email: str | None,
                                 settings: Settings,
                                 step_up: risk.Challenge | None = None) -> dict[str, Any]:
    """Request options (``PublicKeyCredentialRequestOptionsJSON``, as a dict) for a login in
    the actor's project, and the challenge stored. Without ``email``, ``allowCredentials`` is
    empty: any discoverable credential (usernameless, conditional UI). With it, the user's
    passkeys are listed, and the challenge is that user's (a response from another user's
    passkey is refused); an email no user has gets empty ``allowCredentials``. With
    ``step_up``, the challenged user's passkeys, and the challenge serves that step-up only.
    Raises InvalidRequest naming ``webauthn`` when the project has no relying party."""
    project_id = actor.project_id
    assert project_id is not None
    user_id: str | None = None
    rows: list[asyncpg.Record] = []
    if step_up is not None:
        user_id = step_up.user_id
        rows = await repository.credentials_of(conn, project_id, user_id)
    elif email is not None:
        user_id, rows = await repository.credentials_by_email(conn, project_id, email)
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    rp = await conn.fetchrow(
        repository.ISSUE_LOGIN_CHALLENGE, hashlib.sha256(challenge).digest(), user_id,
        timedelta(seconds=settings.webauthn_challenge_ttl_seconds), project_id,
        step_up.id if step_up is not None else None)
    if rp is None:
        raise _not_configured()
    options = generate_authentication_options(
        rp_id=rp["rp_id"], challenge=challenge, timeout=TIMEOUT_MS,
        allow_credentials=_descriptors(rows), user_verification=_uv(rp["user_verification"]))
    return dict(options_to_json_dict(options))


async def open_authentication_options(conn: asyncpg.Connection, *, rp_id: str,
                                      user_verification: str,
                                      settings: Settings) -> dict[str, Any]:
    """Request options for a usernameless login in no project yet: any discoverable credential
    of the relying party ``rp_id`` (``allowCredentials`` empty), ``user_verification``
    (``preferred`` or ``required``). The challenge is stored with no project, user or step-up
    (migration 0021); only :func:`sign_in` with ``open_challenge`` accepts it, once the caller
    found the project from the credential (:func:`user_handle`). For relying parties that
    several projects share: the operator console's, whose operator projects all have the
    service's own host."""
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    await repository.insert_challenge(
        conn, digest=hashlib.sha256(challenge).digest(), project_id=None,
        ceremony=AUTHENTICATION, user_id=None, name=None, user_verification=user_verification,
        ttl=timedelta(seconds=settings.webauthn_challenge_ttl_seconds))
    options = generate_authentication_options(
        rp_id=rp_id, challenge=challenge, timeout=TIMEOUT_MS, allow_credentials=[],
        user_verification=_uv(user_verification))
    return dict(options_to_json_dict(options))


def user_handle(credential: AuthenticationResponseBody) -> str | None:
    """The user handle of an authentication response as text: the id of the user the
    credential was registered for (:func:`registration_options` makes it the user's id). None
    when the response has none (a credential that is not discoverable) or it is not base64url
    UTF-8. Not verified here: :func:`sign_in` checks it is the credential's user."""
    handle = credential.response.userHandle
    raw = _bytes(handle) if handle else None
    try:
        return raw.decode() if raw else None
    except UnicodeDecodeError:
        return None


async def discard_open_login(conn: asyncpg.Connection,
                             credential: AuthenticationResponseBody) -> None:
    """Spend the challenge of ``credential`` when it is one of no project
    (:func:`open_authentication_options`): a login refused before any project was found for it
    (single use, as every verify). Nothing for any other challenge, or none."""
    try:
        challenge = _challenge_of(credential.response.clientDataJSON)
    except UnknownOrExpiredChallenge:
        return
    await conn.execute(repository.SPEND_OPEN_CHALLENGE, hashlib.sha256(challenge).digest())


async def sign_in(conn: asyncpg.Connection, actor: Actor, *,
                  credential: AuthenticationResponseBody, device: dict[str, Any],
                  settings: Settings, iat: int, risk_engine: risk.RiskEngine,
                  step_up: risk.Challenge | None = None,
                  open_challenge: bool = False) -> SignIn:
    """Verify ``credential`` (an authentication response) in the actor's project and sign its
    user in. One read finds the challenge, the relying party and the credential; after
    py_webauthn verified the response, one statement spends the challenge, updates the
    credential's counter and last use, and writes the session, the user's ``last_sign_in_at``
    and ``auth.signin_attempt`` (method ``passkey``; ``device`` what the client says of
    itself); the organization is picked as for every sign-in. A refusal spends the challenge
    and, once the challenge was found, records a failed ``auth.signin_attempt``, in one
    transaction. Two verifies of one challenge at once: one signs in, the other is refused.

    The sign-in is scored by the risk engine (``sessions.start_session``): a challenge or a
    block raises StepUpRequired or BlockedByRiskPolicy once recorded. With ``step_up`` (a
    pending challenge of this project), this login is that challenge's step-up: the options
    must have been issued for it, the passkey must be the challenged user's, and the challenge
    is used up by the sign-in (``auth.step_up_satisfied``), or by any refusal (``failed``).
    With ``open_challenge``, the options were :func:`open_authentication_options` (no project)
    and the actor's project is the one the caller found for the credential; a challenge of a
    project is then refused, as an open one is without it.

    Raises UnknownOrExpiredChallenge, VerificationFailed, InvalidRequest naming ``webauthn``
    when the project has no relying party, StepUpRequired, BlockedByRiskPolicy."""
    project_id = actor.project_id
    assert project_id is not None
    challenge = _challenge_of(credential.response.clientDataJSON)
    digest = hashlib.sha256(challenge).digest()
    attempt = {"method": "step_up_passkey" if step_up else "passkey", "device": device,
               "ip": actor.ip, "user_agent": actor.user_agent}
    if step_up is not None:
        attempt["challenge_id"] = step_up.id
    row = await conn.fetchrow(repository.READ_FOR_LOGIN, digest, project_id,
                              _bytes(credential.rawId) or b"")
    if row is None:
        if step_up is not None:
            await _refused(conn, actor, attempt, None, project_id, step_up.user_id,
                           UnknownOrExpiredChallenge(), step_up=step_up)
        raise UnknownOrExpiredChallenge()
    expected = None if open_challenge else project_id
    if row["expired"] or row["ceremony"] != AUTHENTICATION or row["project_id"] != expected:
        ours = row["project_id"] == expected
        await _refused(conn, actor, attempt, digest, project_id if ours else None,
                       row["user_id"] if ours else None, UnknownOrExpiredChallenge(),
                       step_up=step_up)
    if row["step_up_id"] != (step_up.id if step_up is not None else None):
        await _refused(conn, actor, attempt, digest, project_id, row["user_id"],
                       UnknownOrExpiredChallenge("These options were issued for another step-up "
                                                 "or for a plain login."), step_up=step_up)
    if row["rp_id"] is None:
        await _refused(conn, actor, attempt, digest, None, None, _not_configured(), step_up=step_up)
    user_id: str | None = row["passkey_user_id"]
    if row["user_id"] is not None and user_id is not None and row["user_id"] != user_id:
        await _refused(conn, actor, attempt, digest, project_id, row["user_id"],
                       UnknownOrExpiredChallenge("The challenge was issued for another user."), step_up=step_up)
    if user_id is None:
        await _refused(conn, actor, attempt, digest, project_id, row["user_id"],
                       VerificationFailed("No passkey of this project has that credential id."), step_up=step_up)
    assert user_id is not None
    handle = credential.response.userHandle
    try:
        if handle is not None and _bytes(handle) != user_id.encode():
            raise VerificationFailed("The response's user handle is not the credential's user.")
        verified = verify_authentication_response(
            credential=credential.model_dump(), expected_challenge=challenge,
            expected_rp_id=row["rp_id"], expected_origin=list(row["origins"]),
            credential_public_key=bytes(row["public_key"]),
            credential_current_sign_count=int(row["sign_count"]),
            require_user_verification=row["user_verification"] == "required")
    except Exception as exc:  # py_webauthn's refusal, or a parser's on a malformed response
        await _refused(conn, actor, attempt, digest, project_id, user_id,
                       VerificationFailed(f"The passkey response does not verify: {exc}"), step_up=step_up)
    actor = actor.as_user(user_id, project_id=project_id)
    session_id = new_id("sess")
    head_values: dict[str, object] = {
        "challenge_hash": digest, "passkey_id": row["passkey_id"],
        "sign_count": verified.new_sign_count, "backup_state": verified.credential_backed_up}
    metadata = {**attempt, "outcome": "success", "passkey_id": row["passkey_id"],
                "user_verified": verified.user_verified, "session_id": session_id}
    if step_up is None:
        event = audit.event_params(
            actor, action="auth.signin_attempt", project_id=project_id, target_type="session",
            target_id=session_id, user_id=user_id, description="Signed in by passkey",
            metadata=metadata)
    else:
        event = audit.event_params(
            actor, action="auth.step_up_satisfied", project_id=project_id,
            target_type="step_up_challenge", target_id=step_up.id, user_id=user_id,
            description="Step-up satisfied by passkey",
            metadata={**metadata, "decision_id": step_up.decision_id,
                      "primary_method": step_up.method})
        head_values.update(su_id=step_up.id, su_method="passkey")
    started = await sessions.start_session(
        conn, settings, session_id=session_id, project_id=project_id, user_id=user_id,
        auth_method=step_up.method if step_up else "passkey", actor=actor, iat=iat, event=event,
        risk_engine=risk_engine, hints=device, step_up=step_up is not None,
        organization_id=step_up.organization_id if step_up else None,
        head=repository.passkey_step_up_head if step_up else repository.passkey_head,
        gate=", t, su" if step_up else ", t", head_values=head_values,
    )
    if started is None:  # the challenge or credential changed since the read (see passkey_head)
        await _refused(conn, actor, attempt, digest, project_id, user_id, VerificationFailed(
            "The challenge was spent, the step-up used or expired, or the passkey deleted or "
            "used again meanwhile."), step_up=step_up)
    if isinstance(started, sessions.Refused):
        raise started.error
    assert started is not None
    session, refresh_token, user = started
    return SignIn(project_id, session, user, refresh_token)


async def _refused(conn: asyncpg.Connection, actor: Actor, attempt: dict[str, Any],
                   digest: bytes | None, project_id: str | None, user_id: str | None,
                   failure: ServiceError, *, step_up: risk.Challenge | None = None) -> NoReturn:
    """Refuse a passkey login with ``failure``: spend the challenge of ``digest`` (and the
    ``step_up`` challenge this login was for) and, when the project is the caller's
    (``project_id``), record ``auth.signin_attempt`` with outcome ``failure``, in one
    transaction; then raise ``failure``."""
    async with conn.transaction():
        if digest is not None:
            await conn.execute(repository.SPEND_CHALLENGE, digest)
        if step_up is not None:
            await risk.fail_challenge(conn, step_up.id)
        if project_id is not None:
            await audit.record(
                conn, actor.as_user(user_id, project_id=project_id), action="auth.signin_attempt",
                project_id=project_id, target_type="user", target_id=user_id, user_id=user_id,
                description=f"Passkey sign-in refused: {failure.code}",
                metadata={**attempt, "outcome": "failure", "reason": failure.code,
                          "detail": failure.message})
    raise failure


# --- a user's passkeys --------------------------------------------------------------------------


async def list_passkeys(conn: asyncpg.Connection | asyncpg.Pool, actor: Actor, *,
                        user_id: str) -> list[Passkey]:
    """The passkeys of the actor's project's user ``user_id``, oldest first. Raises
    UserNotFound when the project has no such user."""
    project_id = actor.project_id
    assert project_id is not None
    if not await repository.user_exists(conn, project_id, user_id):
        raise UserNotFound()
    return await repository.list_passkeys(conn, project_id, user_id)


async def remove_passkey(conn: asyncpg.Connection, actor: Actor, *, user_id: str,
                         passkey_id: str) -> Passkey:
    """Delete the passkey ``passkey_id`` of the user ``user_id`` with ``passkey.deleted``, in
    one transaction; it signs no one in from then on. Raises NotFound (no such passkey of that
    user), UserNotFound (no such user in the actor's project)."""
    project_id = actor.project_id
    assert project_id is not None
    async with conn.transaction():
        passkey = await repository.delete_passkey(conn, project_id, user_id, passkey_id)
        if passkey is None:
            if not await repository.user_exists(conn, project_id, user_id):
                raise UserNotFound()
            raise NotFound("This user has no passkey with that id.")
        await audit.record(
            conn, actor, action="passkey.deleted", target_type="passkey", target_id=passkey_id,
            user_id=user_id, description=f"Deleted passkey {passkey.name!r}",
            metadata={"passkey_id": passkey_id, "name": passkey.name})
    return passkey
