"""Dashboard operators' rules (issue 23; events ``dashboard_operator.bootstrapped``, ``.added``,
``.removed``).

A tenant's operators are the users of its operator project (``tenancy.operator_project``: a
project of the tenant made the first time it gets an operator, which no API key belongs to),
each with an ``operators`` row. They sign in there the way any user signs in (a magic link; the
sign-in is ``magic_links``' and ``sessions``'), to the operator console (``console``), which acts
on the tenant's other projects with an :class:`~control_plane.web.actor.Actor` of type
``operator`` and the operator's id: what an operator does is theirs in the audit log.

* :func:`add_operator`: the operator project (made if need be), the operator's user there (a
  verified e-mail address; the users service queues its enrollment message, whose link lands on
  the console), and the operator, with ``dashboard_operator.added``, in one transaction.
  OperatorExists when the address is an operator of the tenant already, whatever its case.
* :func:`bootstrap`: ``POST /v1/bootstrap`` with ``operator_email``: the tenant, project and key
  (``tenancy.bootstrap``, whose ``dashboard_operator.bootstrapped`` names the operator) and the
  tenant's first operator, in one transaction.
* :func:`remove_operator`: deletes the operator's user (``users.remove_user``: its sessions,
  console ones included, are revoked at once, at the edge too; the operator row goes with it),
  with ``dashboard_operator.removed``. OperatorNotFound for another tenant's, an unknown or a
  malformed id.
* The console's session: :func:`console_operator` (a session of the operator project whose user
  is still an operator), :func:`csrf_token` and :func:`check_csrf`, :func:`send_sign_in_links`.
* Passkeys of operators (the ``passkeys`` domain's rules, in the operator project): the
  operator project's relying party is the service's own public host and base URL
  (:func:`console_relying_party`), set by :func:`ensure_relying_party` when the operator
  project is made (:func:`add_operator`, :func:`bootstrap`) and again, lazily, before every
  console passkey ceremony, so an operator project made before passkeys were wired, or a
  changed ``SERVICE_BASE_URL``, is set right without a migration. No API key belongs to the
  operator project, so nothing else sets it. A console sign-in by passkey is usernameless:
  :func:`passkey_sign_in_options` issues options for no project yet, and
  :func:`passkey_sign_in` finds the operator project from the credential's user handle.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
from typing import Any, Final, cast
from urllib.parse import urlsplit

import asyncpg
from pydantic import ValidationError

from common.access_tokens import AccessClaims
from common.errors import (
    Forbidden,
    InvalidRequest,
    NoSession,
    NotFound,
    OperatorExists,
    OperatorNotFound,
    StepUpRequired,
    VerificationFailed,
)
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.magic_links import service as magic_links
from control_plane.magic_links.service import SendLimits
from control_plane.operators import repository
from control_plane.operators.schemas import Operator, SignInSent
from control_plane.passkeys import service as passkeys
from control_plane.passkeys.schemas import (
    AuthenticationResponseBody,
    RequestOptions,
    WebAuthnConfig,
)
from control_plane.risk.service import RiskEngine
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import SignIn
from control_plane.tenancy import service as tenancy
from control_plane.tenancy.schemas import BootstrapBody, Bootstrapped, OperatorRef, ProjectRef
from control_plane.users import service as users
from control_plane.users.schemas import CreateUser, UpdateUser
from control_plane.web.actor import Actor, system_actor
from control_plane.web.pagination import Listing, Page, PageQuery, page_by_id
from control_plane.web.ratelimit import client_bucket

LISTING: Final = "operators"
CONSOLE_LANDING: Final = "/console/verify"
"""Where a link of an operator project lands (the magic-link landing page sends it here): the
console's own page, which signs in and opens a console session."""
_CSRF_PURPOSE: Final = b"console_csrf"
RP_NAME: Final = "authio operator console"


def _operator(row: asyncpg.Record) -> Operator:
    return Operator(row["id"], row["tenant_id"], row["email"], row["name"], row["user_id"],
                    row["created_at"])


async def _add(conn: asyncpg.Connection, actor: Actor, *, tenant_id: str, operator_id: str,
               email: str, name: str, kms: LocalKms, settings: Settings) -> tuple[Operator, bool]:
    """The operator, in the caller's transaction (module docstring), and whether a message was
    queued (the caller wakes the outbox once committed). Raises OperatorExists."""
    project = await tenancy.operator_project(conn, tenant_id, create=True)
    assert project is not None, "an authenticated caller's tenant exists"
    project_id = project.id
    if console_relying_party(settings) is not None:  # else no passkeys, but operators still
        await ensure_relying_party(conn, project_id, settings)
    existing = await repository.by_email(conn, tenant_id, email)
    if existing is not None:
        raise OperatorExists(details={"operator_id": existing})
    # The user is the operator project's: the events about it are that project's, and its
    # enrollment message names that project (not the calling key's).
    in_console = dataclasses.replace(actor, project_id=project_id, api_key=None)
    queued = asyncio.Event()  # set by the users service before this transaction commits
    user = await users.create_user(
        conn, in_console, body=CreateUser.model_validate(
            {"email": email, "name": name, "email_verified": True}),
        kms=kms, settings=settings, outbox=queued, project_name=project.name)
    if not user.email_verified:  # a user of the project before it was an operator
        await users.update_user(conn, in_console, user_id=user.id,
                                body=UpdateUser.model_validate({"email_verified": True}))
    try:
        row = await repository.insert(conn, operator_id=operator_id, tenant_id=tenant_id,
                                      project_id=project_id, user_id=user.id, email=email,
                                      name=name)
    except asyncpg.UniqueViolationError as exc:  # the same address added meanwhile
        if exc.constraint_name != repository.EMAIL_CONSTRAINT:
            raise
        raise OperatorExists() from None
    return _operator(row), queued.is_set()


async def add_operator(conn: asyncpg.Connection, actor: Actor, *, tenant_id: str, email: str,
                       name: str, kms: LocalKms, settings: Settings,
                       outbox: asyncio.Event) -> Operator:
    """Add an operator to ``tenant_id`` (module docstring), ``dashboard_operator.added`` in the
    actor's project; ``outbox`` is set once the operator's enrollment message committed.
    Raises OperatorExists."""
    async with conn.transaction():
        operator, queued = await _add(conn, actor, tenant_id=tenant_id, operator_id=new_id("opr"),
                                      email=email, name=name, kms=kms, settings=settings)
        await audit.record(
            conn, actor, action="dashboard_operator.added", target_type="dashboard_operator",
            target_id=operator.id, description=f"Added dashboard operator {email}",
            metadata={"operator_email": email, "tenant_id": tenant_id,
                      "operator_user_id": operator.user_id})
    if queued:
        outbox.set()
    return operator


async def bootstrap(conn: asyncpg.Connection, actor: Actor, *, body: BootstrapBody,
                    kms: LocalKms, settings: Settings, outbox: asyncio.Event) -> Bootstrapped:
    """``tenancy.bootstrap`` and the tenant's first operator (``body.operator_email``) in one
    transaction; ``dashboard_operator.bootstrapped`` names the operator."""
    email = body.operator_email
    assert email is not None
    operator = OperatorRef(new_id("opr"), email)
    async with conn.transaction():
        booted = await tenancy.bootstrap(conn, actor, body=body, operator=operator)
        _, queued = await _add(conn, actor, tenant_id=booted.tenant.id, operator_id=operator.id,
                               email=email, name="", kms=kms, settings=settings)
    if queued:
        outbox.set()
    return booted


async def list_operators(pool: asyncpg.Pool, tenant_id: str, query: PageQuery, *,
                         secret: bytes) -> Page[Operator]:
    """A page of the tenant's operators in the order they were added. Raises InvalidRequest
    (cursor)."""
    # A cursor is bound to the operator project; a tenant without one lists nothing, its
    # listing bound to the tenant.
    project = await tenancy.operator_project(pool, tenant_id)
    listing = Listing(LISTING, project.id if project is not None else tenant_id, secret)
    return await page_by_id(pool, listing, query, table="operators",
                            columns=repository.COLUMNS, row=_operator)


async def remove_operator(conn: asyncpg.Connection, actor: Actor, *, tenant_id: str,
                          operator_id: str) -> Operator:
    """Remove the tenant's operator (module docstring). Raises OperatorNotFound."""
    if not is_id(operator_id, "opr"):
        raise OperatorNotFound()
    async with conn.transaction():
        row = await repository.find(conn, tenant_id, operator_id, lock=True)
        if row is None:
            raise OperatorNotFound()
        in_console = dataclasses.replace(actor, project_id=row["project_id"], api_key=None)
        await users.remove_user(conn, in_console, user_id=row["user_id"])
        await audit.record(
            conn, actor, action="dashboard_operator.removed", target_type="dashboard_operator",
            target_id=operator_id, description=f"Removed dashboard operator {row['email']}",
            metadata={"operator_email": row["email"], "tenant_id": tenant_id,
                      "operator_user_id": row["user_id"]})
    return _operator(row)


# --- the console's sign-in and session ----------------------------------------------------------


async def landing_path(pool: asyncpg.Pool, project_id: str) -> str | None:
    """Where the links of ``project_id`` land instead of the magic-link landing page: the
    console's, for an operator project; None for any other project."""
    if is_id(project_id, "proj") and await tenancy.is_operator_project(pool, project_id):
        return CONSOLE_LANDING
    return None


async def send_sign_in_links(pool: asyncpg.Pool, *, email: str, ip: str | None,
                             limits: SendLimits, kms: LocalKms, settings: Settings) -> SignInSent:
    """A sign-in link to ``email`` in each tenant whose operator it is (``magic_links.send_link``
    in the tenant's operator project, rate limited as any). The same answer for an address that
    is no operator's, which costs the client's address one send of its budget all the same.
    Raises RateLimited, ServiceUnavailable (the limits cannot be counted)."""
    found = await repository.everywhere(pool, email)
    if not found and ip:
        await limits.per_ip.hit(client_bucket(ip))
    for row in found:
        await magic_links.send_link(pool, project_id=row["project_id"],
                                    destination=("email", row["email"]), ip=ip, limits=limits,
                                    kms=kms, settings=settings)
    return SignInSent(True, settings.magic_link_ttl_seconds)


async def console_operator(conn: asyncpg.Connection, claims: AccessClaims) -> Operator:
    """The operator signed in by the verified access-token ``claims``: the session is active
    and its user, in an operator project, is an operator. Raises NoSession (``details.reason``
    ``not_an_operator`` for a user who is not, or no longer, one)."""
    await sessions.ensure_active(conn, claims)
    row = await repository.of_user(conn, claims.pid, claims.sub)
    if row is None:
        raise NoSession("This sign-in is not an operator's of any tenant (any more).",
                        details={"reason": "not_an_operator"})
    return _operator(row)


async def sign_out(conn: asyncpg.Connection, actor: Actor, *, claims: AccessClaims) -> None:
    """Revoke the console's session (``sessions.revoke_current``: ``session.revoked`` in the
    operator project). Raises NoSession."""
    await sessions.revoke_current(conn, actor, claims=claims)


def csrf_token(kms: LocalKms, session_id: str) -> str:
    """The console session's CSRF token: an HMAC of its session id under a key of the KMS, so
    nothing is stored and every page of one session carries the same token."""
    mac = kms.mac(_CSRF_PURPOSE, session_id.encode())
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def check_csrf(kms: LocalKms, session_id: str, presented: str | None) -> None:
    """Raises Forbidden (``details.reason`` ``csrf``) unless ``presented`` is the session's
    CSRF token (compared in constant time)."""
    expected = csrf_token(kms, session_id).encode()
    given = (presented or "").encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, expected):
        raise Forbidden("A console action must carry the page's CSRF token as X-CSRF-Token.",
                        details={"reason": "csrf"})


async def console_projects(pool: asyncpg.Pool, tenant_id: str) -> list[ProjectRef]:
    """The projects the console acts on: the tenant's, without its operator project."""
    return await tenancy.tenant_projects(pool, tenant_id)


def chosen_project(projects: list[ProjectRef], project_id: str | None) -> ProjectRef | None:
    """The project ``project_id`` among the tenant's ``projects`` (the first when None; None
    when the tenant has none). Raises NotFound for a project that is not the tenant's."""
    if project_id is None:
        return projects[0] if projects else None
    for project in projects:
        if project.id == project_id:
            return project
    raise NotFound("No project with that id in your tenant.")


# --- operators' passkeys ------------------------------------------------------------------------


def console_relying_party(settings: Settings) -> WebAuthnConfig | None:
    """The operator project's passkey relying party: ``rp_id`` the host of the service's public
    base URL (``SERVICE_BASE_URL``), its one origin that URL's scheme, host and port, user
    verification required (an operator's passkey is a second factor in itself). None when that
    URL can be no relying party's: an IP address, or plain HTTP on another host than
    ``localhost`` (browsers allow WebAuthn on secure contexts and domain names only)."""
    parts = urlsplit(settings.public_base_url)
    host = parts.hostname or ""
    origin = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    try:
        return WebAuthnConfig.model_validate({
            "rp_id": host, "rp_name": RP_NAME, "origins": [origin],
            "user_verification": "required"})
    except (ValidationError, ValueError):
        return None


def _no_relying_party(settings: Settings) -> InvalidRequest:
    return InvalidRequest.field(
        "webauthn", f"Passkeys cannot be used on {settings.public_base_url}: the service's base "
                    "URL (SERVICE_BASE_URL) must be https:// on a domain name, or "
                    "http://localhost.")


async def ensure_relying_party(conn: asyncpg.Connection, project_id: str,
                               settings: Settings) -> None:
    """Set the operator project ``project_id``'s relying party to :func:`console_relying_party`
    unless it is that already (one read then), with ``project.updated`` in the operator project
    by the ``system`` actor ``operator_console``, in one transaction. Raises InvalidRequest
    naming ``webauthn`` when the base URL can be no relying party's."""
    config = console_relying_party(settings)
    if config is None:
        raise _no_relying_party(settings)
    actor = dataclasses.replace(system_actor("operator_console"), project_id=project_id)
    async with conn.transaction():
        changed = await passkeys.configure(conn, actor, config=config)
        if changed is not None:
            await audit.record(
                conn, actor, action="project.updated", target_type="project",
                target_id=project_id,
                description="Set the operator console's passkey relying party",
                metadata={"changes": {"webauthn": changed}})


def passkey_actor(actor: Actor, claims: AccessClaims) -> Actor:
    """The operator's own user in the operator project, as the ``passkeys`` rules act for a
    signed-in user (its passkeys are the user's, and so are their events there)."""
    return actor.as_user(claims.sub, project_id=claims.pid)


async def passkey_sign_in_options(conn: asyncpg.Connection, *,
                                  settings: Settings) -> RequestOptions:
    """Request options for a console sign-in by passkey, before anyone says who they are
    (usernameless): any discoverable credential of the console's relying party
    (:func:`console_relying_party`, the one every operator project has), the challenge stored
    for no project yet (``passkeys.open_authentication_options``). The credential the operator
    picks says who signs in, and so in which tenant: :func:`passkey_sign_in`.

    Raises InvalidRequest naming ``webauthn`` when the base URL can be no relying party's."""
    config = console_relying_party(settings)
    if config is None:
        raise _no_relying_party(settings)
    options = await passkeys.open_authentication_options(
        conn, rp_id=config.rp_id, user_verification=config.user_verification, settings=settings)
    return cast(RequestOptions, options)


async def passkey_sign_in(conn: asyncpg.Connection, actor: Actor, *,
                          credential: AuthenticationResponseBody, device: dict[str, Any],
                          settings: Settings, iat: int, risk_engine: RiskEngine) -> SignIn:
    """Finish a console sign-in by passkey (:func:`passkey_sign_in_options`): the credential's
    user handle (the id of the user it was registered for) names the operator, and with it the
    operator project; there, the ``passkeys`` rules verify the assertion against the console's
    challenge and sign the user in as any passkey login (risk scoring, ``auth.signin_attempt``
    with method ``passkey``, in the operator project, whose relying party is set first,
    :func:`ensure_relying_party`). The caller opens the console session with the tokens
    (``POST /console/session``, which checks again that the user is an operator).

    A user handle that is no operator's user (none, an ordinary project's user, a removed
    operator) spends the challenge and is VerificationFailed, as an unknown credential is. A
    sign-in the risk engine challenges is StepUpRequired with ``details.project_id`` added: the
    operator project, where the step-up calls (``/v1/auth/step-up/...``) are made.

    Raises UnknownOrExpiredChallenge, VerificationFailed, InvalidRequest naming ``webauthn``,
    StepUpRequired, BlockedByRiskPolicy."""
    user_id = passkeys.user_handle(credential)
    row = await repository.by_user(conn, user_id) if user_id and is_id(user_id, "user") else None
    if row is None:
        await passkeys.discard_open_login(conn, credential)
        raise VerificationFailed("This passkey is no operator's: sign in with a link, then add "
                                 "a passkey on the console's Passkeys page.",
                                 details={"reason": "not_an_operator"})
    project_id = row["project_id"]
    await ensure_relying_party(conn, project_id, settings)
    try:
        return await passkeys.sign_in(
            conn, dataclasses.replace(actor, project_id=project_id), credential=credential,
            device=device, settings=settings, iat=iat, risk_engine=risk_engine,
            open_challenge=True)
    except StepUpRequired as err:
        raise StepUpRequired(err.message, details={**err.details, "project_id": project_id},
                             headers=err.headers) from None


async def operator_project_name(pool: asyncpg.Pool, tenant_id: str) -> str | None:
    """The name of the tenant's operator project (``<tenant> operators``): what a passkey's
    account shows after the operator's name, since every tenant's console passkeys share one
    relying party."""
    project = await tenancy.operator_project(pool, tenant_id)
    return project.name if project is not None else None
