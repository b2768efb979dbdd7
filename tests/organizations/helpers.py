"""Helpers of the organization tests (organizations, memberships, invitations), over HTTP."""

from __future__ import annotations

import secrets
from typing import Any

from tests.fixtures.service import Api, Response


def slug() -> str:
    return f"org-{secrets.token_hex(4)}"


async def create_org(api: Api, name: str = "Acme", org_slug: str | None = None,
                     **fields: Any) -> dict[str, Any]:
    r = await api.post("/v1/organizations", {"name": name, "slug": org_slug or slug(), **fields})
    assert r.status == 201, r.body
    return dict(r.body)


async def add(api: Api, org_id: str, user_id: str, **fields: Any) -> Response:
    """``POST /v1/organizations/{org_id}/memberships``."""
    return await api.post(f"/v1/organizations/{org_id}/memberships", {"user_id": user_id, **fields})


async def add_ok(api: Api, org_id: str, user_id: str, **fields: Any) -> dict[str, Any]:
    r = await add(api, org_id, user_id, **fields)
    assert r.status == 201, r.body
    return dict(r.body)


async def patch_membership(api: Api, org_id: str, membership_id: str, body: Any) -> Response:
    return await api.request("PATCH", f"/v1/organizations/{org_id}/memberships/{membership_id}",
                             json=body)
