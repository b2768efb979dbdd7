"""The device authorization grant behind ``authio login`` (RFC 8628; DESIGN.md "CLI login and
import").

* :func:`start`: a CLI asks for a code (section 3.1): it gets a ``device_code`` to poll with
  (stored as its SHA-256), a ``user_code`` for a person to type, the verification URI (the
  approval page ``GET /device`` of :attr:`Settings.public_base_url`), the lifetime
  (``SERVICE_DEVICE_CODE_TTL_SECONDS``) and the polling interval.
* :func:`decide`: an operator, proving who they are with a full-access key of a project (the
  approval page) or signed in to the operator console (a dashboard operator of the project's
  tenant), approves the code for that project with the scopes the CLI's key gets (those the CLI
  asked for, else an import's: :data:`IMPORT_SCOPES`), or denies it (``cli.device.approved`` /
  ``cli.device.denied``).
* :func:`redeem`: the CLI's poll (section 3.4/3.5). Pending: ``authorization_pending``, or
  ``slow_down`` (the interval grows by 5 s) when it polls sooner than its interval; denied:
  ``access_denied``; past its lifetime: ``expired_token``; approved: a new ``sk_live_`` key of
  the project is created in the poll's transaction (``api_key.created`` by the approving key,
  ``via: device_authorization``) and answered once; any later poll is ``invalid_grant``.

The multi-tenant importer's live mode (SPEC.md 4 rule 6): :func:`create_credential` seals an
origin's management token (KMS envelope encryption, bound to the row and project) for at most
24 hours, :func:`open_export` reads the origin through it (``live``), :func:`forget_credential`
forgets it when the CLI is done, and the imports worker deletes whatever is older.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Literal
from urllib.parse import urlencode

import asyncpg

from common.errors import InvalidRequest, NotFound, ServiceUnavailable
from common.ids import new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.imports import live, repository
from control_plane.imports.schemas import (
    GRANT_TYPE,
    IMPORT_SCOPES,
    USER_CODE_ALPHABET,
    Approval,
    ApproveBody,
    CredentialBody,
    DeviceCode,
    DeviceCodeBody,
    DeviceError,
    DeviceToken,
    DeviceTokenBody,
    ImportCredential,
)
from control_plane.kms import LocalKms
from control_plane.tenancy import service as tenancy
from control_plane.web.actor import Actor

PAGE_PATH = "/device"
SLOW_DOWN_SECONDS = 5
"""RFC 8628 section 3.5: each ``slow_down`` adds 5 seconds to the interval."""
KEY_NAME = "authio CLI"


class DeviceFlowError(Exception):
    """An RFC 8628 / RFC 6749 5.2 error of the token endpoint: ``error`` and what it means."""

    def __init__(self, error: DeviceError, description: str) -> None:
        super().__init__(description)
        self.error: DeviceError = error
        self.description = description


def _digest(device_code: str) -> bytes:
    return hashlib.sha256(device_code.encode()).digest()


def _user_code() -> str:
    """8 letters of :data:`USER_CODE_ALPHABET` (20^8, about 34 bits: RFC 8628 6.1 asks for
    enough entropy given the lifetime and that only an authenticated operator can try codes)."""
    return "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(8))


def shown(user_code: str) -> str:
    """``user_code`` as people read it: ``WDJB-MJHT``."""
    return f"{user_code[:4]}-{user_code[4:]}"


def normalized(user_code: str) -> str:
    """A typed code as stored: upper case, no hyphen (the body's pattern has checked it)."""
    return user_code.replace("-", "").upper()


async def start(pool: asyncpg.Pool, *, body: DeviceCodeBody, settings: Settings) -> DeviceCode:
    """A new pending device authorization (RFC 8628 3.1/3.2)."""
    requested = sorted(set(body.scope.split())) if body.scope else None
    device_code = secrets.token_urlsafe(32)
    ttl, interval = settings.device_code_ttl_seconds, settings.device_code_interval_seconds
    while True:  # a user code already in use is drawn again (1 in 25 billion per live code)
        user_code = _user_code()
        if await pool.fetchval(repository.INSERT, new_id("devauth"), _digest(device_code),
                               user_code, body.client_id, requested, interval, ttl):
            break
    page = f"{settings.public_base_url}{PAGE_PATH}"
    return DeviceCode(
        device_code=device_code, user_code=shown(user_code), verification_uri=page,
        verification_uri_complete=f"{page}?{urlencode({'user_code': shown(user_code)})}",
        expires_in=ttl, interval=interval)


async def redeem(conn: asyncpg.Connection, actor: Actor, *, body: DeviceTokenBody) -> DeviceToken:
    """The CLI's poll (module docstring). Raises DeviceFlowError."""
    if body.grant_type != GRANT_TYPE:
        raise DeviceFlowError("unsupported_grant_type", f"grant_type must be {GRANT_TYPE}")
    async with conn.transaction():
        row = await conn.fetchrow(repository.BY_DEVICE_CODE, _digest(body.device_code))
        if row is None or row["status"] == "redeemed":
            raise DeviceFlowError("invalid_grant", "unknown or already used device_code")
        if body.client_id is not None and body.client_id != row["client_id"]:
            raise DeviceFlowError("invalid_grant", "the device_code was issued to another client")
        if row["status"] == "denied":
            raise DeviceFlowError("access_denied", "the request was denied")
        if row["expired"]:
            raise DeviceFlowError("expired_token", "the device_code expired; start again")
        if row["status"] == "pending":  # the poll is recorded (committed), then refused
            interval, last = row["interval_seconds"], row["last_polled_at"]
            too_soon = last is not None and (row["now"] - last).total_seconds() < interval
            await conn.execute(repository.POLLED, row["id"],
                               interval + SLOW_DOWN_SECONDS if too_soon else interval)
            pending = DeviceFlowError(
                "slow_down", f"poll every {interval + SLOW_DOWN_SECONDS} seconds"
            ) if too_soon else DeviceFlowError("authorization_pending", "not approved yet")
        else:
            return await _issue(conn, actor, row)
    raise pending


async def _issue(conn: asyncpg.Connection, actor: Actor, row: asyncpg.Record) -> DeviceToken:
    """The approved request ``row``'s key, created and recorded as redeemed (by the approving
    key, or the approving dashboard operator)."""
    by_operator = row["approved_by_operator_id"]
    approver = Actor(type="operator" if by_operator else "api_key",
                     id=by_operator or row["approved_by_key_id"], project_id=row["project_id"],
                     ip=actor.ip, user_agent=actor.user_agent)
    scopes = list(row["scopes"])
    key = await tenancy.issue_key(
        conn, approver, project_id=row["project_id"], prefix="sk_live_", name=KEY_NAME,
        scopes=scopes, created_by_key_id=row["approved_by_key_id"], via="device_authorization")
    await conn.execute(repository.REDEEMED, row["id"], key.id)
    return DeviceToken(access_token=key.secret, token_type="Bearer", project_id=row["project_id"],
                       key_id=key.id, scope=" ".join(scopes))


async def decide(conn: asyncpg.Connection, actor: Actor, *, body: ApproveBody) -> Approval:
    """Approve or deny the pending code ``body.user_code`` for the actor's project (module
    docstring): the actor is a full-access key or a dashboard operator. Raises InvalidRequest
    naming ``user_code`` when no pending, unexpired request has it."""
    assert actor.project_id is not None
    assert actor.api_key is not None or actor.type == "operator"
    key_id = actor.api_key.key_id if actor.api_key is not None else None
    operator_id = actor.id if actor.api_key is None else None
    async with conn.transaction():
        row = await conn.fetchrow(repository.BY_USER_CODE, normalized(body.user_code))
        if row is None or row["expired"]:
            raise InvalidRequest.field("user_code", "matches no device waiting for approval "
                                                    "(mistyped, or expired: run login again)")
        if row["status"] != "pending":
            raise InvalidRequest.field("user_code", f"was already {row['status']}")
        scopes = body.scopes or row["requested_scopes"] or sorted(IMPORT_SCOPES)
        status: Literal["approved", "denied"] = (
            "approved" if body.decision == "approve" else "denied")
        await conn.execute(repository.DECIDED, row["id"], status, actor.project_id,
                           scopes if status == "approved" else None, key_id, operator_id)
        await audit.record(
            conn, actor, action=f"cli.device.{status}", target_type="device_authorization",
            target_id=row["id"],
            description=f"{status.capitalize()} a device for {row['client_id']!r}",
            metadata={"client_id": row["client_id"],
                      **({"scopes": scopes} if status == "approved" else {})})
    return Approval(user_code=shown(normalized(body.user_code)), status=status,
                    project_id=actor.project_id, scopes=scopes if status == "approved" else [],
                    client_id=row["client_id"], expires_in=row["expires_in"])


# --- live-mode credentials (SPEC.md 4 rule 6) -----------------------------------------------------

CREDENTIAL_LIFETIME = timedelta(hours=24)
"""A live-mode credential is deleted by then (the CLI deletes it sooner, when done)."""


def _aad(credential_id: str, project_id: str) -> bytes:
    return f"import_credential:{credential_id}:{project_id}".encode()


def _credential(row: asyncpg.Record) -> ImportCredential:
    return ImportCredential(row["id"], row["provider"], row["source_project_id"],
                            row["created_at"], row["expires_at"])


async def create_credential(conn: asyncpg.Connection, actor: Actor, *, body: CredentialBody,
                            kms: LocalKms) -> ImportCredential:
    """Seal and keep an origin's management token for 24 hours (``import.credential.created``,
    which names the origin project, never the token)."""
    assert actor.project_id is not None
    credential_id = new_id("impc")
    async with conn.transaction():
        row = await conn.fetchrow(
            repository.INSERT_CREDENTIAL, credential_id, actor.project_id, body.provider,
            body.source_project_id, kms.seal(body.token.encode(), _aad(credential_id,
                                                                       actor.project_id)),
            actor.api_key_id, CREDENTIAL_LIFETIME)
        await audit.record(
            conn, actor, action="import.credential.created", target_type="import_credential",
            target_id=credential_id,
            description=f"Stored a {body.provider} token for a live import (24 hours)",
            metadata={"provider": body.provider, "source_project_id": body.source_project_id})
    return _credential(row)


async def forget_credential(conn: asyncpg.Connection, actor: Actor, *,
                            credential_id: str) -> ImportCredential:
    """Delete the credential now (``import.credential.deleted``). Raises NotFound."""
    assert actor.project_id is not None
    async with conn.transaction():
        row = await conn.fetchrow(repository.DELETE_CREDENTIAL, credential_id, actor.project_id)
        if row is None:
            raise NotFound("No live-import credential with that id in this project.")
        await audit.record(
            conn, actor, action="import.credential.deleted", target_type="import_credential",
            target_id=credential_id, description="Deleted a live-import token",
            metadata={"provider": row["provider"]})
    return _credential(row)


async def open_export(pool: asyncpg.Pool, project_id: str, *, credential_id: str,
                      kms: LocalKms, settings: Settings) -> AsyncIterator[bytes]:
    """The origin project's export document in chunks (``live.export``). Raises, from the first
    chunk on (``web.streaming.stream_body`` reads it before the status line, so these are
    answered in the envelope): NotFound (no such live credential, or expired), InvalidRequest
    naming ``token`` (the origin refused it), ServiceUnavailable (the origin could not be
    read)."""
    row = await pool.fetchrow(repository.CREDENTIAL, credential_id, project_id)
    if row is None:
        raise NotFound("No live-import credential with that id in this project (they last "
                       "24 hours).")
    token = kms.open(row["token_sealed"], _aad(credential_id, project_id)).decode()
    try:
        async for chunk in live.export(settings.descope_api_url, row["source_project_id"], token):
            yield chunk
    except live.OriginError as err:
        if err.refused:
            raise InvalidRequest.field("token", f"{err}: store a valid management key") from None
        raise ServiceUnavailable(f"{err}; retry shortly.", details={"retry_after": 5},
                                 headers={"Retry-After": "5"}) from None
