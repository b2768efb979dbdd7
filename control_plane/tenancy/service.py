"""Tenancy rules: bootstrap, API keys (create, revoke, no escalation), project settings.

API keys (SPEC.md 2 and 5, DESIGN.md "API keys"): a key holds a prefix, a name and scopes; an
empty scope list means full access. No escalation: a key may only create or revoke keys whose
access is within its own, and a ``sk_test_`` key acts on ``sk_test_`` keys only. Secrets are
shown once and stored as SHA-256. A revocation is published on Redis so every process drops the
key at once (and each cache expires it within ``SERVICE_API_KEY_CACHE_SECONDS`` regardless).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from common.auth import ApiKeyAuthenticator, Principal, generate_secret, hash_secret
from common.errors import DomainInUse, InsufficientScope, NotFound
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.passkeys import service as passkeys
from control_plane.sessions import service as sessions
from control_plane.signing_keys import service as signing_keys
from control_plane.tenancy import repository
from control_plane.tenancy.schemas import (
    ApiKey,
    BootstrapBody,
    Bootstrapped,
    CreateApiKey,
    NewApiKey,
    OperatorRef,
    PatchProject,
    Project,
    ProjectRef,
    TenantRef,
)
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, PageQuery, page_by_id


def check_no_escalation(actor: Principal, scopes: list[str], prefix: str, *, verb: str) -> None:
    """Raises InsufficientScope when a key with ``scopes`` and ``prefix`` holds more access than
    ``actor``: DESIGN.md's rule that a key can never create a key with more access than itself,
    applied to revocation too (a narrow key must not lock out a broader one)."""
    if actor.prefix == "sk_test_" and prefix != "sk_test_":
        raise InsufficientScope(
            f"A sk_test_ key cannot {verb} a {prefix} key.", details={"prefix": prefix}
        )
    if not actor.scopes:
        return
    excess = sorted(set(scopes) - actor.scopes) if scopes else ["(full access)"]
    if excess:
        raise InsufficientScope(
            f"A key cannot {verb} a key with more access than itself.",
            details={"exceeding_scopes": excess},
        )


async def _new_key(conn: asyncpg.Connection, *, project_id: str, prefix: str, name: str,
                   scopes: list[str], created_by_key_id: str | None) -> NewApiKey:
    secret = generate_secret(prefix)
    key = await repository.insert_key(
        conn, project_id=project_id, name=name, prefix=prefix, secret_hash=hash_secret(secret),
        last_four=secret[-4:], scopes=scopes, created_by_key_id=created_by_key_id,
    )
    return NewApiKey(**{f: getattr(key, f) for f in ApiKey.__dataclass_fields__}, secret=secret)


async def bootstrap(conn: asyncpg.Connection, actor: Actor, *, body: BootstrapBody,
                    operator: OperatorRef | None = None) -> Bootstrapped:
    """Create the tenant, the project and a full-access ``sk_live_`` key with their audit
    events, in one transaction: ``dashboard_operator.bootstrapped`` (naming ``operator``, the
    tenant's first operator, which the caller makes in its own transaction around this one) and
    ``api_key.created``."""
    tenant_id, project_id = new_id("ten"), new_id("proj")
    extra = {"operator_id": operator.id, "operator_email": operator.email} if operator else {}
    async with conn.transaction():
        await repository.insert_tenant_and_project(
            conn, tenant_id=tenant_id, tenant_name=body.tenant_name, project_id=project_id,
            project_name=body.project_name, environment=body.environment)
        key = await _new_key(conn, project_id=project_id, prefix="sk_live_", name="bootstrap",
                             scopes=[], created_by_key_id=None)
        await audit.record(
            conn, actor, action="dashboard_operator.bootstrapped", project_id=project_id,
            target_type="project", target_id=project_id,
            description=f"Bootstrapped tenant {body.tenant_name!r}, project {body.project_name!r}"
                        + (f", operator {operator.email}" if operator else ""),
            metadata={"tenant_id": tenant_id, "environment": body.environment, **extra},
        )
        await audit.record(
            conn, actor, action="api_key.created", project_id=project_id,
            target_type="api_key", target_id=key.id, description="Created the bootstrap API key",
            metadata={"prefix": "sk_live_", "scopes": [], "name": "bootstrap"},
        )
    return Bootstrapped(TenantRef(tenant_id, body.tenant_name),
                        ProjectRef(project_id, body.project_name, body.environment), key,
                        operator)


async def operator_project(conn: asyncpg.Connection | asyncpg.Pool, tenant_id: str, *,
                           create: bool = False) -> ProjectRef | None:
    """The tenant's operator project, the project whose users are the tenant's dashboard
    operators (``operators``); made first when ``create``. None when it has none."""
    row = await repository.operator_project(conn, tenant_id, create=create)
    return ProjectRef(row["id"], row["name"], row["environment"]) if row is not None else None


async def is_operator_project(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> bool:
    """Whether ``project_id`` is a tenant's operator project (``operator_project``)."""
    return await repository.project_kind(conn, project_id) == "operators"


async def tenant_projects(conn: asyncpg.Connection | asyncpg.Pool,
                          tenant_id: str) -> list[ProjectRef]:
    """The tenant's projects, oldest first, without its operator project."""
    return [ProjectRef(r["id"], r["name"], r["environment"])
            for r in await repository.application_projects(conn, tenant_id)]


async def list_api_keys(pool: asyncpg.Pool, listing: Listing, query: PageQuery) -> Page[ApiKey]:
    """A page of the keys of ``listing.project_id`` in creation order (never their secrets).
    Raises InvalidRequest (cursor)."""
    return await page_by_id(pool, listing, query, table="api_keys",
                            columns=repository.KEY_COLUMNS, row=repository.api_key)


async def create_api_key(conn: asyncpg.Connection, actor: Actor, *,
                         body: CreateApiKey) -> NewApiKey:
    """Create a key in the actor's project, with its ``api_key.created`` event.
    Raises InsufficientScope (escalation)."""
    creator = actor.api_key
    assert creator is not None
    check_no_escalation(creator, body.scopes, body.prefix, verb="create")
    async with conn.transaction():
        return await issue_key(conn, actor, project_id=creator.project_id, prefix=body.prefix,
                               name=body.name, scopes=body.scopes,
                               created_by_key_id=creator.key_id)


async def issue_key(conn: asyncpg.Connection, actor: Actor, *, project_id: str, prefix: str,
                    name: str, scopes: list[str], created_by_key_id: str | None,
                    via: str | None = None) -> NewApiKey:
    """A new key of ``project_id`` with its ``api_key.created`` event (metadata ``via`` says
    how it came to be, e.g. ``device_authorization``), in the caller's transaction; the caller
    has judged that ``actor`` may grant it."""
    key = await _new_key(conn, project_id=project_id, prefix=prefix, name=name, scopes=scopes,
                         created_by_key_id=created_by_key_id)
    await audit.record(
        conn, actor, action="api_key.created", project_id=project_id, target_type="api_key",
        target_id=key.id, description=f"Created API key {name!r}",
        metadata={"prefix": prefix, "scopes": scopes, "name": name,
                  **({"via": via} if via else {})},
    )
    return key


async def revoke_api_key(
    conn: asyncpg.Connection, actor: Actor, *, key_id: str, authenticator: ApiKeyAuthenticator,
) -> ApiKey:
    """Revoke ``key_id``, committed with its revocation, which the announcer (``sessions``) tells
    every other process's cache; once committed, this process's cache drops it at once (and
    every cache expires it within its TTL, whatever happens to the announcement).

    Idempotent: revoking a revoked key returns it unchanged with no new event. Raises NotFound
    when the project has no such key, InsufficientScope when the actor lacks ``keys:write``
    (needed for any key but its own) or the key holds more access than the actor's. A dashboard
    operator (actor ``operator``, in a project of its tenant) revokes any key of the project.
    """
    revoker = actor.api_key
    project_id = actor.project_id
    assert project_id is not None and (revoker is not None or actor.type == "operator")
    if revoker is not None and key_id != revoker.key_id:
        revoker.require("keys:write")
    if not is_id(key_id, "key"):
        raise NotFound("No API key with that id in this project.")
    async with conn.transaction():
        found = await repository.lock_key(conn, project_id, key_id)
        if found is None:
            raise NotFound("No API key with that id in this project.")
        key, digest = found
        if revoker is not None:
            check_no_escalation(revoker, key.scopes, key.prefix, verb="revoke")
        if key.revoked_at is not None:
            return key
        key = await repository.mark_key_revoked(conn, key_id)
        await sessions.record_key_revocation(conn, project_id=project_id, digest=digest)
        await audit.record(
            conn, actor, action="api_key.revoked", target_type="api_key", target_id=key_id,
            description=f"Revoked API key {key.name!r}",
        )
    authenticator.invalidate(digest)
    return key


async def describe_project(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> Project:
    """The project, with its passkey relying party (``passkeys.relying_party``)."""
    row = await repository.get_project(conn, project_id)
    return Project(**row, webauthn=await passkeys.relying_party(conn, project_id))


async def update_project(
    conn: asyncpg.Connection, actor: Actor, *, kms: LocalKms, settings: Settings,
    body: PatchProject,
) -> dict[str, Any]:
    """Apply ``body`` to the actor's project in one transaction: replace its domain set, change
    ``signing_alg`` (rotating to a key of the new algorithm, ``signing_key.rotated``), replace
    its ``cors_origins``, and record
    ``project.updated`` with what changed (nothing changed: no event), set the passkey relying
    party (``webauthn``). Returns the changes (``domains: {added, removed}``,
    ``signing_alg: {from, to, kid}``, ``cors_origins: {added, removed}``, ``webauthn: {from,
    to}``).

    Raises DomainInUse (409) when another project has one of the domains.
    """
    project_id = actor.project_id
    assert project_id is not None
    changes: dict[str, Any] = {}
    async with conn.transaction():
        current = await repository.lock_project_alg(conn, project_id)
        if body.domains is not None:
            taken = await repository.domains_of_others(conn, project_id, body.domains)
            if taken:
                raise _in_use(taken)
            existing = await repository.domains_of(conn, project_id)
            added = sorted(set(body.domains) - existing)
            removed = sorted(existing - set(body.domains))
            try:
                await repository.replace_domains(conn, project_id, added=added, removed=removed)
            except asyncpg.UniqueViolationError:  # claimed by another project meanwhile
                raise _in_use(added) from None
            if added or removed:
                changes["domains"] = {"added": added, "removed": removed}
        if body.signing_alg is not None and body.signing_alg != current:
            key = await signing_keys.rotate_now(
                conn, actor, kms=kms, settings=settings, project_id=project_id,
                alg=body.signing_alg, reason="signing_alg_changed",
            )
            changes["signing_alg"] = {"from": current, "to": body.signing_alg, "kid": key.kid}
        if body.cors_origins is not None:
            before = await repository.cors_origins(conn, project_id) or []
            if before != body.cors_origins:
                await repository.set_cors_origins(conn, project_id, body.cors_origins)
                changes["cors_origins"] = {
                    "added": sorted(set(body.cors_origins) - set(before)),
                    "removed": sorted(set(before) - set(body.cors_origins))}
        if "webauthn" in body.model_fields_set:  # null: passkeys off
            changed = await passkeys.configure(conn, actor, config=body.webauthn)
            if changed is not None:
                changes["webauthn"] = changed
        if changes:
            await audit.record(
                conn, actor, action="project.updated", target_type="project",
                target_id=project_id,
                description=f"Updated the project's {' and '.join(sorted(changes))}",
                metadata={"changes": changes},
            )
    return changes


def _in_use(domains: list[str]) -> DomainInUse:
    return DomainInUse(f"Another project already uses {', '.join(domains)}.",
                       details={"domains": domains})


async def allowed_origins(conn: asyncpg.Connection | asyncpg.Pool,
                          project_id: str) -> frozenset[str]:
    """The origins whose pages may call ``project_id``'s public endpoints from a browser
    (DESIGN.md "the browser (CORS)"): its ``cors_origins`` and its relying party's ``origins``.
    Empty for an unknown project."""
    cors = await repository.cors_origins(conn, project_id)
    if cors is None:
        return frozenset()
    rp = await passkeys.relying_party(conn, project_id)
    return frozenset(cors) | frozenset(rp.origins if rp is not None else ())


async def project_of_host(conn: asyncpg.Connection | asyncpg.Pool, host: str) -> str | None:
    """The project that named ``host`` (lower case, no port) among its ``domains``, if any."""
    return await repository.project_of_domain(conn, host)
