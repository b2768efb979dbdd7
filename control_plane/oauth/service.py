"""OAuth rules: a project's providers, and sign-in by the authorization code flow (RFC 6749
4.1) with PKCE S256 (RFC 7636) and, for OpenID Connect providers, a ``nonce`` (OIDC Core
3.1.2.1).

* :func:`configure_provider`, :func:`describe_provider`, :func:`remove_provider`: a project's
  configuration of one provider (the client secret sealed by the KMS, bound to the project and
  name; never answered), each change with its audit event in its transaction.
* :func:`start_authorization`: checks the application's ``redirect_uri`` against the provider's
  allow-list, stores a single-use ``state`` (its SHA-256), the PKCE ``code_verifier`` and the
  ``nonce``, bound to the browser by the SHA-256 of a random value the browser keeps in an
  HttpOnly cookie, and answers the provider's authorization URL.
* :func:`complete_sign_in`: the callback. The state is used up first, whatever follows; then the
  code is exchanged and the user read from the provider (``providers/``); then the identity
  ``(provider, subject)`` finds the user, or a verified e-mail links an existing user, or a new
  user is created; then the session starts exactly as a magic-link sign-in does
  (``sessions.start_session``, method ``oauth``, ``auth.signin_attempt`` naming the provider,
  automatic organization selection). Every refusal once the state's project is known is
  recorded as a failed ``auth.signin_attempt``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final
from urllib.parse import urlsplit

import asyncpg
from authlib.common.security import generate_token

from common.errors import (
    BlockedByRiskPolicy,
    IdentityConflict,
    InvalidEmail,
    InvalidRequest,
    MissingEmail,
    ServiceError,
    ServiceUnavailable,
    StepUpRequired,
    UnknownProvider,
    VerificationFailed,
)
from common.ids import new_id
from common.schemas import CONTROL_RE
from common.settings import Settings, is_internal_host
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.oauth import repository
from control_plane.oauth.protocol import (
    TENANT_TEMPLATE,
    OAuthClient,
    ProviderClaims,
    ProviderConfig,
    ProviderError,
    authorization_url,
)
from control_plane.oauth.providers.registry import provider_of
from control_plane.oauth.schemas import (
    PROVIDER_NAME,
    CallbackQuery,
    DeletedProvider,
    Provider,
    ProviderBody,
)
from control_plane.risk import service as risk
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import SignIn
from control_plane.web.actor import Actor
from control_plane.web.schemas import normalize_email

BROWSER_COOKIE: Final = "oauth_browser"
"""The HttpOnly cookie that binds a started authorization to the browser that started it."""
BROWSER_COOKIE_PATH: Final = "/v1/auth/oauth/"
_BINDING_RE: Final = re.compile(r"[A-Za-z0-9_-]{43}")
_MAX_NAME: Final = 200

log = logging.getLogger("authio.oauth")


def callback_url(settings: Settings, name: str) -> str:
    """The redirect URI the provider sends the browser back to, which the project registers at
    the provider: ``{public base URL}/v1/auth/oauth/{name}/callback``."""
    return f"{settings.public_base_url}/v1/auth/oauth/{name}/callback"


def provider_name(value: str, *, configuring: bool = False) -> str:
    """``value`` as a provider name (``schemas.PROVIDER_NAME``). Raises UnknownProvider when no
    provider can have it (as a malformed id is not found), or InvalidRequest naming ``provider``
    when ``configuring`` one."""
    if PROVIDER_NAME.fullmatch(value) is None:
        if configuring:
            raise InvalidRequest.field("provider", "must be a lowercase letter, then up to 39 "
                                                   "lowercase letters, digits, _ or -")
        raise UnknownProvider(details={"provider": value})
    return value


def _aad(project_id: str, name: str) -> bytes:
    return f"oauth_client_secret:{project_id}:{name}".encode()


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def _provider(row: asyncpg.Record, settings: Settings) -> Provider:
    return Provider(provider=row["name"], kind=row["kind"], client_id=row["client_id"],
                    redirect_uris=list(row["redirect_uris"]), scopes=list(row["scopes"]),
                    issuer=row["issuer"], callback_url=callback_url(settings, row["name"]),
                    created_at=row["created_at"], updated_at=row["updated_at"])


# --- configuration -----------------------------------------------------------------------------


async def configure_provider(conn: asyncpg.Connection, actor: Actor, *, name: str,
                             body: ProviderBody, kms: LocalKms,
                             settings: Settings) -> tuple[Provider, bool]:
    """Store the configuration of provider ``name`` in the actor's project (replacing any), with
    ``oauth.provider.configured``; (the provider, whether it was new). Raises InvalidRequest
    naming ``issuer`` when a generic provider lacks one or a fixed one that takes none has
    one."""
    project_id = actor.project_id
    assert project_id is not None
    kind = provider_of(name)
    if kind.needs_issuer and body.issuer is None:
        raise InvalidRequest.field("issuer", "required for a generic OpenID Connect provider "
                                             "(any name but google, github, microsoft, apple)")
    if body.issuer is not None and not kind.takes_issuer:
        raise InvalidRequest.field("issuer", f"{name} takes no issuer")
    if (body.issuer is not None and not settings.base_url_is_local
            and is_internal_host(urlsplit(body.issuer).hostname)):
        # A provider on this machine is for development (the service itself on localhost); in
        # a deployment it would let a key holder make the service call its own ports.
        raise InvalidRequest.field("issuer", "must not name this machine or a link-local "
                                             "address (allowed only when the service runs on "
                                             "localhost)")
    scopes = list(dict.fromkeys(body.scopes or kind.default_scopes))
    if kind.oidc and "openid" not in scopes:
        scopes.insert(0, "openid")
    redirect_uris = list(dict.fromkeys(body.redirect_uris))
    async with conn.transaction():
        row, created = await repository.upsert_provider(
            conn, project_id=project_id, name=name, kind=kind.kind, client_id=body.client_id,
            client_secret_sealed=kms.seal(body.client_secret.encode(), _aad(project_id, name)),
            redirect_uris=redirect_uris, scopes=scopes, issuer=body.issuer)
        await audit.record(
            conn, actor, action="oauth.provider.configured", target_type="oauth_provider",
            target_id=name, description=f"Configured OAuth provider {name}",
            metadata={"provider": name, "kind": kind.kind, "client_id": body.client_id,
                      "redirect_uris": redirect_uris, "scopes": scopes, "issuer": body.issuer,
                      "created": created})
    return _provider(row, settings), created


async def describe_provider(conn: asyncpg.Connection | asyncpg.Pool, actor: Actor, *, name: str,
                            settings: Settings) -> Provider:
    """The configuration of ``name`` in the actor's project. Raises UnknownProvider."""
    assert actor.project_id is not None
    row = await repository.find_provider(conn, actor.project_id, name)
    if row is None:
        raise UnknownProvider(details={"provider": name})
    return _provider(row, settings)


async def remove_provider(conn: asyncpg.Connection, actor: Actor, *, name: str) -> DeletedProvider:
    """Delete the configuration of ``name`` (``oauth.provider.deleted``); identities already
    linked stay, and sign in again once it is configured again with the same issuer. Raises
    UnknownProvider."""
    assert actor.project_id is not None
    async with conn.transaction():
        if not await repository.delete_provider(conn, actor.project_id, name):
            raise UnknownProvider(details={"provider": name})
        await audit.record(conn, actor, action="oauth.provider.deleted",
                           target_type="oauth_provider", target_id=name,
                           description=f"Deleted OAuth provider {name}",
                           metadata={"provider": name})
    return DeletedProvider(name, True)


async def _config(conn: asyncpg.Connection | asyncpg.Pool, kms: LocalKms, project_id: str,
                  name: str) -> ProviderConfig:
    row = await repository.find_provider(conn, project_id, name)
    if row is None:
        raise UnknownProvider(details={"provider": name})
    secret = kms.open(row["client_secret_sealed"], _aad(project_id, name)).decode()
    return ProviderConfig(project_id=project_id, name=name, kind=row["kind"],
                          client_id=row["client_id"], client_secret=secret,
                          redirect_uris=tuple(row["redirect_uris"]), scopes=tuple(row["scopes"]),
                          issuer=row["issuer"])


# --- start -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """A started authorization: the provider's ``url`` to send the browser to, the value of the
    browser binding cookie to set (the one the browser sent, when it had one), and whether the
    provider comes back by a cross-site POST (the cookie must then be ``SameSite=None``)."""

    url: str
    browser_binding: str
    cross_site_post: bool


def usable_binding(value: str | None) -> str | None:
    """The browser binding cookie's value when well formed (43 base64url characters)."""
    return value if value is not None and _BINDING_RE.fullmatch(value) else None


async def start_authorization(pool: asyncpg.Pool, actor: Actor, *, name: str, redirect_uri: str,
                              browser_binding: str | None, client: OAuthClient, kms: LocalKms,
                              settings: Settings) -> Started:
    """Start a sign-in with provider ``name`` of the actor's project, returning to
    ``redirect_uri`` (RFC 6749 4.1.1; RFC 7636 4.1 to 4.3; OIDC Core 3.1.2.1). Raises
    UnknownProvider (404), InvalidRequest naming ``redirect_uri`` when it is not one of the
    provider's, ServiceUnavailable when the provider's discovery document cannot be read."""
    project_id = actor.project_id
    assert project_id is not None
    config = await _config(pool, kms, project_id, name)
    if redirect_uri not in config.redirect_uris:
        raise InvalidRequest.field("redirect_uri", "must be one of the provider's redirect_uris")
    provider = provider_of(name)
    try:
        endpoints = await provider.endpoints(client, settings, config)
    except ProviderError as exc:
        # What failed where stays in the log: an answer naming the URL and the failure would
        # let a key holder map the service's own network through a provider's issuer.
        log.warning("OAuth provider %s of %s: discovery failed (%s: %s)", name, project_id,
                    exc.reason, exc.message)
        raise ServiceUnavailable("The provider's configuration could not be read; try again "
                                 "later.", details={"provider": name}) from None
    state, code_verifier = secrets.token_urlsafe(32), generate_token(64)
    nonce = secrets.token_urlsafe(32)
    binding = usable_binding(browser_binding) or secrets.token_urlsafe(32)
    await repository.insert_state(
        pool, state_hash=_digest(state), project_id=project_id, provider=name,
        redirect_uri=redirect_uri, code_verifier=code_verifier, nonce=nonce,
        browser_hash=_digest(binding), ttl=timedelta(seconds=settings.oauth_state_ttl_seconds))
    url = authorization_url(endpoints, config, callback_url=callback_url(settings, name),
                            state=state, code_verifier=code_verifier,
                            nonce=nonce if provider.oidc else None,
                            extra=dict(provider.authorization_params))
    return Started(url, binding, provider.form_post)


# --- callback ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OAuthSignIn(SignIn):
    """A completed OAuth sign-in and the application page to return to."""

    redirect_uri: str


async def complete_sign_in(pool: asyncpg.Pool, actor: Actor, *, name: str, query: CallbackQuery,
                           browser_binding: str | None, device: dict[str, Any],
                           client: OAuthClient, kms: LocalKms, settings: Settings,
                           iat: int, risk_engine: risk.RiskEngine) -> OAuthSignIn:
    """The callback of provider ``name`` (RFC 6749 4.1.2, 4.1.3; OIDC Core 3.1.3.7): sign the
    user in. ``actor`` is the anonymous caller, ``device`` what it says of itself.

    Raises InvalidRequest (400) for a missing, unknown, used or expired ``state``, one started
    in another browser or for another provider, or a missing ``code``; UnknownProvider (404)
    when the state's project no longer has the provider; VerificationFailed (400) for a provider
    ``error``, a code the provider will not exchange, an ID token that fails validation, or a
    provider out of reach; MissingEmail (400); IdentityConflict (409) for an unverified e-mail
    of an existing user; StepUpRequired (401) or BlockedByRiskPolicy (403) when the risk engine
    refuses the sign-in."""
    row = await repository.take_state(pool, _digest(query.state))
    if row is None:
        raise InvalidRequest.field("state", "unknown or already used")
    project_id = row["project_id"]
    actor = actor.as_user(None, project_id=project_id)
    attempt: dict[str, Any] = {"method": "oauth", "provider": name, "device": device,
                               "ip": actor.ip, "user_agent": actor.user_agent}
    try:
        binding = usable_binding(browser_binding)
        if row["expired"]:
            raise InvalidRequest.field("state", "expired")
        if binding is None or not hmac.compare_digest(_digest(binding), row["browser_hash"]):
            raise InvalidRequest.field("state", "was not started in this browser")
        if row["provider"] != name:
            raise InvalidRequest.field("state", "was started for another provider")
        config = await _config(pool, kms, project_id, name)
        attempt["provider_kind"] = config.kind
        if query.error is not None:
            raise VerificationFailed(
                "The provider refused the sign-in.",
                details={"provider_error": query.error,
                         "provider_error_description": query.error_description})
        if not query.code:
            raise InvalidRequest.field("code", "required")
        claims = _usable(await _claims_of(config, query.code, query.iss, row, client, settings),
                         name)
        return await _sign_in(pool, actor, config, claims, attempt, row["redirect_uri"],
                              settings, iat, risk_engine)
    except (StepUpRequired, BlockedByRiskPolicy):
        raise  # recorded with its decision already
    except ServiceError as err:
        await _refused(pool, actor, attempt, err)
        raise


async def _claims_of(config: ProviderConfig, code: str, iss: str | None, state: asyncpg.Record,
                     client: OAuthClient, settings: Settings) -> ProviderClaims:
    """The user as the provider describes them, once the code is exchanged. An ``iss`` in the
    authorization response must be the provider's issuer (RFC 9207 2.4: a mix-up of
    providers). Raises VerificationFailed."""
    provider = provider_of(config.name)
    try:
        endpoints = await provider.endpoints(client, settings, config)
        issuer = endpoints.issuer
        if (iss is not None and issuer is not None and TENANT_TEMPLATE not in issuer
                and iss.rstrip("/") != issuer):
            raise ProviderError("issuer", "the authorization response names another issuer")
        tokens = await client.exchange_code(endpoints, config, code=code,
                                            code_verifier=state["code_verifier"],
                                            callback_url=callback_url(settings, config.name))
        return await provider.claims(client, endpoints, config, tokens, state["nonce"])
    except ProviderError as exc:
        raise VerificationFailed(exc.message, details={"reason": exc.reason}) from None


MAX_SUBJECT: Final = 255
"""The longest ``sub`` taken (OpenID Connect Core 2: at most 255 ASCII characters)."""


def _usable(claims: ProviderClaims, name: str) -> ProviderClaims:
    """``claims`` with the e-mail normalized as every address of the service is
    (``normalize_email``). Raises MissingEmail when there is none or it is no address (reason
    ``email_unusable``), VerificationFailed when the subject is empty, over 255 characters or
    holds control characters: what a provider says is input like any other."""
    subject = claims.subject
    if not subject or len(subject) > MAX_SUBJECT or CONTROL_RE.search(subject):
        raise VerificationFailed("The provider's subject identifier is not usable.",
                                 details={"provider": name, "reason": "subject"})
    if claims.email is None:
        raise MissingEmail(details={"provider": name})
    try:
        address = normalize_email(claims.email)
    except InvalidEmail:
        raise MissingEmail("The provider's e-mail is not a usable address.",
                           details={"provider": name, "reason": "email_unusable"}) from None
    return dataclasses.replace(claims, email=address)


async def _sign_in(pool: asyncpg.Pool, actor: Actor, config: ProviderConfig,
                   claims: ProviderClaims, attempt: dict[str, Any], redirect_uri: str,
                   settings: Settings, iat: int, risk_engine: risk.RiskEngine) -> OAuthSignIn:
    """Find, link or create the user and start the session (scored by the risk engine), in one
    transaction. A refusal by the risk engine commits the user, the identity and its decision,
    then raises StepUpRequired or BlockedByRiskPolicy."""
    project_id, name = config.project_id, config.name
    assert claims.email is not None
    async with pool.acquire() as conn, conn.transaction():
        namespace = (config.issuer or "").rstrip("/")  # a subject is unique at its issuer
        user_id = await repository.identity_user(conn, project_id, name, namespace,
                                                 claims.subject)
        outcome = "returning"
        if user_id is None:
            user_id, outcome = await _user_for(conn, actor, config, claims)
            user_id = await repository.link_identity(
                conn, project_id=project_id, provider=name, issuer=namespace,
                subject=claims.subject,
                user_id=user_id, email=claims.email)
            await audit.record(
                conn, actor.as_user(user_id), action="oauth.identity.linked",
                target_type="user", target_id=user_id, user_id=user_id,
                description=f"Linked a {name} identity",
                metadata={"provider": name, "subject": claims.subject, "email": claims.email,
                          "email_verified": claims.email_verified, "outcome": outcome})
        user = await repository.user_email(conn, user_id)
        assert user is not None  # linked or found in this transaction
        same = (user["email"] or "").lower() == claims.email.lower()
        user_actor = actor.as_user(user_id, project_id=project_id)
        session_id = new_id("sess")
        event = audit.event_params(
            user_actor, action="auth.signin_attempt", project_id=project_id,
            target_type="session", target_id=session_id, user_id=user_id,
            description=f"Signed in with {name}",
            metadata={**attempt, "outcome": "success", "session_id": session_id,
                      "identity": outcome})
        started = await sessions.start_session(
            conn, settings, session_id=session_id, project_id=project_id, user_id=user_id,
            auth_method="oauth", actor=user_actor, iat=iat, event=event,
            risk_engine=risk_engine, hints=attempt["device"], new_user=outcome == "created",
            verified="email" if claims.email_verified and same else None)
        assert started is not None  # the default head raises instead
    if isinstance(started, sessions.Refused):
        raise started.error  # committed with its decision and events
    session, refresh_token, signed_in = started
    return OAuthSignIn(project_id, session, signed_in, refresh_token, redirect_uri)


async def _user_for(conn: asyncpg.Connection, actor: Actor, config: ProviderConfig,
                    claims: ProviderClaims) -> tuple[str, str]:
    """(user id, ``linked`` or ``created``) for a first sign-in with this identity: the user
    with the e-mail, else a new user, and only when the provider verified the address.

    An unverified address never reaches a user: not by a link (IdentityConflict, 409), and not
    by a new user either (MissingEmail, 400, reason ``email_not_verified``). A user created with
    an address its creator does not control would be the pre-hijacked account of whoever owns it:
    their later sign-in (a verified identity, a magic link) would land in it, and so would the
    creator's identity."""
    assert claims.email is not None
    project_id = config.project_id
    for _ in range(2):  # a user created by a concurrent sign-in is found the second time
        existing = await repository.user_by_email(conn, project_id, claims.email)
        if existing is not None:
            if not claims.email_verified:
                raise IdentityConflict(details={"provider": config.name})
            return str(existing["id"]), "linked"
        if not claims.email_verified:
            raise MissingEmail(
                "The provider gave no verified e-mail address; verify it there and sign in again.",
                details={"provider": config.name, "reason": "email_not_verified"})
        user_id = await repository.create_user(
            conn, project_id=project_id, email=claims.email, email_verified=True,
            name=CONTROL_RE.sub("", claims.name or "").strip()[:_MAX_NAME])
        if user_id is not None:
            await audit.record(
                conn, actor.as_user(user_id), action="user.created", target_type="user",
                target_id=user_id, user_id=user_id,
                description=f"Created user on first sign-in with {config.name}",
                metadata={"source": "oauth", "provider": config.name, "user_email": claims.email,
                          "email_verified": claims.email_verified})
            return user_id, "created"
    raise ServiceUnavailable("The user was changed concurrently; retry the sign-in.")


async def _refused(pool: asyncpg.Pool, actor: Actor, attempt: dict[str, Any],
                   failure: ServiceError) -> None:
    """``auth.signin_attempt`` with outcome ``failure`` for a refused callback."""
    async with pool.acquire() as conn, conn.transaction():
        await audit.record(
            conn, actor, action="auth.signin_attempt", target_type="oauth_provider",
            target_id=attempt["provider"],
            description=f"OAuth sign-in refused: {failure.code}",
            metadata={**attempt, "outcome": "failure", "reason": failure.code,
                      "details": failure.details})
