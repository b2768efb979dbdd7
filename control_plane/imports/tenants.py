"""The multi-tenant importer's own passes (SPEC.md 4 rule 6): tenants become organizations one
to one, and each imported user's tenant roles become memberships.

* :func:`organizations`: every tenant of the export (empty ones too, EXPECTED.md A13) is an
  organization named as the tenant, with a slug made from the name and ``metadata.import``
  (the origin, the tenant id) and ``metadata.self_provisioning_domains`` (kept, rule 6). An
  organization that already carries the tenant's id in ``metadata.import`` counts ``existed``
  (a re-run); a slug another organization holds gets the tenant id's digest appended.
* :func:`memberships`: after the users, each eligible user's tenants (role already mapped by
  the parser: ``owner``, ``admin`` or ``member``) become memberships of those organizations; a
  user the deduplication skipped brings none (A11), project-level roles none (A10). A
  membership that exists counts ``existed``. Origin sessions are not imported: users sign in
  again.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from control_plane.imports.client import ServiceClient, message
from control_plane.imports.formats import Candidate, Deduper, Format, Tenant
from control_plane.imports.run import records

PROVIDER = "descope"


@dataclass(slots=True)
class Tally:
    """Organizations and memberships created and found."""

    organizations: Counter[str] = field(default_factory=Counter)
    memberships: Counter[str] = field(default_factory=Counter)
    roles: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        o, m = self.organizations, self.memberships
        roles = ", ".join(f"{r} {n}" for r, n in sorted(self.roles.items()))
        return [f"organizations: created {o['created']}, existed {o['existed']}",
                f"memberships: created {m['created']}" + (f" ({roles})" if roles else "")
                + f", existed {m['existed']}, errored {m['errored']}",
                *(f"error: {e}" for e in self.errors[:20])]


def slug_of(name: str, tenant_id: str) -> str:
    """A slug (``^[a-z0-9]+(-[a-z0-9]+)*$``, at most 63) from a tenant's name: accents dropped,
    anything else a hyphen; the tenant id's digest when nothing is left."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")[:50].strip("-")
    return slug or f"tenant-{_digest(tenant_id)}"


def _digest(tenant_id: str) -> str:
    return hashlib.sha256(tenant_id.encode()).hexdigest()[:8]


async def _existing(client: ServiceClient) -> tuple[dict[str, str], set[str]]:
    """Organizations already imported (tenant id -> organization id) and the slugs in use."""
    imported, slugs = {}, set()
    path = "/v1/organizations?limit=100"
    while True:
        _, page = await client.request("GET", path)
        for org in page["data"]:
            slugs.add(org["slug"])
            origin = (org.get("metadata") or {}).get("import") or {}
            if origin.get("provider") == PROVIDER and isinstance(origin.get("id"), str):
                imported[origin["id"]] = org["id"]
        if not page.get("next_cursor"):
            return imported, slugs
        path = f"/v1/organizations?limit=100&cursor={quote(page['next_cursor'])}"


async def organizations(client: ServiceClient | None, found: Iterable[Tenant],
                        tally: Tally) -> dict[str, str]:
    """Tenant id -> organization id, each tenant's organization made or found (module
    docstring); ``client`` None is a dry run (every tenant counts ``created``)."""
    if client is None:
        tally.organizations["created"] += len(list(found))
        return {}
    imported, slugs = await _existing(client)
    out: dict[str, str] = {}
    for tenant in found:
        if tenant.id in imported:
            out[tenant.id] = imported[tenant.id]
            tally.organizations["existed"] += 1
            continue
        slug = slug_of(tenant.name, tenant.id)
        if slug in slugs:
            slug = f"{slug[:54]}-{_digest(tenant.id)}"
        status, org = await client.request("POST", "/v1/organizations", {
            "name": tenant.name[:200], "slug": slug,
            "metadata": {"import": {"provider": PROVIDER, "id": tenant.id},
                         "self_provisioning_domains": list(tenant.self_provisioning_domains)}})
        if status != 201:
            tally.errors.append(f"tenant {tenant.id} ({tenant.name}): {message(org, status)}")
            continue
        slugs.add(slug)
        out[tenant.id] = org["id"]
        tally.organizations["created"] += 1
    return out


async def _user_id(client: ServiceClient, email: str) -> str | None:
    _, page = await client.request("GET", f"/v1/users?email={quote(email)}")
    return page["data"][0]["id"] if page.get("data") else None


async def memberships(client: ServiceClient | None, fmt: Format, file: Path,
                      orgs: dict[str, str], tally: Tally) -> None:
    """Every eligible user's memberships (module docstring); a dry run counts them."""
    dedupe = Deduper()
    for candidate in _readable(fmt, file):
        if dedupe.reason(candidate) is not None or not candidate.memberships:
            continue
        assert candidate.email is not None
        if client is None:
            for _, role in candidate.memberships:
                tally.memberships["created"] += 1
                tally.roles[role] += 1
            continue
        user_id = await _user_id(client, candidate.email)
        if user_id is None:  # the user errored: its error is in the users' tally
            continue
        for tenant_id, role in candidate.memberships:
            org = orgs.get(tenant_id)
            if org is None:
                tally.memberships["errored"] += 1
                tally.errors.append(f"{candidate.email}: tenant {tenant_id} is not in the "
                                    "export's tenants (or its organization failed)")
                continue
            status, body = await client.request(
                "POST", f"/v1/organizations/{org}/memberships", {"user_id": user_id, "role": role})
            if status == 201:
                tally.memberships["created"] += 1
                tally.roles[role] += 1
            elif status == 409 and _code(body) == "already_a_member":
                tally.memberships["existed"] += 1
            else:
                tally.memberships["errored"] += 1
                tally.errors.append(f"{candidate.email} in {tenant_id}: {message(body, status)}")


def _code(body: Any) -> str | None:
    try:
        return str(body["error"]["code"])
    except (KeyError, TypeError):
        return None


def _readable(fmt: Format, file: Path) -> Iterable[Candidate]:
    return (c for c in records(fmt, file) if isinstance(c, Candidate))
