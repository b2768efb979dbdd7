"""Admin portal rules (issue 23; SPEC.md 3, 5 rule 7 and 7; DESIGN.md "admin portal").

An application hands its customer's IT administrator, who has no account here, a one-time setup
link for one organization and one intent; the page it opens lets them set that organization up.

* :func:`create_link`: a link (``plk_``) of the key's project for an organization of it, whose
  token (``ptk_``, 32 random bytes) is answered once and kept only as its SHA-256; usable once,
  for ``ttl_seconds`` (5 minutes by default). ``portal.link.created``.
* :func:`open_link`: one statement consumes the token, if it is unconsumed and unexpired, and
  starts the portal session bound to the link: an opaque token (``pts_``) kept as its SHA-256,
  lasting ``SERVICE_PORTAL_SESSION_TTL_SECONDS`` (an hour). ``portal.link.opened``. A token
  that cannot be opened is told apart (SPEC.md 7): ``token_consumed`` once used,
  ``token_expired`` past its lifetime, ``token_invalid_or_expired`` when no link has it (see
  :func:`open_link` for why that one is not "unknown").
* :func:`find_session`: the live session of a token; the portal's calls answer
  ``token_invalid_or_expired`` for an unknown, ended or purged session alike (there is nothing
  more a caller holding it could do about the difference).
* Domains (intent ``domain_verification``): :func:`claim_domain` gives the TXT record that
  proves control (``_authio-verification.<domain>``, a random value kept with the domain);
  :func:`verify_domain` looks the record up (``resolver.TxtResolver``) and, found, verifies the
  domain: one organization of a project per verified domain. Each change is
  ``organization.updated`` naming the domain.
* SCIM (intent ``scim``): :func:`mint_scim_token` has the SCIM service mint the organization's
  token (``scim.service.mint_token``: it replaces the previous one at once, and records
  ``scim.token.created``), answered once. :func:`portal_state` shows the directory's sync: the
  SCIM service keeps no log of requests and offers no status of its own, so what is shown is
  what its public rules and the audit log hold: when the token was minted and the latest
  changes the directory made (the audit service's ``scim.*`` events naming the organization),
  and the users and groups of the organization's SCIM view (``scim.service.list_users`` and
  ``list_groups`` totals, read as the organization's current token would).

Every event of a portal call is the link's organization's, by the actor ``portal`` whose id is
the link's (``portal_actor``).
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import asyncpg

from common.auth import token_digest
from common.errors import (
    DomainInUse,
    Forbidden,
    NotFound,
    OrganizationNotFound,
    TokenConsumed,
    TokenExpired,
    TokenInvalidOrExpired,
)
from common.ids import new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.audit.schemas import AuditEvent, EventsQuery
from control_plane.kms import LocalKms
from control_plane.organizations import service as organizations
from control_plane.portal import repository
from control_plane.portal.resolver import TxtResolver
from control_plane.portal.schemas import (
    TXT_PREFIX,
    CreateLink,
    DomainVerification,
    Intent,
    OrganizationDomain,
    PortalLink,
    PortalOrganization,
    PortalScimToken,
    PortalState,
    ScimChange,
    ScimSetup,
    TxtRecord,
)
from control_plane.scim import service as scim
from control_plane.scim.schemas import ListQuery, MintBody, ScimCaller
from control_plane.tenancy import service as tenancy
from control_plane.web.actor import Actor

PAGE_PATH: Final = "/portal"
TOKEN_PREFIX: Final = "ptk_"
SESSION_PREFIX: Final = "pts_"
CHALLENGE_PREFIX: Final = "authio-domain-verification="
RECENT_CHANGES: Final = 10
SCIM_CHANGES: Final = "scim.user.synced,scim.group.synced"
SCIM_MINTED: Final = "scim.token.created"
SESSION_ENDED: Final = ("This admin portal session has ended, or was never started: open a new "
                        "setup link.")


@dataclass(frozen=True, slots=True)
class PortalSession:
    """A live portal session: its link, the link's project, organization and intent, and when
    it ends."""

    link_id: str
    project_id: str
    organization_id: str
    organization_name: str
    intent: Intent
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Opened:
    """A link just opened: its session, and the session's token (given to the browser once)."""

    session: PortalSession
    session_token: str


def _session(row: asyncpg.Record) -> PortalSession:
    return PortalSession(link_id=row["id"], project_id=row["project_id"],
                         organization_id=row["organization_id"],
                         organization_name=row["organization_name"], intent=row["intent"],
                         expires_at=row["session_expires_at"])


def portal_actor(actor: Actor, session: PortalSession) -> Actor:
    """``actor`` (a request's, with its address and user agent) as the portal session of
    ``session``: type ``portal``, id the link's, in the link's project."""
    return dataclasses.replace(actor, type="portal", id=session.link_id,
                               project_id=session.project_id, api_key=None)


# --- links -------------------------------------------------------------------------------------


async def create_link(conn: asyncpg.Connection, actor: Actor, *, body: CreateLink,
                      settings: Settings) -> PortalLink:
    """A setup link for ``body.organization_id`` (``portal.link.created``). Raises
    OrganizationNotFound (unknown, malformed or another project's)."""
    project_id = actor.project_id
    assert project_id is not None
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    async with conn.transaction():
        org = await organizations.find_organization(conn, project_id, body.organization_id)
        try:
            row = await repository.insert_link(
                conn, link_id=new_id("plk"), project_id=project_id, organization_id=org.id,
                intent=body.intent, token_hash=token_digest(token), ttl_seconds=body.ttl_seconds,
                created_by=actor.id)
        except asyncpg.ForeignKeyViolationError:
            raise OrganizationNotFound() from None  # deleted meanwhile
        await audit.record(
            conn, actor, action="portal.link.created", target_type="organization",
            target_id=org.id,
            description=f"Admin portal link for {body.intent} of organization {org.id} created",
            metadata={"portal_link_id": row["id"], "intent": body.intent,
                      "ttl_seconds": body.ttl_seconds})
    return PortalLink(id=row["id"], link=f"{settings.public_base_url}{PAGE_PATH}?token={token}",
                      organization_id=row["organization_id"], intent=row["intent"],
                      expires_at=row["expires_at"], created_at=row["created_at"])


async def open_link(conn: asyncpg.Connection, actor: Actor, *, token: str,
                    settings: Settings) -> Opened:
    """Consume the setup ``token`` and start its portal session (``portal.link.opened``, by
    the session's actor, with the opener's address and user agent).

    Raises TokenConsumed (opened before: the link is single use, whoever opened it), TokenExpired
    (never opened within its lifetime) or TokenInvalidOrExpired (no link has that token). The
    last is not called "unknown" because it cannot be told from an expired one: a link is
    deleted a day after it ended (housekeeping), and from then on its token is not found
    either; SPEC.md gives the portal's catch-all code for exactly this, and a holder of a
    mistyped or truncated link, like one of an old link, needs a new link either way."""
    digest = token_digest(token)
    session_token = SESSION_PREFIX + secrets.token_urlsafe(32)
    async with conn.transaction():
        row = await conn.fetchrow(repository.OPEN, digest, token_digest(session_token),
                                  settings.portal_session_ttl_seconds)
        if row is None:
            refused = await conn.fetchrow(repository.REFUSED, digest)
            if refused is None:
                raise TokenInvalidOrExpired(
                    "This setup link is not valid or has expired; ask for a new one.")
            if refused["consumed"]:
                raise TokenConsumed(
                    "This setup link was already used: a link opens the admin portal once. Ask "
                    "for a new link.")
            raise TokenExpired("This setup link has expired; ask for a new one.")
        session = _session(row)
        await audit.record(
            conn, portal_actor(actor, session), action="portal.link.opened",
            target_type="organization", target_id=session.organization_id,
            description=f"Admin portal opened for {session.intent} of organization "
                        f"{session.organization_id}",
            metadata={"portal_link_id": session.link_id, "intent": session.intent,
                      "session_expires_at": session.expires_at.isoformat()})
    return Opened(session, session_token)


async def find_session(conn: asyncpg.Connection | asyncpg.Pool, *,
                       session_token: str | None) -> PortalSession:
    """The live session of ``session_token``. Raises TokenInvalidOrExpired (none given, unknown,
    ended, or its link or organization deleted)."""
    row = await conn.fetchrow(repository.SESSION, token_digest(session_token)) \
        if session_token else None
    if row is None:
        raise TokenInvalidOrExpired(SESSION_ENDED)
    return _session(row)


def require_intent(session: PortalSession, intent: Intent) -> None:
    """Raises Forbidden unless the session's link is for ``intent``."""
    if session.intent != intent:
        raise Forbidden(f"This admin portal link is for {session.intent}, not {intent}.",
                        details={"reason": "intent", "intent": session.intent})


# --- the portal's state ------------------------------------------------------------------------


async def portal_state(pool: asyncpg.Pool, session: PortalSession, *, cursor_secret: bytes,
                       settings: Settings) -> PortalState:
    """What the page shows: the organization, the intent and its state (``cursor_secret``: the
    deployment's, which the audit log's listings sign their cursors with)."""
    domains = scim_setup = None
    if session.intent == "domain_verification":
        domains = [_domain(row) for row in await repository.domains_of(pool, session.organization_id)]
    else:
        scim_setup = await _scim_setup(pool, session, cursor_secret=cursor_secret,
                                       settings=settings)
    return PortalState(
        organization=PortalOrganization(session.organization_id, session.organization_name),
        intent=session.intent, session_expires_at=session.expires_at, domains=domains,
        scim=scim_setup)


# --- SCIM --------------------------------------------------------------------------------------


async def mint_scim_token(conn: asyncpg.Connection, actor: Actor, session: PortalSession, *,
                          kms: LocalKms, settings: Settings) -> PortalScimToken:
    """The organization's new SCIM token, replacing its previous one at once (the SCIM service's
    ``mint_token``, which records ``scim.token.created`` by the portal's actor; the store its
    groups write to is kept). Raises Forbidden (a link of another intent), OrganizationNotFound
    (deleted meanwhile)."""
    require_intent(session, "scim")
    minted = await scim.mint_token(conn, actor, org_id=session.organization_id, body=MintBody(),
                                   kms=kms, settings=settings)
    return PortalScimToken(token=minted.token, base_url=minted.base_url)


def _at(event: AuditEvent) -> datetime:
    return datetime.fromisoformat(event.created_at.replace("Z", "+00:00"))


async def _scim_events(pool: asyncpg.Pool, session: PortalSession, *, cursor_secret: bytes,
                       types: str, limit: int) -> list[AuditEvent]:
    """The organization's newest events of ``types`` (the SCIM events name their organization in
    ``metadata.organization_id``, and in the description the search reads)."""
    page = await audit.list_events(pool, audit.listing(session.project_id, cursor_secret),
                                   EventsQuery.model_validate({
                                       "type": types, "q": session.organization_id,
                                       "limit": str(limit)}))
    return [e for e in page.data if e.metadata.get("organization_id") == session.organization_id]


async def _scim_setup(pool: asyncpg.Pool, session: PortalSession, *, cursor_secret: bytes,
                      settings: Settings) -> ScimSetup:
    changes = await _scim_events(pool, session, cursor_secret=cursor_secret, types=SCIM_CHANGES,
                                 limit=RECENT_CHANGES)
    minted = await _scim_events(pool, session, cursor_secret=cursor_secret, types=SCIM_MINTED,
                                limit=1)
    users = groups = None
    if minted:
        project = await tenancy.describe_project(pool, session.project_id)
        meta: dict[str, Any] = minted[0].metadata
        caller = ScimCaller(str(meta.get("token_id", "")), session.organization_id,
                            session.project_id, project.name, meta.get("store_id"))
        totals = ListQuery.model_validate({"count": "0"})
        users = (await scim.list_users(pool, caller, query=totals, settings=settings)).body[
            "totalResults"]
        groups = (await scim.list_groups(pool, caller, query=totals, settings=settings)).body[
            "totalResults"]
    return ScimSetup(
        base_url=scim.base_url(settings),
        token_minted_at=_at(minted[0]) if minted else None, users=users, groups=groups,
        last_synced_at=_at(changes[0]) if changes else None,
        recent_changes=[ScimChange(at=_at(e), action=e.action, change=e.metadata.get("change"),
                                   resource_type=e.target_type, resource_id=e.target_id)
                        for e in changes])


# --- domains -----------------------------------------------------------------------------------


def record_name(domain: str) -> str:
    """Where the TXT record proving control of ``domain`` is published."""
    return f"{TXT_PREFIX}.{domain}"


def _domain(row: asyncpg.Record) -> OrganizationDomain:
    return OrganizationDomain(
        domain=row["domain"], status="verified" if row["verified_at"] else "pending",
        txt_record=TxtRecord("TXT", record_name(row["domain"]), row["challenge"]),
        verified_at=row["verified_at"], checked_at=row["checked_at"],
        created_at=row["created_at"])


def _in_use(domain: str) -> DomainInUse:
    return DomainInUse(f"Another organization has already verified {domain}.",
                       details={"domain": domain})


async def claim_domain(conn: asyncpg.Connection, actor: Actor, session: PortalSession, *,
                       domain: str) -> tuple[OrganizationDomain, bool]:
    """The organization's claim of ``domain`` with the TXT record to publish, made unless it
    existed (then answered as it is), and whether it was made now (``organization.updated``).
    Raises Forbidden (a link of another intent), DomainInUse (verified by another organization
    of the project)."""
    require_intent(session, "domain_verification")
    async with conn.transaction():
        if await repository.verified_elsewhere(conn, project_id=session.project_id,
                                               organization_id=session.organization_id,
                                               domain=domain):
            raise _in_use(domain)
        row, created = await repository.claim_domain(
            conn, organization_id=session.organization_id, project_id=session.project_id,
            domain=domain, challenge=CHALLENGE_PREFIX + secrets.token_urlsafe(24))
        if created:
            await audit.record(
                conn, actor, action="organization.updated", target_type="organization",
                target_id=session.organization_id,
                description=f"Domain {domain} added to organization {session.organization_id} "
                            "through the admin portal, pending verification",
                metadata={"changed": ["domains"], "domain": domain, "domain_status": "pending"})
    return _domain(row), created


async def verify_domain(pool: asyncpg.Pool, actor: Actor, session: PortalSession, *,
                        domain: str, resolver: TxtResolver) -> DomainVerification:
    """Look up the TXT record of the organization's claim of ``domain`` and, when one has the
    claim's value, verify the domain (``organization.updated`` with ``domain_verified``). A
    verified domain stays verified (its record may then go). The DNS lookup holds no
    connection. Raises Forbidden (a link of another intent), NotFound (not claimed by the
    organization), DomainInUse (another organization of the project verified it first)."""
    require_intent(session, "domain_verification")
    row = await repository.find_domain(pool, session.organization_id, domain)
    if row is None:
        raise NotFound(f"{domain} is not a domain of this organization yet: add it first.",
                       details={"domain": domain})
    if row["verified_at"] is not None:
        return DomainVerification(True, "verified", f"{domain} is verified.", [], _domain(row))
    name, value = record_name(domain), row["challenge"]
    lookup = await resolver.txt(name)
    verified = value in lookup.records
    async with pool.acquire() as conn, conn.transaction():
        try:
            row = await repository.mark_checked(conn, session.organization_id, domain,
                                                verified=verified)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == repository.VERIFIED_CONSTRAINT:
                raise _in_use(domain) from None
            raise
        if row is None:  # the claim went with its organization meanwhile
            raise NotFound(f"{domain} is not a domain of this organization.",
                           details={"domain": domain})
        if verified:
            await audit.record(
                conn, actor, action="organization.updated", target_type="organization",
                target_id=session.organization_id,
                description=f"Domain {domain} of organization {session.organization_id} verified "
                            "by its DNS TXT record through the admin portal",
                metadata={"changed": ["domains"], "domain": domain, "domain_verified": True,
                          "domain_status": "verified", "txt_record": name})
    found = list(lookup.records)
    if verified:
        return DomainVerification(True, "verified", f"{domain} is verified.", found, _domain(row))
    if lookup.outcome == "failed":
        return DomainVerification(
            False, "lookup_failed",
            f"The DNS lookup of {name} did not complete ({lookup.detail}); try again in a moment.",
            found, _domain(row))
    if lookup.outcome == "missing":
        return DomainVerification(
            False, "record_missing",
            f"No TXT record was found at {name}. Publish the record, then verify again: a new "
            "record can take a few minutes to be seen.", found, _domain(row))
    return DomainVerification(
        False, "record_mismatch",
        f"TXT records were found at {name}, but none has the value {value}.", found, _domain(row))
