"""Descope, the multi-tenant source (FORMATS.md 6): ``{"tenants": <GET /v1/mgmt/tenant/all
.tenants>, "users": <POST /v2/mgmt/user/search .users>, "total": N}``.

A user: ``userId``, ``email`` ("" when none), ``verifiedEmail``, ``status`` (enabled, disabled,
invited), ``name`` or ``givenName`` + ``familyName``, ``userTenants`` [{tenantId, roleNames}],
``customAttributes``, ``OAuth`` {provider: bool}, ``TOTP``. Rules (SPEC.md 4 rules 4 and 6,
EXPECTED.md A8-A12): no email -> ``no_email``; ``disabled`` -> ``disabled``; ``verifiedEmail``
not true -> ``unverified``; a verified user of any other status but ``enabled`` (``invited``,
``expired``; a missing status counts as enabled) -> ``status`` (expected.json attributes an
invited *and* unverified user to ``unverified``, A8). Each tenant of a user is one membership
with the highest of its mapped roles; project-level ``roleNames`` give none (A10). Custom
attributes go to ``metadata["custom"]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from control_plane.imports.formats.base import (
    Candidate,
    Item,
    Reader,
    Tenant,
    display_name,
    email_of,
    flag,
    id_of,
    items,
    objects,
    skip_reason,
    text_of,
)
from control_plane.imports.formats.reading import Sample, load_document

PROVIDER: Final = "descope"
REFUSAL: Final = ('not a descope export: expected {"tenants": [...], "users": [...]} (the tenant/all '
                  "and user/search payloads)")

RANKS: Final = {"member": 0, "admin": 1, "owner": 2}
ROLES: Final = {"admin": "admin", "tenant_admin": "admin", "owner": "owner", "super_admin": "owner"}
_SEPARATORS = re.compile(r"[\s\-]+")


def role_of(origin_role: str) -> str:
    """SPEC.md 4 rule 6 with A9's normalisation (trim, lower case, spaces and hyphens to ``_``):
    admin and tenant_admin (so "Tenant Admin") -> admin; owner and super_admin -> owner; any
    other role -> member."""
    return ROLES.get(_SEPARATORS.sub("_", origin_role.strip().lower()), "member")


def highest(origin_roles: Any) -> str:
    """The highest mapped role of a tenant's role names; member when there is none (A9)."""
    roles = [role_of(r) for r in origin_roles or () if isinstance(r, str)]
    return max(roles, key=RANKS.__getitem__, default="member")


def memberships(user_tenants: Any) -> tuple[tuple[str, str], ...]:
    """(tenant id, role) per tenant in file order; a tenant listed twice keeps its highest role."""
    found: dict[str, str] = {}
    for entry in user_tenants or ():
        tenant_id = id_of(objects(entry, "a userTenants entry is not an object").get("tenantId"))
        if tenant_id is None:
            raise ValueError("a userTenants entry has no tenantId")
        role = highest(entry.get("roleNames"))
        found[tenant_id] = max(found.get(tenant_id, role), role, key=RANKS.__getitem__)
    return tuple(found.items())


def convert(index: int, raw: Any) -> Candidate:
    """One user of the user/search payload."""
    user = objects(raw)
    origin_id = id_of(user.get("userId"))
    email = email_of(user.get("email"))
    status = (text_of(user.get("status")) or "enabled").lower()
    verified = flag(user.get("verifiedEmail"))
    # An invited user whose email is unverified is "unverified"; "status" only when it is (A8).
    skip = skip_reason(email, verified=verified, disabled="disabled" if status == "disabled" else None,
                       status=verified and status != "enabled")
    custom = user.get("customAttributes") or {}
    if not isinstance(custom, dict):
        raise ValueError("customAttributes is not an object")
    oauth = user.get("OAuth") or {}
    providers = tuple(sorted(p for p, on in oauth.items() if on is True)) if isinstance(oauth, dict) else ()
    totp = flag(user.get("TOTP"))
    # Kept where the user's record carries them (SPEC.md 4 rule 6): the providers the user
    # signed in with and whether TOTP was enrolled (Descope exports no subject ids or secrets,
    # EXPECTED.md A12: the user links and enrols again).
    origin = {"provider": PROVIDER, "id": origin_id, "oauth_providers": list(providers),
              "totp_enrolled": totp}
    return Candidate(
        index=index, origin_id=origin_id, email=email,
        name=display_name(user.get("name"), user.get("givenName"), user.get("middleName"), user.get("familyName")),
        skip=skip, metadata={"import": origin, "custom": custom},
        memberships=memberships(user.get("userTenants")), oauth_providers=providers,
        totp_enrolled=totp)


def _document(path: Path) -> dict[str, Any]:
    document = load_document(path)
    if not isinstance(document, dict) or not isinstance(document.get("users", []), list) \
            or not isinstance(document.get("tenants", []), list):
        raise ValueError('not a descope export: expected {"tenants": [...], "users": [...]}')
    return document


def read(path: Path) -> Iterator[Item]:
    users = _document(path).get("users", [])
    return items(((i, f"element {i + 1} of users", u) for i, u in enumerate(users)), convert)


def tenants(path: Path) -> list[Tenant]:
    """The export's tenants in file order: one organization each, empty ones too (A13)."""
    found = []
    for number, raw in enumerate(_document(path).get("tenants", []), 1):
        tenant = objects(raw, f"tenant {number} is not an object")
        tenant_id = id_of(tenant.get("id"))
        if tenant_id is None:
            raise ValueError(f"tenant {number} has no id")
        domains = tenant.get("selfProvisioningDomains") or []
        if not isinstance(domains, list):
            raise ValueError(f"tenant {number}: selfProvisioningDomains is not a list")
        kept = tuple(d.strip() for d in domains if isinstance(d, str) and d.strip())
        found.append(Tenant(id=tenant_id, name=text_of(tenant.get("name")) or tenant_id,
                            self_provisioning_domains=kept))
    return found


EXPORT: Final = Reader(PROVIDER, "descope tenants and users JSON", read)


def sniff(sample: Sample) -> Reader | None:
    """The descope layout of a sampled file, or None."""
    if sample.kind != "object" or sample.key not in ("tenants", "users"):
        return None
    first = sample.first
    if first is None:
        return EXPORT
    if not isinstance(first, dict):
        return None
    marks = ("id", "selfProvisioningDomains") if sample.key == "tenants" else ("userId", "loginIds")
    return EXPORT if any(k in first for k in marks) else None
